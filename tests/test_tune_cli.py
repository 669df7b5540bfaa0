"""`dml-book tune` says what it is about to do before the first trial, before torch is imported: the study, the arms, the
trials left, their length, an estimate from stored times and where the storage is; it waits for a yes before long work,
and its --help shows the defaults' values (issue 61, item 3)."""
import io, json, os, subprocess, sys
from pathlib import Path
import pytest
from dml_book import cli
from dml_book import tune as T
from test_tune import tiny_tuning

ROOT = Path(__file__).resolve().parents[1]


def test_help_shows_the_values_of_the_defaults():
    tune = next(a for a in cli.parser("tune")._actions if a.dest == "command").choices["tune"]
    text = " ".join(tune.format_help().split())
    assert f"(default: {T.TRIALS})" in text and f"(default: {T.TRIAL_EPOCHS})" in text and "dml_book.tune" not in text and "--yes" in text


def _book_estimate(name: str, trials: int, epochs: int) -> float:
    "The formula: each arm's stored seed-0 run, its wall seconds per epoch, times a trial's epochs and the trials left."
    total = 0
    for arm in T.SEARCH_SPACES[name]:
        run = ROOT/"results"/name/arm/"seed0"
        total += json.loads((run/"run.json").read_text())["wall_seconds"] / json.loads((run/"metrics.json").read_text())["config"]["epochs"] * epochs * trials
    return total


def test_the_plan_comes_before_torch_and_long_work_waits_for_a_yes(tmp_path):
    code = ("import sys; from dml_book.cli import main; rc = main(['tune', 'dcml', '--results', %r])\n"
            "sys.stderr.write('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(rc)") % str(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines, err = r.stdout.splitlines(), r.stderr.removesuffix("NO-TORCH").strip()
    assert r.returncode == 2 and r.stderr.endswith("NO-TORCH"), r.stderr   # refused before torch was imported
    assert lines[0] == f"Tuning dcml: arms baseline, dcml; {T.TRIALS} trials of {T.TRIAL_EPOCHS} epochs per arm, on validation classes only."
    assert lines[1] == f"Trials left: baseline {T.TRIALS} of {T.TRIALS}, dcml {T.TRIALS} of {T.TRIALS}."
    estimate = T._duration(_book_estimate("dcml", T.TRIALS, T.TRIAL_EPOCHS))
    assert lines[2].startswith(f"Estimate: about {estimate} with 1 process") and "from the book's stored runs" in lines[2], lines[2]
    assert lines[3] == f"Storage: sqlite:///{tmp_path}/dcml/tuning/optuna.db; trial folders under {tmp_path}/dcml/tuning/."
    assert err == f"dml-book: error: this is about {estimate} of training ({2 * T.TRIALS} trials): pass --yes to start it", err
    assert list(tmp_path.iterdir()) == []   # nothing made


class _Terminal(io.StringIO):
    def isatty(self): return True

class _Started(Exception): pass

@pytest.mark.parametrize("answer,argv", [("n\n", []), ("no-eof", []), ("y\n", []), ("", ["--yes"])])
def test_on_a_terminal_it_asks_and_only_a_yes_starts(tmp_path, monkeypatch, capsys, answer, argv):
    def started(*a, **k): raise _Started
    monkeypatch.setattr(T, "tune", started)
    monkeypatch.setattr(sys, "stdin", _Terminal("" if answer == "no-eof" else answer) if not argv else io.StringIO(""))   # "": Ctrl-D
    if answer.startswith("n"):
        assert cli.main(["tune", "dcml", "--results", str(tmp_path), *argv]) == 1
        assert capsys.readouterr().out.splitlines()[-1].endswith("[y/N] Nothing started.")
    else:
        with pytest.raises(_Started): cli.main(["tune", "dcml", "--results", str(tmp_path), *argv])
    assert list(tmp_path.iterdir()) == []


def test_the_plan_of_a_resumed_storage_counts_its_trials_and_times_them(tmp_path, monkeypatch):
    "Trials left from the storage; the estimate from its complete trials' wall seconds per epoch, over the processes."
    import optuna
    tuning = tiny_tuning(trials=3, epochs=2)
    monkeypatch.setitem(T.SEARCH_SPACES, "tiny", tuning.spaces)
    study = T.optuna_study(tuning, "baseline", T.open_storage(T.default_storage(tmp_path, "tiny")))
    for secs in (30, 50):
        t = study.ask(); [k.suggest(t) for k in tuning.spaces["baseline"]]
        t.set_user_attr("wall_seconds", secs)
        study.tell(t, 0.5)
    plan = T.tuning_plan("tiny", 3, 4, tmp_path, arms=("baseline",), jobs=2)
    assert plan["left"] == {"baseline": 1} and plan["per_trial"] == {"baseline": 40 / 2 * 4} and plan["seconds"] == 80 / 2
    assert not T.needs_confirmation(plan) and T.needs_confirmation({**plan, "seconds": T.CONFIRM_SECONDS + 1})
    lines = T.plan_lines(plan)
    assert lines[1] == "Trials left: baseline 1 of 3." and lines[2].startswith("Estimate: about 40 s with 2 processes") and "this storage's trials" in lines[2]
    both = T.tuning_plan("tiny", 3, 4, tmp_path)   # the other arm has no stored time: no estimate, so it asks
    assert both["seconds"] is None and T.needs_confirmation(both) and "Estimate: none" in T.plan_lines(both)[2]


def test_ctrl_c_says_the_interrupted_trials_are_retried(tmp_path, monkeypatch, capsys):
    def interrupted(*a, **k): raise KeyboardInterrupt
    monkeypatch.setattr(T, "tune", interrupted)
    assert cli.main(["tune", "dcml", "--results", str(tmp_path), "--yes"]) == 130
    err = capsys.readouterr().err
    assert err == f"dml-book: interrupted; {cli.INTERRUPTED['tune']}\n" and "retried with their settings" in err
