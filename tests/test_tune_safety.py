"""The tuning tree follows no link and cleans only its own folders; a tuning resumes exactly what was interrupted, refuses
a store of another tuning or one that keeps nothing, trusts no recovered file it has not read and checked, and shows
no password (issue 62, items 1 and 2)."""
import json, os
from dataclasses import replace
from pathlib import Path
import pytest
from dml_book import tune as T
from dml_book.files import FileError, MARK
from dml_book.study_design import StudyError
from test_tune import tiny_tuning, _finished, TINY


def _study(tmp_path, tuning, arm="baseline"):
    url = T.default_storage(tmp_path, "tiny")
    return url, T.optuna_study(tuning, arm, T.open_storage(url))


def test_a_linked_trial_folder_is_refused_and_the_users_files_stay(tmp_path):
    "A trial folder planted as a link to a user's folder: refused before any training, the user's files untouched."
    user = tmp_path/"thesis"; user.mkdir(); (user/"chapter1.tex").write_text("mine")
    results = tmp_path/"results"
    from dml_book.files import make_folder
    make_folder(results/"tiny"/"tuning"/"baseline", results)
    (results/"tiny"/"tuning"/"baseline"/"trial0").symlink_to(user)
    with pytest.raises(FileError, match="trial0 is a symbolic link") as e: T.tune(tiny_tuning(trials=1), results, arms=("baseline",))
    assert "\n" not in str(e.value)
    assert sorted(os.listdir(user)) == ["chapter1.tex"] and (user/"chapter1.tex").read_text() == "mine"


def test_a_trial_folder_holding_files_it_did_not_make_is_not_trained_into(tmp_path):
    "A real folder without the mark, holding a user's file, where a trial would go: refused, the file kept."
    folder = tmp_path/"results"/"tiny"/"tuning"/"baseline"/"trial0"; folder.mkdir(parents=True)
    (folder/"notes.txt").write_text("mine")
    with pytest.raises(FileError, match="holds files dml_book did not make"): T.tune(tiny_tuning(trials=1), tmp_path/"results", arms=("baseline",))
    assert sorted(os.listdir(folder)) == ["notes.txt"]


def test_a_linked_tuning_folder_is_refused_and_a_store_on_another_disk_works_named_directly(tmp_path):
    "`tuning` linked to another file system: refused in one line that names --results; the store named there directly: trials run and store relative paths."
    other = Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    if other is None or os.stat(other).st_dev == os.stat(tmp_path).st_dev: pytest.skip("no second file system (tmpfs at /dev/shm) to tune into")
    import tempfile
    with tempfile.TemporaryDirectory(dir=other) as disk:
        disk = Path(disk)
        (tmp_path/"results"/"tiny").mkdir(parents=True); (disk/"tuning").mkdir()
        (tmp_path/"results"/"tiny"/"tuning").symlink_to(disk/"tuning")
        with pytest.raises(FileError, match="--results") as e: T.tune(tiny_tuning(trials=1, epochs=1), tmp_path/"results", arms=("baseline",))
        assert "\n" not in str(e.value) and os.listdir(disk/"tuning") == []
        lines = []
        frame = T.tune(tiny_tuning(trials=1, epochs=1), disk/"results", arms=("baseline",), log=lines.append)
        assert frame.state.tolist() == ["COMPLETE"] and len(lines) == 1
        m = json.loads((disk/"results"/"tiny"/"tuning"/"baseline"/"trial0"/"metrics.json").read_text())
        assert m["config"]["out"] == "tiny/tuning/baseline/trial0"


def test_run_json_and_the_storage_are_never_written_through_a_link(tmp_path):
    "A study run's run.json planted as a link: refused before training, its target untouched; a dangling link in place of a lock or SQLite's journal beside the store: refused in one line, nothing created there."
    from dml_book.study_design import train_one
    target = tmp_path/"elsewhere.txt"; target.write_text("keep")
    out = tmp_path/"results"/"s"/"baseline"/"seed0"; out.mkdir(parents=True); (out/MARK).touch()
    (out/"run.json").symlink_to(target)
    with pytest.raises(FileError, match="run.json is a symbolic link"): train_one(replace(TINY, out=str(out)), tmp_path/"results")
    assert target.read_text() == "keep" and not (out/"metrics.json").exists()   # refused before any training
    url = T.default_storage(tmp_path, "tiny"); db = Path(url.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True)
    for side in ("optuna.db.lock", "optuna.db-journal"):
        (db.parent/side).symlink_to(tmp_path/"planted")
        with pytest.raises(FileError, match=f"{side} is a symbolic link beside the storage") as e: T.open_storage(url)
        with pytest.raises(FileError, match=f"{side} is a symbolic link beside the storage"): T.tune(tiny_tuning(trials=1), tmp_path, log=lambda line: None)
        assert "\n" not in str(e.value) and "planted" not in str(e.value)
        assert not (tmp_path/"planted").exists() and sorted(os.listdir(db.parent)) == [side]   # the link only, as planted
        (db.parent/side).unlink()
    T.claim(T.optuna_study(tiny_tuning(), "baseline", T.open_storage(url)), url)
    db.rename(db.with_name("real.db")); db.symlink_to(db.with_name("real.db"))
    with pytest.raises(FileError, match="optuna.db is a symbolic link"): T.open_storage(url)


def test_an_interrupted_trial_is_retried_with_its_settings_and_the_tuning_resumes(tmp_path, monkeypatch):
    "Ctrl-C during the arm's first trial (the study's own setting): the trial fails and waits to be run again with its settings; the resumed tuning runs it, once, in its folder."
    tuning, results, real = tiny_tuning(trials=2, epochs=1), tmp_path/"results", T.run_trial
    def interrupted(cfg, *a, **k): raise KeyboardInterrupt
    monkeypatch.setattr(T, "run_trial", interrupted)
    with pytest.raises(KeyboardInterrupt): T.tune(tuning, results, arms=("baseline",))
    study = T.optuna_study(tuning, "baseline", T.open_storage(T.default_storage(results, "tiny")))
    [failed, waiting] = study.get_trials(deepcopy=False)
    assert (failed.state.name, waiting.state.name) == ("FAIL", "WAITING") and waiting.system_attrs["failed_trial"] == 0
    assert waiting.params == failed.params == tuning.first("baseline") and waiting.user_attrs.get("first")
    monkeypatch.setattr(T, "run_trial", real)
    lines = []
    frame = T.tune(tuning, results, arms=("baseline",), log=lines.append)
    done = frame[frame.counted]
    assert len(done) == 2 and done.retry_of.tolist()[0] == 0 and json.loads(done.params.iloc[0]) == tuning.first("baseline")
    assert [l.split(":")[0] for l in lines] == ["tiny/baseline"] * 2 and lines[-1].endswith("2 of 2 complete"), lines
    root = results/"tiny"/"tuning"
    assert sorted(p.name for p in (root/"baseline").glob("trial[0-9]*")) == ["trial0", f"trial{int(done.number.iloc[1])}"]
    assert sorted(os.listdir(root)) == [MARK, "baseline", "optuna.db"]   # no optuna.db.lock left behind
    assert T.finished_run(root/"baseline"/"trial0", tuning, "baseline", tuning.first("baseline"))["value"] == done.val_R1.iloc[0]


def test_a_trials_own_failure_is_not_retried(tmp_path, monkeypatch):
    "An error of the trial's own settings fails it without a retry (running it again would fail again)."
    def broken(cfg, *a, **k): raise ValueError("this setting cannot train")
    monkeypatch.setattr(T, "run_trial", broken)
    with pytest.raises(ValueError): T.tune(tiny_tuning(trials=1), tmp_path, arms=("baseline",))
    _, study = _study(tmp_path, tiny_tuning(trials=1))
    assert [t.state.name for t in study.get_trials(deepcopy=False)] == ["FAIL"]
    assert T.own_failure(ValueError()) and not any(map(T.own_failure, (KeyboardInterrupt(), SystemExit(), OSError(28, "full"), MemoryError())))


@pytest.mark.parametrize("change,word", [(dict(epochs=3), "--epochs"), (dict(trials=5), "--trials"), (dict(seed=1), "seed")])
def test_a_store_of_another_tuning_is_refused(tmp_path, change, word):
    "A storage records its trial length, budget, seed and search space; resuming it with another is refused in one line."
    tuning = tiny_tuning()
    url, _ = _study(tmp_path, tuning)
    with pytest.raises(StudyError, match=word) as e: T.optuna_study(replace(tuning, **change), "baseline", T.open_storage(url))
    assert "\n" not in str(e.value)
    wider = replace(tuning, spaces={**tuning.spaces, "baseline": (T.Knob("lr_head", 1e-5, 1e-2, log=True),)})
    with pytest.raises(StudyError, match="search space"): T.optuna_study(wider, "baseline", T.open_storage(url))
    T.optuna_study(tuning, "baseline", T.open_storage(url))   # the same tuning resumes


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:mem?mode=memory&uri=true"])
def test_a_storage_that_keeps_nothing_is_refused_before_any_trial(tmp_path, url):
    with pytest.raises(StudyError, match="keeps nothing") as e: T.tune(tiny_tuning(trials=1), tmp_path, storage=url)
    assert "\n" not in str(e.value) and not list((tmp_path/"tiny"/"tuning").glob("*/trial*"))


@pytest.mark.parametrize("url", ["postgresql+psycopg://me:s3cr3t-pw@127.0.0.1:1/db",   # a server that does not answer
                                 "postgresql://me:s3cr3t-pw@host:port/db",              # a malformed URL
                                 "nosuchdb://me:s3cr3t-pw@host/db"])                    # an unknown dialect
def test_no_password_in_a_storage_message(tmp_path, url):
    with pytest.raises(StudyError) as e: T.open_storage(url)
    assert "s3cr3t-pw" not in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "s3cr3t-pw" not in T.shown(url)


def _recovery_case(tmp_path):
    tuning = tiny_tuning(trials=2); url, study = _study(tmp_path, tuning)
    import optuna
    t = study.ask(); [k.suggest(t) for k in tuning.spaces["baseline"]]
    study.tell(t, state=optuna.trial.TrialState.FAIL)   # the first trial (the study's own setting), failed by a race
    return tuning, study, tmp_path/"tiny"/"tuning"/"baseline"/"trial0", study.trials[0].params


def test_a_recovered_trial_is_read_through_the_reading_layer_and_checked(tmp_path):
    "A failed trial's folder is recovered only when its files are regular, readable, a run's, of the trial's settings and length, and consistent."
    import optuna
    tuning, study, folder, params = _recovery_case(tmp_path)
    other = {**params, "lr_head": params["lr_head"] * 2}
    cases = {"a FIFO": lambda f: (f.mkdir(parents=True), os.mkfifo(f/"metrics.json"), (f/"run.json").write_text('{"cpu_seconds": 1}')),
             "garbage": lambda f: (_finished(f, tuning, "baseline", params, 0.6), (f/"metrics.json").write_bytes(b"\x00\xff{garbage")),
             "another trial's settings": lambda f: _finished(f, tuning, "baseline", other, 0.99),
             "a final score not its last epoch's": lambda f: (_finished(f, tuning, "baseline", params, 0.5),
                 (f/"metrics.json").write_text((f/"metrics.json").read_text().replace('"final": {"val_R@1": 0.5}', '"final": {"val_R@1": 0.99}'))),
             "another length": lambda f: _finished(f, tuning, "baseline", params, 0.7, tuning.epochs + 1),
             "a score out of range": lambda f: _finished(f, tuning, "baseline", params, 7.0),
             "a link": lambda f: (_finished(f.with_name("real"), tuning, "baseline", params, 0.6), f.symlink_to(f.with_name("real")))}
    import shutil
    for what, make in cases.items():
        make(folder)
        assert T.recover_finished(study, folder.parent, tuning, "baseline") == [], what
        shutil.rmtree(folder) if not folder.is_symlink() else folder.unlink()
        shutil.rmtree(folder.with_name("real"), ignore_errors=True)
    _finished(folder, tuning, "baseline", params, 0.6)
    assert T.recover_finished(study, folder.parent, tuning, "baseline") == [0]
    assert [t.value for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE] == [0.6]


def test_a_store_whose_arm_drew_a_knob_from_another_kind_is_one_line(tmp_path):
    "A stored trial of the arm drew lr_head as an integer: refused before any trial, in one line naming the store and the knob (Optuna: ValueError at the next draw)."
    import optuna
    tuning = tiny_tuning(trials=2); url, study = _study(tmp_path, tuning)
    study.add_trial(optuna.trial.create_trial(params={"lr_head": 3}, distributions={"lr_head": optuna.distributions.IntDistribution(1, 9)}, value=0.1))
    with pytest.raises(StudyError, match="trial 1 with lr_head drawn from a IntDistribution, not the search space's FloatDistribution") as e:
        T.tune(tuning, tmp_path, arms=("baseline",), log=lambda line: None)
    assert "\n" not in str(e.value) and "optuna.db" in str(e.value)
    assert not (tmp_path/"tiny"/"tuning"/"baseline"/"trial0").exists()   # refused before any training


def test_a_damaged_store_is_one_line(tmp_path):
    db = tmp_path/"tiny"/"tuning"/"optuna.db"; db.parent.mkdir(parents=True); db.write_bytes(b"not a database, " * 100)
    with pytest.raises(StudyError, match="is not a tuning database, or is damaged: move it aside") as e:
        T.tune(tiny_tuning(trials=1), tmp_path, arms=("baseline",), log=lambda line: None)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("said,words", [("database is locked", "stayed locked by another process"),
                                        ("attempt to write a readonly database", "cannot be written (a read-only folder or file?)"),
                                        ('FATAL:  password authentication failed for user "me"', "refused the login: check the user and password (not shown)"),
                                        ('FATAL:  database "tuning" does not exist', "names a database the server does not have"),
                                        ("server closed the connection unexpectedly", "cannot be reached (the server went away?)")])
def test_each_store_fault_is_one_line_naming_the_store_without_its_password(said, words):
    "What SQLAlchemy raises (wrapped by Optuna's StorageInternalError, as a commit's failure is): one line, the store named, no password."
    from sqlalchemy.exc import OperationalError
    from optuna.exceptions import StorageInternalError
    url = "postgresql+psycopg://me:s3cr3t-pw@db.example/tuning"
    def fail():
        try: raise OperationalError("UPDATE trials", {}, Exception(f"{said} (me:s3cr3t-pw)"))
        except OperationalError as e: raise StorageInternalError("An exception is raised during the commit.") from e
    with pytest.raises(StudyError) as e:
        with T.store_errors(url): fail()
    assert words in str(e.value) and "me:***@db.example/tuning" in str(e.value) and "s3cr3t" not in str(e.value) and "\n" not in str(e.value)


def _read_only(folder: Path):
    "Make `folder` read-only for this process: its mode where that binds (not root), else a read-only bind mount; None where neither works."
    import subprocess
    if os.geteuid() != 0:
        for p in [folder, *folder.rglob("*")]: p.chmod(p.stat().st_mode & ~0o222)
        return lambda: [p.chmod(p.stat().st_mode | 0o200) for p in [folder, *folder.rglob("*")]]
    ok = subprocess.run(["mount", "--bind", folder, folder], capture_output=True).returncode == 0 and \
         subprocess.run(["mount", "-o", "remount,ro,bind", folder], capture_output=True).returncode == 0
    return (lambda: subprocess.run(["umount", "-l", folder], capture_output=True)) if ok else None   # lazy: the store's engine may hold a file open


def test_a_finished_tuning_in_a_read_only_folder_runs_and_writes_nothing(tmp_path):
    "The budget met, the results tree read-only: the tuning has nothing to do and ends without an error (Optuna: StorageInternalError)."
    tuning = tiny_tuning(trials=1, epochs=1)
    T.tune(tuning, tmp_path, log=lambda line: None)
    undo = _read_only(tmp_path/"tiny")
    if undo is None: pytest.skip("no way to make a folder read-only here")
    try:
        frame = T.tune(tuning, tmp_path, log=lambda line: None)
        assert sorted(frame.arm) == ["baseline", "other"]
    finally: undo()


def test_a_finished_trial_it_cannot_trust_is_named_in_one_line_and_counted_nowhere(tmp_path):
    "A failed trial whose run.json says it finished, but whose records fail the checks: one line naming the file; an interrupted one (no run.json): no word."
    import optuna, shutil
    tuning, study, folder, params = _recovery_case(tmp_path)
    metrics = lambda f: f/"metrics.json"
    cases = {"metrics.json is not JSON": lambda f: (_finished(f, tuning, "baseline", params, 0.6), metrics(f).write_bytes(b"{the-secret\x00")),
             "metrics.json is a FIFO": lambda f: (_finished(f, tuning, "baseline", params, 0.6), metrics(f).unlink(), os.mkfifo(metrics(f))),
             "holds no list of epochs": lambda f: (_finished(f, tuning, "baseline", params, 0.6),
                                                   metrics(f).write_text(json.dumps({**json.loads(metrics(f).read_text()), "epochs": 3}))),
             "run.json is not JSON": lambda f: (_finished(f, tuning, "baseline", params, 0.6), (f/"run.json").write_text("{the-secret")),
             "run.json holds a list, not a record": lambda f: (_finished(f, tuning, "baseline", params, 0.6), (f/"run.json").write_text("[1]"))}
    for words, make in cases.items():
        make(folder); lines = []
        assert T.recover_finished(study, folder.parent, tuning, "baseline", log=lines.append) == [], words
        assert len(lines) == 1 and words in lines[0].replace("(named pipe)", "").replace(f"{folder}/", ""), (words, lines)
        assert "tiny/baseline: trial 0 set aside, counted nowhere" in lines[0] and "\n" not in lines[0] and "the-secret" not in lines[0], lines
        assert not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))   # counted nowhere
        shutil.rmtree(folder)
    folder.mkdir(); metrics(folder).write_text("{}")   # interrupted before run.json: it runs again, nothing said
    lines = []; assert T.recover_finished(study, folder.parent, tuning, "baseline", log=lines.append) == [] and lines == []
