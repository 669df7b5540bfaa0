"Tuning with the mechanism at work (`dml_book.selection`, `Tuning.constrained`): each trial's activity criterion becomes Optuna's constraint, and only feasible trials become candidates."
import json
from dataclasses import replace
import pandas as pd
import pytest
from dml_book.study_design import Study
from dml_book import tune as T
from dml_book.selection import candidates, selection_plan
from test_tune import TINY

EPISODES = dict(method="dmml", loss="triplet", method_kwargs={"n_classes": 3, "n_support": 3, "n_query": 1})

def dmml_tuning(trials):
    "A tiny tuning whose DMML arm searches its support size: its criterion (>= 2 support images) holds for exactly some values."
    arms = {"baseline": TINY, "dmml": replace(TINY, **EPISODES)}
    study = Study("tiny", arms, {"dmml": ("method", "method_kwargs")})
    spaces = {"baseline": (T.Knob("lr_head", 1e-4, 1e-2, log=True),),
              "dmml": (T.Knob("lr_head", 1e-4, 1e-2, log=True), T.Knob("method_kwargs.n_support", choices=(1, 2, 3)))}
    return T.Tuning(study, spaces, trials=trials, epochs=1, constrained=("dmml",))

def test_each_trials_criterion_is_its_optuna_constraint(tmp_path, one_thread):
    import optuna
    t = dmml_tuning(trials=4)
    T.tune(t, str(tmp_path), arms=("dmml",))
    trials = pd.read_csv(tmp_path/"tiny"/"tuning"/"dmml"/"trials.csv")
    done = trials[trials.counted]
    assert len(done) == 4
    support = done.params.map(lambda p: json.loads(p)["method_kwargs.n_support"])
    assert (done.criterion_value == support).all()   # DMML's criterion: the meta-cell's support images
    assert (done.feasible.astype(bool) == (support >= 2)).all() and (done.constraint[support >= 2] == 0).all()
    assert (done.constraint[support < 2] == 0.5).all()   # one image short of two: half the threshold
    for r in done.itertuples():   # each trial's metrics.json says the same
        m = json.loads((tmp_path/"tiny"/"tuning"/"dmml"/f"trial{r.number}"/"metrics.json").read_text())["mechanism"]
        assert m["value"] == r.criterion_value and m["active"] == r.feasible
    store = optuna.load_study(study_name="tiny/dmml", storage=T.default_storage(tmp_path, "tiny"))
    assert all(tr.system_attrs["constraints:mechanism"] == c for tr, c in zip(store.get_trials(), trials.constraint))   # what TPE reads
    picked = candidates(done.assign(arm="dmml"))
    assert set(picked.number) == set(done.number[support >= 2].head(3)) or len(picked) == min(3, int((support >= 2).sum()))
    assert picked.number.isin(done.number[support >= 2]).all()

def test_a_candidate_runs_the_full_schedule_with_its_seed(tmp_path):
    t = dmml_tuning(trials=2)
    trials = pd.DataFrame(dict(number=[0, 1], state="COMPLETE", val_R1=[0.4, 0.5], counted=True, feasible=[True, True],
                               params=[json.dumps({"lr_head": 1e-3, "method_kwargs.n_support": s}) for s in (2, 3)]))
    plan = selection_plan(t, "dmml", trials, tmp_path, seeds=(0, 1))
    assert [(k, s) for k, s, _ in plan] == [(1, 0), (1, 1), (0, 0), (0, 1)]
    for k, s, cfg in plan:
        assert cfg.epochs == TINY.epochs and cfg.seed == s and cfg.out.endswith(f"tiny/tuning/dmml/selection/trial{k}/seed{s}")
        assert cfg.method_kwargs["n_support"] == (3 if k == 1 else 2) and cfg.lr_head == 1e-3

def _cli(*args, cwd):
    import subprocess, sys, os
    return subprocess.run([sys.executable, "-m", "dml_book.cli", *args], cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)

def test_tune_active_plans_the_method_arm_and_waits_for_a_yes(tmp_path):
    r = _cli("tune", "dcml", "--active", "--results", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--yes" in r.stderr, r.stderr
    assert "arms baseline, dcml-active" in r.stdout and "dcml-active 20 of 20" in r.stdout, r.stdout
    assert not (tmp_path/"dcml"/"tuning"/"dcml-active").exists()   # nothing trained before the yes
    r = _cli("tune", "dcml", "--pretrained", "--results", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "add --active" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    r = _cli("tune", "dcml", "--active", "--arm", "dcml", "--results", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "dcml-active" in r.stderr, r.stderr   # the plain method arm is not an arm of the active tuning

def test_trials_from_another_device_run_again_here_before_the_candidates(tmp_path, one_thread):
    "An arm whose trials ran on a GPU (as the stored H200 baselines): every counted trial trains again here, and the candidates are ranked on these values."
    from dml_book.selection import run_selection, selection_frame, study_cost, arm_trials
    t = dmml_tuning(trials=3)
    T.tune(t, str(tmp_path), arms=("baseline",))
    arm = tmp_path/"tiny"/"tuning"/"baseline"
    for f in arm.glob("trial*/run.json"):   # as if they had trained on a GPU
        f.write_text(json.dumps({**json.loads(f.read_text()), "device": "cuda:0"}))
    run_selection(t, ("baseline",), str(tmp_path), log=lambda s: None)
    again = pd.read_csv(arm/"device.csv")
    trials = pd.read_csv(arm/"trials.csv"); done = trials[trials.counted]
    assert sorted(again.number) == sorted(done.number) and set(again.device) == {"cuda"} and set(again.rerun_device) == {"cpu"}
    # the trials really ran on this CPU with the same seed: trained again, each gives its trial's value to the last bit
    assert (again.set_index("number").rerun_val_R1 == done.set_index("number").val_R1).all()
    for k in done.number:
        m = json.loads((arm/"device"/f"trial{k}"/"metrics.json").read_text())
        assert m["config"]["epochs"] == t.epochs and m["config"]["seed"] == t.seed
    assert len(arm_trials(t, "baseline", str(tmp_path))) == len(trials)
    assert len(selection_frame(t, "baseline", str(tmp_path))) == 3
    cost = study_cost(t, str(tmp_path))
    assert cost["runs"]["device"] == 3 and set(cost["device"]) == {"cpu"} and set(cost["tuning"]) == {"cuda"}
    assert run_selection(t, ("baseline",), str(tmp_path), log=lambda s: None) == 0   # resumable: nothing left

def test_decide_swaps_copies_the_decided_arms_and_trains_only_the_swaps_at_their_seeds(tmp_path, monkeypatch):
    "The swap study reuses the decision's two arms (same configuration and seed) and asks `run_study` for the decision's paired seeds in every arm (not a seed one arm lacks)."
    from dataclasses import asdict
    import dml_book.study_design as SD
    from dml_book.selection import active_tuning, active_study, selection_folder, decide_swaps, study_cost
    from dml_book.files import make_folder, write_json
    t = active_tuning("pads")
    for arm in t.spaces:   # hand-written picks: each arm's first trial
        f = selection_folder(tmp_path, t, arm).with_name("selection.csv"); f.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([dict(candidate=0, picked=True, params=json.dumps(t.first(arm)))]).to_csv(f, index=False)
    s = active_study(t, tmp_path)
    for arm, k in [(a, k) for a in s.arms for k in (0, 3)] + [("baseline", 5)]:   # seed 5: the baseline's only, paired with nothing
        out = make_folder(tmp_path/s.name/arm/f"seed{k}", tmp_path)
        write_json(out/"metrics.json", {"config": {**asdict(replace(s.arms[arm], seed=k, out=str(out)))}, "final": {"R@1": 0.5}})
        write_json(out/"run.json", {"cpu_seconds": 60.0, "device": "cpu"})
    asked = {}
    monkeypatch.setattr(SD, "run_study", lambda study, results, jobs, seeds, log: asked.update(name=study.name, seeds=seeds) or pd.DataFrame(dict(variant=[], x=[])))
    decide_swaps(t, tmp_path)
    assert asked["name"] == "pads/tuned-active-swap"
    assert asked["seeds"] == {a: [0, 3] for a in ("baseline", "pads", "pads-baseline-shared", "baseline-pads-shared")}
    for arm in s.arms:
        for k in (0, 3):
            copied = tmp_path/"pads"/"tuned-active-swap"/arm/f"seed{k}"/"metrics.json"
            assert copied.read_text() == (tmp_path/s.name/arm/f"seed{k}"/"metrics.json").read_text()
            assert SD._same_config(copied, replace(s.arms[arm], seed=k, out=str(copied.parent)))   # run_study keeps it, trains none
    assert study_cost(t, tmp_path)["runs"]["swap"] == 0   # the copies are the decision's runs, not the swaps'
    assert not (tmp_path/"pads"/"tuned-active-swap"/"baseline"/"seed5").exists()   # the unpaired seed is not copied either

def test_infeasible_is_concluded_only_from_a_finished_budget_and_selection_and_goes_once_a_pick_exists(tmp_path):
    from dml_book.selection import write_infeasible, selection_folder
    t = dmml_tuning(trials=3); t = replace(t, study=replace(t.study, main=("dmml",))); arm = tmp_path/"tiny"/"tuning"/"dmml"; arm.mkdir(parents=True)
    f = arm/"infeasible.json"
    def trials(feasible):
        pd.DataFrame(dict(number=range(len(feasible)), state="COMPLETE", val_R1=[0.5, 0.6, 0.4][:len(feasible)], counted=True, feasible=feasible,
                          params=[json.dumps({"lr_head": 1e-3, "method_kwargs.n_support": 2})] * len(feasible))).to_csv(arm/"trials.csv", index=False)
    def seed(k, s, active):
        out = selection_folder(tmp_path, t, "dmml")/f"trial{k}"/f"seed{s}"; out.mkdir(parents=True, exist_ok=True)
        (out/"metrics.json").write_text(json.dumps({"final": {"val_R@1": 0.7}, "mechanism": dict(criterion="c", value=float(active), threshold=1.0, active=active)}))
    trials([False, False])   # two of three trials: the budget is unfinished
    assert write_infeasible(t, tmp_path) is None and not f.exists()
    trials([False, False, False])
    assert write_infeasible(t, tmp_path)["why"] == "no trial of the budget met the criterion" and f.exists()
    trials([True, True, False]); f.unlink()
    seed(1, 0, False)   # candidates 1 and 0; one seed of one finished
    assert write_infeasible(t, tmp_path) is None and not f.exists()
    for k, s in [(1, 1), (0, 0), (0, 1)]: seed(k, s, False)
    rec = write_infeasible(t, tmp_path)
    assert rec["why"] == "no candidate met the criterion in every seed at the full schedule" and rec["feasible"] == 2 and f.exists()
    def diverge(k, s):
        out = selection_folder(tmp_path, t, "dmml")/f"trial{k}"/f"seed{s}"; (out/"metrics.json").unlink(); (out/"diverged.json").write_text(json.dumps({"diverged": "nan"}))
    diverge(1, 1)   # one candidate diverged in a seed, the other missed the criterion: both said
    assert write_infeasible(t, tmp_path)["why"] == "no candidate met the criterion in every seed at the full schedule (1 of 2 diverged in a seed)"
    diverge(0, 1)   # each diverged in a seed: that is the reason, not the criterion
    assert write_infeasible(t, tmp_path)["why"] == "every candidate diverged in a seed at the full schedule"
    seed(0, 0, True); seed(0, 1, True)   # candidate 0 held after all: picked, the stale conclusion goes
    (selection_folder(tmp_path, t, "dmml")/"trial0"/"seed1"/"diverged.json").unlink()
    assert write_infeasible(t, tmp_path) is None and not f.exists()

def test_a_candidate_that_is_its_trial_is_copied_not_trained(tmp_path, one_thread):
    "Trials as long as the study's schedule (the pretrained regime): each candidate's seed-0 run is its trial, copied; seed 1 trains; the copy is what training would give."
    from dml_book.selection import run_selection, selection_frame, study_cost
    t = replace(dmml_tuning(trials=3), epochs=TINY.epochs)   # a trial runs the arm's whole schedule, at seed 0
    T.tune(t, str(tmp_path), arms=("baseline",))
    lines = []
    assert run_selection(t, ("baseline",), str(tmp_path), log=lines.append) == 3   # seed 1 of each candidate only
    copied = [l for l in lines if "is the trial itself" in l]
    assert len(copied) == 3 and all("seed0" in l for l in copied)
    sel, arm = tmp_path/"tiny"/"tuning"/"baseline"/"selection", tmp_path/"tiny"/"tuning"/"baseline"
    for run in sel.glob("trial*/seed0"):
        info = json.loads((run/"run.json").read_text())
        assert info["copied_from"] == f"tiny/tuning/baseline/{run.parent.name}" and info["cpu_seconds"] == 0
        m = json.loads((run/"metrics.json").read_text())
        assert m["config"]["out"] == f"tiny/tuning/baseline/selection/{run.parent.name}/seed0"   # its own folder, relative
        assert m["final"] == json.loads((arm/run.parent.name/"metrics.json").read_text())["final"]
    k = int(next(sel.glob("trial*")).name[5:])   # trained for real with the trial's threads, a copied candidate gives the copy to the last bit
    threads = json.loads((arm/f"trial{k}"/"run.json").read_text())["threads"]
    again = T.run_trial(replace(TINY, **json.loads(pd.read_csv(arm/"trials.csv").set_index("number").params[k]),
                                seed=0, out=str(tmp_path/"again")), threads, tmp_path)
    assert again == json.loads((sel/f"trial{k}"/"seed0"/"metrics.json").read_text())["final"]
    assert (selection_frame(t, "baseline", str(tmp_path)).seeds == 2).all() and study_cost(t, str(tmp_path))["runs"]["selection"] == 6
    assert run_selection(t, ("baseline",), str(tmp_path), log=lines.append) == 0

def test_a_pick_whose_mechanism_lapses_in_the_decision_is_set_aside_and_the_next_candidate_decided(tmp_path):
    "Under 80% of the decision's method seeds met the criterion: those seeds move to decided/trial<k>/ (kept, costed), the next candidate is picked; with none left, infeasible.json says why."
    from dml_book.selection import write_selection, write_infeasible, reject_tuned_away, selection_folder, decided_folder, study_cost
    from dml_book.files import FileError
    t = dmml_tuning(trials=3); t = replace(t, study=replace(t.study, main=("dmml",)))
    params = {"baseline": {"lr_head": 1e-3}, "dmml": {"lr_head": 1e-3, "method_kwargs.n_support": 2}}
    for arm in t.spaces:
        (d := tmp_path/"tiny"/"tuning"/arm).mkdir(parents=True)
        pd.DataFrame(dict(number=range(3), state="COMPLETE", val_R1=[0.5, 0.6, 0.4], counted=True, feasible=True,
                          params=[json.dumps(params[arm])] * 3)).to_csv(d/"trials.csv", index=False)
    f = selection_folder(tmp_path, t, "baseline").with_name("selection.csv")   # the baseline's pick, by hand
    pd.DataFrame([dict(candidate=1, picked=True, params=json.dumps(params["baseline"]))]).to_csv(f, index=False)
    mech = lambda active: dict(criterion="support images per meta-cell", value=2.0 if active else 1.0, threshold=2.0, active=active)
    for k, r1 in [(0, 0.7), (1, 0.8), (2, 0.6)]:   # every candidate met the criterion in both selection seeds; 1 is best, then 0, then 2
        for s in (0, 1):
            (out := selection_folder(tmp_path, t, "dmml")/f"trial{k}"/f"seed{s}").mkdir(parents=True)
            (out/"metrics.json").write_text(json.dumps({"final": {"val_R@1": r1}, "mechanism": mech(True)}))
    def decide(met):   # the method arm's decision seeds, `met` of five meeting the criterion
        for s in range(5):
            (out := tmp_path/"tiny"/"tuned-active"/"dmml"/f"seed{s}").mkdir(parents=True)
            (out/"metrics.json").write_text(json.dumps({"config": {"method": "dmml"}, "epochs": [], "final": {"R@1": 0.5}, "mechanism": mech(s < met)}))
            (out/"run.json").write_text(json.dumps({"cpu_seconds": 60.0, "device": "cpu"}))
    assert write_selection(t, "dmml", tmp_path).set_index("candidate").picked.to_dict() == {1: True, 0: False, 2: False}
    decide(3); said = []
    assert reject_tuned_away(t, tmp_path, log=said.append) == 1 and "candidate 1 met its criterion in 3 of 5 decision seeds, under 80%" in said[0]
    assert not (tmp_path/"tiny"/"tuned-active"/"dmml").exists() and (decided_folder(tmp_path, t, "dmml")/"trial1"/"seed4"/"metrics.json").is_file()
    assert reject_tuned_away(t, tmp_path, log=said.append) is None   # no decision seeds: nothing to judge
    sel = write_selection(t, "dmml", tmp_path).set_index("candidate")
    assert sel.picked.to_dict() == {1: False, 0: True, 2: False} and sel.loc[1, "decision_met"] == "3 of 5" and sel.rejected.to_dict() == {1: True, 0: False, 2: False}
    assert study_cost(t, tmp_path)["runs"]["decision"] == 5 and study_cost(t, tmp_path)["decision"] == {"cpu": 5.0}   # the seeds set aside still cost
    decide(4)   # 4 of 5: the mechanism stayed at work, the pick stands
    assert reject_tuned_away(t, tmp_path, log=said.append) is None and (tmp_path/"tiny"/"tuned-active"/"dmml"/"seed0").is_dir()
    (decided_folder(tmp_path, t, "dmml")/"trial0").mkdir()   # a set-aside folder already there is never overwritten
    for s in range(5): (tmp_path/"tiny"/"tuned-active"/"dmml"/f"seed{s}"/"metrics.json").write_text(
        json.dumps({"config": {"method": "dmml"}, "epochs": [], "final": {"R@1": 0.5}, "mechanism": mech(False)}))
    with pytest.raises(FileError, match="candidate 0's decision was set aside before"): reject_tuned_away(t, tmp_path, log=said.append)
    (decided_folder(tmp_path, t, "dmml")/"trial0").rmdir()
    assert reject_tuned_away(t, tmp_path, log=said.append) == 0 and write_selection(t, "dmml", tmp_path).set_index("candidate").picked[2]
    decide(0); assert reject_tuned_away(t, tmp_path, log=said.append) == 2
    assert not write_selection(t, "dmml", tmp_path).picked.any()
    assert write_infeasible(t, tmp_path)["why"] == ("no candidate kept the criterion through the decision: 3 of 3 met it in every seed at the full "
                                                    "schedule and, decided in turn, each met it in under 80% of its decision seeds")
