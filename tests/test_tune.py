"Tuning (`dml_book.tune`): trials see validation classes only; search spaces start from the studies' settings; the SQLite storage is shared by two processes and survives kill -9."
import json, os, signal, subprocess, sys, textwrap, time
from dataclasses import replace
from pathlib import Path
import pandas as pd
import pytest
from dml_book.study_design import Study, StudyError, arm_differences
from dml_book.train import TrainConfig
from dml_book import tune as T
from dml_book import tuning_report as R

TINY = TrainConfig(dataset="digits", epochs=2, batch_size=12, m_per_class=4, val_fraction=0.4, max_steps_per_epoch=2,
                   eval_every=1, ks=(1, 2), num_workers=0)   # scikit-learn's digits: 3 training and 2 validation classes

def tiny_tuning(trials=3, epochs=2):
    arms = {"baseline": TINY, "other": replace(TINY, loss_kwargs={"margin": 0.3})}
    study = Study("tiny", arms, {"other": ("loss_kwargs.margin",)})
    spaces = {"baseline": (T.Knob("lr_head", 1e-4, 1e-2, log=True),),
              "other": (T.Knob("lr_head", 1e-4, 1e-2, log=True), T.Knob("loss_kwargs.margin", 0.1, 0.5))}
    return T.Tuning(study, spaces, trials=trials, epochs=epochs)

def test_trial_never_builds_or_scores_the_test_split(tmp_path, monkeypatch, one_thread):
    import dml_book.train as train
    built = []
    real = train.build_split
    monkeypatch.setattr(train, "build_split", lambda cfg, split, *a, **k: built.append(split) or real(cfg, split, *a, **k))
    final = T.run_trial(replace(TINY, out=str(tmp_path/"trial")))
    assert "test" not in built and "train" in built
    m = json.loads((tmp_path/"trial"/"metrics.json").read_text())
    assert set(final) == set(m["final"]) and all(k.startswith("val_") for k in m["final"]) and "val_R@1" in m["final"]
    scored = {k for r in m["epochs"] for k in r if "@" in k or k in ("NMI", "F1", "MAP@R")}
    assert scored and all(k.startswith("val_") for k in scored), scored   # no test metric in any epoch
    assert m["run"]["test"] is None and sorted(p.name for p in (tmp_path/"trial").iterdir()) == [".dml_book", "metrics.json", "run.json"]

@pytest.mark.parametrize("name", ["tiny", "pretrained/tiny"])   # a nested study's name, as the pretrained regime's
def test_a_trials_relative_weights_path_is_the_clones_whatever_the_current_folder(name, tmp_path, monkeypatch, one_thread):
    "A trial fine-tuning a clone's backbone (a relative weights_path, as the pretrained regime's) finds it beside the results store from any folder, and stores it and its folder relative to the store."
    import torch
    from dml_book.models import SmallCNN
    (tmp_path/"bb").mkdir(); torch.save(SmallCNN(1).state_dict(), tmp_path/"bb"/"smallcnn.pth")
    t = tiny_tuning(trials=1, epochs=1)
    t = replace(t, study=replace(t.study, name=name, arms={a: replace(c, weights_path="bb/smallcnn.pth") for a, c in t.study.arms.items()}))
    monkeypatch.chdir(tmp_path/"bb")   # the relative path does not exist from here
    trials = T.tune(t, tmp_path/"results", arms=("baseline",), log=lambda line: None)
    assert trials.state.tolist() == ["COMPLETE"] and trials.val_R1.iloc[0] > 0
    stored = json.loads((tmp_path/"results"/name/"tuning"/"baseline"/"trial0"/"metrics.json").read_text())["config"]
    assert (stored["weights_path"], stored["out"]) == ("bb/smallcnn.pth", f"{name}/tuning/baseline/trial0")


@pytest.mark.parametrize("name", sorted(T.SEARCH_SPACES))
def test_first_trial_is_the_study_setting(name):
    t = T.tuning_spec(name)
    assert set(t.spaces) == {t.study.baseline, *t.study.main}
    for arm, knobs in t.spaces.items():
        first = t.first(arm)
        for k in knobs:   # the study's setting lies in the declared range
            v = first[k.field]
            assert (v in k.choices) if k.choices else (k.low <= v <= k.high), (arm, k.field, v)
        assert set(arm_differences(t.config(arm, first), t.study.arms[arm])) == {"epochs"}
        T.check_trial(t, arm, t.config(arm, first))
    shared = {"lr_backbone", "lr_head", "weight_decay"}   # every arm's, and a margin: the loss's (DMML's own loss: its tau)
    assert all(shared <= {k.field for k in ks} and any(k.field.endswith(".margin") for k in ks) for ks in t.spaces.values())

def test_a_trial_differing_beyond_its_knobs_is_refused():
    t = tiny_tuning()
    with pytest.raises(StudyError, match="batch_size"): T.check_trial(t, "other", replace(TINY, batch_size=16))
    T.check_trial(t, "other", replace(TINY, lr_head=3e-3, epochs=9, loss_kwargs={"margin": 0.2}))

def test_set_fields_and_knob_values():
    cfg = T.set_fields(TINY, {"lr_head": 0.5, "loss_kwargs.margin": 0.7})
    assert cfg.lr_head == 0.5 and cfg.loss_kwargs == {"margin": 0.7} and TINY.loss_kwargs == {}
    with pytest.raises(StudyError, match="no configuration field 'lr'"): T.set_fields(TINY, {"lr": 1})
    k = T.Knob("episode", choices=("a", "b"), sets={"a": {"batch_size": 12}, "b": {"batch_size": 16}})
    assert T.knob_values(TINY, (k,)) == {"episode": "a"} and k.fields("b") == {"batch_size": 16}

SCRIPT = textwrap.dedent("""
    import sys; sys.path.insert(0, {tests!r})
    from test_tune import tiny_tuning
    from dml_book.tune import tune
    tune(tiny_tuning(trials={trials}, epochs={epochs}), {results!r}, heartbeat={heartbeat}, arms={arms!r})
""")

def _spawn(tmp_path, trials, epochs=2, heartbeat=60, arms=None):
    code = SCRIPT.format(tests=str(Path(__file__).parent), trials=trials, epochs=epochs, results=str(tmp_path), heartbeat=heartbeat, arms=arms)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

def _trials(tmp_path, arm):
    return pd.read_csv(tmp_path/"tiny"/"tuning"/arm/"trials.csv")

@pytest.mark.slow
def test_two_processes_share_one_sqlite_study(tmp_path):
    procs = [_spawn(tmp_path, trials=3) for _ in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert all("trial" in o for o in outs), outs   # both processes ran trials
    for arm in ("baseline", "other"):
        t = _trials(tmp_path, arm)
        done = t[t.state == "COMPLETE"]
        assert len(done) == 3 and done.number.is_unique, t
        assert json.loads(done[done["first"]].params.iloc[0]) == T.Tuning.first(tiny_tuning(), arm)   # the arm's own setting first
        folders = sorted(p.name for p in (tmp_path/"tiny"/"tuning"/arm).glob("trial[0-9]*"))
        assert folders == sorted(f"trial{n}" for n in done.number)   # one folder per trial, none repeated

@pytest.mark.slow
def test_killed_tuning_resumes_without_losing_or_repeating_a_trial(tmp_path):
    folder = tmp_path/"tiny"/"tuning"/"baseline"/"trial0"
    p = _spawn(tmp_path, trials=2, epochs=6, heartbeat=1, arms=("baseline",))
    deadline = time.time() + 600
    while not (folder/"checkpoint.pt").exists() and p.poll() is None and time.time() < deadline: time.sleep(0.05)
    assert p.poll() is None, p.communicate()[0]
    os.kill(p.pid, signal.SIGKILL); p.wait()
    epochs_done = json.loads((folder/"log.jsonl").read_text().splitlines()[-1]).get("epoch")
    time.sleep(4)   # past the grace period (three heartbeats)
    q = _spawn(tmp_path, trials=2, epochs=6, heartbeat=1, arms=("baseline",))
    out = q.communicate(timeout=900)[0]
    assert q.returncode == 0, out
    t = _trials(tmp_path, "baseline")
    done, failed = t[t.state == "COMPLETE"], t[t.state == "FAIL"]
    assert len(done) == 2 and list(failed.number) == [0], t                      # the killed trial failed once ...
    retry = done[done.retry_of == 0]
    assert len(retry) == 1 and retry.params.iloc[0] == failed.params.iloc[0]       # ... and ran again with its settings
    assert sorted(p.name for p in folder.parent.glob("trial[0-9]*")) == ["trial0", f"trial{int(done[done.retry_of != 0].number.iloc[0])}"]
    m = json.loads((folder/"metrics.json").read_text())
    assert [r["epoch"] for r in m["epochs"]] == list(range(7)) and epochs_done >= 1   # resumed: every epoch once, from the checkpoint

def barrier(folder: str, n: int):
    "Wait until `n` processes have reached this line (each leaves a file in `folder`): after their imports, they race at once."
    Path(folder).mkdir(exist_ok=True); (Path(folder)/str(os.getpid())).touch()
    while len(list(Path(folder).iterdir())) < n: time.sleep(0.001)

STALE = textwrap.dedent("""
    import sys; sys.path.insert(0, {tests!r})
    from test_tune import barrier
    import time, optuna
    from optuna.storages import RDBStorage
    from dml_book import tune as T
    check = RDBStorage.check_trial_is_updatable
    def paused(self, trial_id, state):   # a process paused between reading a trial's state and writing FAIL (a busy CPU)
        check(self, trial_id, state); time.sleep(0.3)
    RDBStorage.check_trial_is_updatable = paused
    storage = T.open_storage({url!r}, heartbeat=1)
    study = optuna.load_study(study_name="tiny/baseline", storage=storage)
    barrier({ready!r}, 2)   # both processes at once
    T.fail_stale([study], {url!r})
""")

@pytest.mark.slow
def test_two_processes_failing_stale_trials_retry_each_once(tmp_path):
    "Both processes of a resumed study find the trials killed at once: each is failed once and retried once, not twice."
    import optuna
    url = T.default_storage(tmp_path, "tiny")
    study = T.optuna_study(tiny_tuning(), "baseline", T.open_storage(url, heartbeat=1))
    killed = [study.ask() for _ in range(4)]
    for t in killed: study._storage.record_heartbeat(t._trial_id)
    time.sleep(3.5)   # past the grace period: every one of them is stale
    procs = [subprocess.Popen([sys.executable, "-c", STALE.format(tests=str(Path(__file__).parent), url=url, ready=str(tmp_path/"ready"))],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    trials = optuna.load_study(study_name="tiny/baseline", storage=url).get_trials(deepcopy=False)
    retries = pd.Series([t.system_attrs.get("failed_trial") for t in trials]).dropna().astype(int).value_counts()
    assert {t.number for t in trials if t.state.name == "FAIL"} == {t.number for t in killed}
    assert retries.to_dict() == {t.number: 1 for t in killed}, retries   # one retry each

def test_a_trial_retried_twice_counts_once():
    "A setting tried twice to completion (a duplicate retry) is one trial of the budget and one row that counts."
    import optuna
    study = optuna.create_study(direction="maximize")
    for value, retry_of in ((0.5, None), (None, None), (0.6, 1), (0.6, 1), (0.7, None)):   # trial 1 killed, retried twice
        t = study.ask()
        if retry_of is not None: study._storage.set_trial_system_attr(t._trial_id, "failed_trial", retry_of)
        study.tell(t, value, state=optuna.trial.TrialState.FAIL if value is None else None)
    assert T._counts(study) == (3, 0, False)
    frame = T.trials_frame(study)
    waiting = optuna.create_study(direction="maximize"); waiting.enqueue_trial({})   # a waiting trial: one more setting, its arm open
    assert T._counts(waiting) == (0, 1, True)
    assert frame.counted.tolist() == [True, False, True, False, True] and frame.retry_of.tolist()[2:4] == [1, 1]
    progress = R.tuning_progress(frame.assign(arm="a"), budget=3)
    assert progress.loc["a", "complete"] == 3 and progress.loc["a", "best_val_R1"] == 70.0

def test_stored_runs_still_read_as_their_configuration():
    "A configuration field added since (allow_collapse) must not make the studies' stored runs look stale (run_study would retrain them)."
    from dml_book.study_design import study_spec, _same_config
    root = Path(__file__).parent.parent/"results"
    for name in T.SEARCH_SPACES:
        study = study_spec(name)
        for arm, cfg in study.arms.items():
            f = root/name/arm/"seed0"/"metrics.json"
            assert f.is_file() and _same_config(f, replace(cfg, seed=0, out=str(f.parent))), (name, arm)

CLAIM = textwrap.dedent("""
    import sys; sys.path.insert(0, {tests!r})
    from test_tune import barrier
    import json, time, optuna
    from optuna.storages import RDBStorage
    from dml_book import tune as T
    check = RDBStorage.check_trial_is_updatable
    def paused(self, trial_id, state):   # a process paused between reading a waiting trial's state and claiming it
        check(self, trial_id, state); time.sleep(0.3)
    RDBStorage.check_trial_is_updatable = paused
    study = optuna.load_study(study_name="tiny/baseline", storage=T.open_storage({url!r}, heartbeat=60))
    barrier({ready!r}, {processes})   # every process at once
    trial = {claim}
    print(json.dumps(dict(number=trial.number, waiting=trial.number == 0)))
""")

def _claims(tmp_path, claim: str, processes=4) -> list[dict]:
    url = T.default_storage(tmp_path, "tiny")
    T.optuna_study(tiny_tuning(), "baseline", T.open_storage(url))   # created with its first trial waiting
    procs = [subprocess.Popen([sys.executable, "-c", CLAIM.format(tests=str(Path(__file__).parent), url=url, ready=str(tmp_path/"ready"), processes=processes, claim=claim)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(processes)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]

@pytest.mark.slow
def test_one_process_claims_a_waiting_trial(tmp_path):
    "Four processes ask for a trial at once while one waits (the enqueued first): one of them gets it, each a trial of its own."
    claims = _claims(tmp_path, "T.claim(study, " + repr(T.default_storage(tmp_path, "tiny")) + ")")
    assert sum(c["waiting"] for c in claims) == 1, claims
    assert len({c["number"] for c in claims}) == 4, claims

def _finished(folder: Path, tuning, arm: str, values: dict, value: float, epochs: int | None = None):
    "A trial folder as `run_trial` leaves it when the run of `values` ended (run.json is written last)."
    from dataclasses import asdict
    epochs = tuning.epochs if epochs is None else epochs
    folder.mkdir(parents=True)
    config = asdict(replace(tuning.config(arm, values), epochs=epochs))
    (folder/"metrics.json").write_text(json.dumps({"config": config, "epochs": [{"epoch": e, "val_R@1": value} for e in range(epochs + 1)],
                                                   "final": {"val_R@1": value}}))
    (folder/"run.json").write_text(json.dumps({"cpu_seconds": 12.5, "wall_seconds": 13.0}))

def test_a_finished_run_failed_by_a_race_is_recovered_and_the_budget_keeps_its_first_settings(tmp_path):
    "A failed trial whose run finished is told again from its folder, as the setting drawn first; a setting drawn past the budget does not count."
    import optuna
    tuning = tiny_tuning(trials=3); url = T.default_storage(tmp_path, "tiny")
    study = T.optuna_study(tuning, "baseline", T.open_storage(url)); root = tmp_path/"tiny"/"tuning"/"baseline"
    knob = tuning.spaces["baseline"][0]
    for n, (value, state) in enumerate([(None, "FAIL"), (0.3, "COMPLETE"), (None, "FAIL"), (0.4, "COMPLETE"), (0.2, "COMPLETE"), (0.9, "COMPLETE")]):
        t = study.ask(); knob.suggest(t); study.tell(t, value, state=optuna.trial.TrialState[state])
    _finished(root/"trial0", tuning, "baseline", study.trials[0].params, 0.6)   # trial 0 finished: a second process failed it
    _finished(root/"trial2", tuning, "baseline", study.trials[2].params, 0.8, tuning.epochs - 1); (root/"trial2"/"run.json").unlink()   # trial 2 was killed: not finished
    assert T.recover_finished(study, root, tuning, "baseline") == [0]
    assert T.recover_finished(study, root, tuning, "baseline") == []   # once
    frame = T.trials_frame(study, budget=tuning.trials)
    recovered = frame[frame.retry_of == 0]
    assert recovered.state.tolist() == ["COMPLETE"] and recovered.val_R1.tolist() == [0.6] and recovered["first"].all()
    assert recovered.cpu_seconds.tolist() == [12.5]
    assert json.loads(recovered.params.iloc[0]) == T.Tuning.first(tuning, "baseline")
    assert sorted(frame[frame.counted].number) == [1, 3, 6]   # settings 0 (its recovery, trial 6), 1 and 3: the first three drawn
    assert T.best_values(tuning, "baseline", T.open_storage(url)) == study.trials[0].params   # 0.6 best of the counted; 0.9 (trial 5) is past the budget

def test_where_trials_ran_names_each_device_and_format(tmp_path):
    "The tuning page says where the trials trained: the GPU's name (from run.json, or from metrics.json before run.json named it) and the number format."
    def trial(arm, n, run, env, precision):
        f = tmp_path/"s"/"tuning"/arm/f"trial{n}"; f.mkdir(parents=True)
        (f/"run.json").write_text(json.dumps(run))
        (f/"metrics.json").write_text(json.dumps({"environment": {"cuda": env}, "run": {"precision": precision}}))
    trial("a", 0, {"device": "cuda:0"}, "NVIDIA H200", "bf16")
    trial("b", 0, {"device": "cuda:0", "gpu": "NVIDIA H100 80GB HBM3"}, "NVIDIA H100 80GB HBM3", "bf16")
    trial("b", 1, {"device": "cpu"}, None, "fp32"); trial("b", 2, {"device": "cpu"}, None, "fp32")
    assert R.where_trials_ran("s", tmp_path) == "NVIDIA H200 in bf16 (1 trial), NVIDIA H100 80GB HBM3 in bf16 (1 trial), the CPU in fp32 (2 trials)"
    assert R.where_trials_ran("none", tmp_path) == "nothing yet"


def test_a_tuning_with_nothing_left_to_run_writes_nothing(tmp_path, one_thread):
    "Run again once its budget is met, a tuning leaves every file of its tree as it was: bytes and modification times."
    import hashlib, time
    tuning = tiny_tuning(trials=1, epochs=1)
    T.tune(tuning, tmp_path, log=lambda line: None)
    snap = lambda: {p: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    before = snap(); time.sleep(0.01)
    lines = []
    frame = T.tune(tuning, tmp_path, log=lines.append)
    assert snap() == before and lines == [] and len(frame) == 2
    assert {p.name for p in before} >= {"optuna.db", "trials.csv", "metrics.json", "run.json"}


@pytest.mark.parametrize("record", [dict(value=float("nan"), threshold=0.1, active=True), dict(value=0.5, threshold=float("nan"), active=True),
                                    dict(value=0.5, threshold=0.1, active=True, parts=[dict(value=0.5, threshold=0.1), dict(value=float("nan"), threshold=0.1)]),
                                    dict(value=float("inf"), threshold=0.1, active=True)])
def test_a_nan_criterion_is_unknown_never_nearly_feasible(record):
    "A criterion whose value or threshold is NaN (or infinite), in any part: Optuna's constraint is 1 (unknown), as for a missing value, never 1e-6 or 0."
    assert T.constraint_value(record) == 1.0 == T.constraint_value(None)
    assert T.constraint_value(dict(value=0.5, threshold=0.1, active=True)) == 0.0   # a finite criterion that holds: feasible
