"""Selection, decision and swaps under faults (issue 72, item 4): killed (SIGKILL) or interrupted (Ctrl-C) and run again,
they end with the same numbers as an uninterrupted run, each run counted once; a full disk leaves every earlier file
whole and says so in one line. All on tiny settings in temporary folders."""
import errno, json, os, shutil, signal, subprocess, sys, time
from dataclasses import replace
from pathlib import Path
import pandas as pd, pytest
from dml_book import tune as T
from dml_book.files import FileError
from test_tune_active import dmml_tuning
from test_tune import TINY

HERE = Path(__file__).resolve().parent
ARM = ("dmml",)


def _select(t, root):
    from dml_book.selection import run_selection, write_selection, study_cost
    run_selection(t, ARM, str(root), log=lambda s: None)
    return write_selection(t, "dmml", str(root)), study_cost(t, str(root))


def _runs(root: Path) -> dict:
    "Each candidate run's final validation R@1, by its folder."
    sel = root/"tiny"/"tuning"/"dmml"/"selection"
    return {str(f.parent.relative_to(sel)): json.loads(f.read_text())["final"]["val_R@1"] for f in sorted(sel.glob("trial*/seed*/metrics.json"))}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    "A tiny constrained tuning (3 trials), and its selection run without a fault: the reference."
    base = tmp_path_factory.mktemp("tuned")
    t = dmml_tuning(trials=3)
    T.tune(t, str(base/"store"), arms=ARM)
    shutil.copytree(base/"store", base/"whole")
    frame, cost = _select(t, base/"whole")
    assert len(frame) >= 1 and cost["runs"]["selection"] == 2 * len(frame)
    return t, base


SCRIPT = """import os, signal, sys; sys.path.insert(0, {here!r})
signal.signal(signal.SIGINT, signal.default_int_handler)   # Ctrl-C as a terminal gives it, even where this test runs with SIGINT ignored (a background job)
import dml_book.train as train
from test_tune_active import dmml_tuning
from dml_book.selection import run_selection
write = train.write_checkpoint
def write_then_stop(state, path):   # the fault, at a fixed place whatever the machine's load: right after the first candidate's first checkpoint
    write(state, path)
    if path.name == "checkpoint.pt": os.kill(os.getpid(), {sig})
train.write_checkpoint = write_then_stop
run_selection(dmml_tuning(trials=3), ("dmml",), {root!r}, log=lambda s: None)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill -9", "Ctrl-C"])
def test_a_selection_stopped_part_way_resumes_to_the_same_numbers(tuned, tmp_path, sig):
    t, base = tuned
    shutil.copytree(base/"store", tmp_path/"s"); root = tmp_path/"s"
    sel = root/"tiny"/"tuning"/"dmml"/"selection"
    p = subprocess.run([sys.executable, "-c", SCRIPT.format(here=str(HERE), root=str(root), sig=int(sig))], env=dict(os.environ, OMP_NUM_THREADS="1"),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, timeout=300)
    assert p.returncode != 0 and list(sel.glob("trial*/seed*/checkpoint.pt"))   # stopped inside the first candidate's training, not finished
    frame, cost = _select(t, root)
    whole = pd.read_csv(base/"whole"/"tiny"/"tuning"/"dmml"/"selection.csv")
    assert (root/"tiny"/"tuning"/"dmml"/"selection.csv").read_text() == (base/"whole"/"tiny"/"tuning"/"dmml"/"selection.csv").read_text()
    assert _runs(root) == _runs(base/"whole") and frame.picked.tolist() == whole.picked.tolist()
    assert cost["runs"]["selection"] == 2 * len(frame)   # each candidate run counted once


def test_a_run_killed_between_its_record_and_its_run_json_trains_again_and_counts_once(tuned, tmp_path):
    "The last window of a run: `metrics.json` written, `run.json` (its time, the sign it finished) not yet. It is no finished run."
    from dml_book.selection import run_selection
    t, base = tuned
    shutil.copytree(base/"whole", tmp_path/"s"); root = tmp_path/"s"
    gone = sorted((root/"tiny"/"tuning"/"dmml"/"selection").glob("trial*/seed1/run.json"))[0]; gone.unlink()
    assert run_selection(t, ARM, str(root), log=lambda s: None) == 1   # that run, and only it, trains again
    frame, cost = _select(t, root)
    assert gone.is_file() and _runs(root) == _runs(base/"whole") and cost["runs"]["selection"] == 2 * len(frame)


def test_a_decision_run_without_its_run_json_trains_again(tmp_path, one_thread):
    "run_study (the decision, the swaps): a seed whose run.json is missing is trained again in place, not taken as finished nor moved aside."
    from dml_book.study_design import Study, run_study
    s = Study("d", {"baseline": TINY, "other": replace(TINY, lr_head=2e-3)}, {"other": ("lr_head", "run.lr")})
    seeds = {"baseline": [0, 1], "other": [0, 1]}
    first = run_study(s, tmp_path, jobs=1, seeds=seeds, log=lambda m: None)
    (tmp_path/"d"/"other"/"seed1"/"run.json").unlink()
    again = run_study(s, tmp_path, jobs=1, seeds=seeds, log=lambda m: None)
    assert (tmp_path/"d"/"other"/"seed1"/"run.json").is_file() and not list((tmp_path/"d"/"other").glob("stale-*"))
    assert again.value.tolist() == first.value.tolist()
    assert json.loads((tmp_path/"d"/"study_time.json").read_text())["runs"] == 4


def _swap_store(tmp_path):
    "A decided study at hand-written picks (two paired seeds of each arm), as `test_tune_active` builds one."
    from dataclasses import asdict
    from dml_book.selection import active_tuning, active_study, selection_folder
    from dml_book.files import make_folder, write_json
    t = active_tuning("pads")
    for arm in t.spaces:
        f = selection_folder(tmp_path, t, arm).with_name("selection.csv"); f.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([dict(candidate=0, picked=True, params=json.dumps(t.first(arm)))]).to_csv(f, index=False)
    s = active_study(t, tmp_path)
    for arm in s.arms:
        for k in (0, 1):
            out = make_folder(tmp_path/s.name/arm/f"seed{k}", tmp_path)
            write_json(out/"metrics.json", {"config": asdict(replace(s.arms[arm], seed=k, out=str(out))), "final": {"R@1": 0.5}})
            write_json(out/"run.json", {"cpu_seconds": 60.0, "device": "cpu"})
            (out/"log.jsonl").write_text('{"kind": "step"}\n' * 100)
    return t, s


@pytest.mark.parametrize("fault", ["Ctrl-C", "full disk"])
def test_the_swaps_copy_whole_seeds_or_none_and_a_second_call_finishes(tmp_path, monkeypatch, fault):
    import dml_book.study_design as SD
    from dml_book.selection import decide_swaps
    t, s = _swap_store(tmp_path)
    monkeypatch.setattr(SD, "run_study", lambda study, results, jobs, seeds, log: pd.DataFrame(dict(variant=[], x=[])))
    real, calls = shutil.copyfile, []
    def copy(src, dst, **kw):   # the third file copied (copytree's copy2 calls copyfile): interrupted, or the disk full
        calls.append(src)
        if len(calls) == 3:
            if fault == "Ctrl-C": raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, **kw)
    monkeypatch.setattr(shutil, "copyfile", copy)
    with pytest.raises(KeyboardInterrupt if fault == "Ctrl-C" else FileError) as e: decide_swaps(t, tmp_path)
    if fault == "full disk": assert "no space was left on the device" in str(e.value) and "\n" not in str(e.value)
    swap = tmp_path/"pads"/"tuned-active-swap"
    for d in swap.glob("*/seed*"):   # what is there is whole: a seed is copied entirely or not at all
        assert sorted(p.name for p in d.iterdir()) == sorted(p.name for p in (tmp_path/s.name/d.parent.name/d.name).iterdir())
    assert not list(swap.glob("*/.seed*"))   # no half copy left behind
    monkeypatch.setattr(shutil, "copyfile", real)
    decide_swaps(t, tmp_path)
    for arm in s.arms:
        for k in (0, 1):
            for f in (tmp_path/s.name/arm/f"seed{k}").iterdir():
                assert (swap/arm/f"seed{k}"/f.name).read_bytes() == f.read_bytes()


@pytest.fixture
def small_disk(tmp_path):
    "A 1 MiB tmpfs (root only; elsewhere the test is skipped, and the simulated full disk above stands in)."
    d = tmp_path/"disk"; d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True)
    if r.returncode: pytest.skip("cannot mount a tmpfs here (needs root)")
    yield d
    subprocess.run(["umount", str(d)], check=True)


def test_a_full_disk_leaves_the_stored_selection_and_cost_whole_and_says_so(tuned, small_disk):
    from dml_book.selection import write_selection, study_cost, write_infeasible
    t, base = tuned
    shutil.copytree(base/"whole", small_disk/"s", ignore=shutil.ignore_patterns("optuna.db*", "*.pt", "log.jsonl")); root = small_disk/"s"
    sel, cost = root/"tiny"/"tuning"/"dmml"/"selection.csv", root/"tiny"/"tuned-active"/"cost.json"
    before = {f: f.read_bytes() for f in (sel, cost)}
    seed = sorted((root/"tiny"/"tuning"/"dmml"/"selection").glob("trial*/seed1"))[0]   # something new to write (an unchanged file is not rewritten):
    shutil.rmtree(seed)   # the selection loses a seed, the cost its minutes
    fd = os.open(small_disk/"filler", os.O_WRONLY | os.O_CREAT)   # fill the disk to the last byte (unbuffered)
    for size in (65536, 512, 1):
        try:
            while True: os.write(fd, b"\0" * size)
        except OSError as e: assert e.errno == errno.ENOSPC
    os.close(fd)
    for write in (lambda: write_selection(t, "dmml", str(root)), lambda: study_cost(t, str(root))):
        with pytest.raises(FileError, match="no space was left on the device") as e: write()
        assert "\n" not in str(e.value)
    assert {f: f.read_bytes() for f in (sel, cost)} == before   # the earlier files, whole
    assert not [p for p in root.rglob(".*.tmp")]   # no temporary file left


def test_a_page_reading_a_bad_record_shows_one_line(tmp_path):
    "A notebook (a real kernel, as Jupyter, Quarto and papermill run the pages) reading a record that is not JSON: its error output is one line naming the file, no traceback."
    import nbformat
    from nbclient import NotebookClient
    (tmp_path/"metrics.json").write_text("{not json")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"from dml_book.files import read_json\nread_json({str(tmp_path/'metrics.json')!r}, {{}}, 'run it again')")])
    NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=120, resources={"metadata": {"path": str(tmp_path)}}).execute()
    [out] = nb.cells[0].outputs
    assert out.output_type == "error" and out.ename == "FileError", out
    assert len(out.traceback) == 1 and "\n" not in out.traceback[0], out.traceback
    assert out.traceback[0].startswith("FileError: ") and "metrics.json" in out.traceback[0] and "Traceback" not in out.traceback[0], out.traceback


WARN = """
import torch, dml_book.cli as C
from dml_book.losses.triplet import {loss}
def command(args):   # a command whose batch the loss cannot use: one class only, no negative
    {loss}()(torch.randn(4, 8), torch.zeros(4, dtype=torch.long)); return 0
C.list_command = command
raise SystemExit(C.main(["list"]))
"""

def test_the_command_line_shows_a_batch_the_loss_cannot_use_in_one_line():
    "A loss's `UnusableBatchWarning` reaches the user of `dml-book` as one line `dml-book: warning: ...`, not Python's two lines with a file and source."
    from dml_book.losses.triplet import TripletLoss
    r = subprocess.run([sys.executable, "-c", WARN.format(loss=TripletLoss.__name__)], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dml-book: warning: TripletLoss: "), r.stderr
    assert "pytorch-metric-learning" in lines[0] and "UnusableBatchWarning" not in lines[0] and ".py:" not in lines[0], r.stderr


DECIDE = """import sys; sys.path.insert(0, {here!r})
from dataclasses import replace
from test_tune_active import dmml_tuning
import dml_book.selection as S, dml_book.cli as C
t = dmml_tuning(trials=3); t = replace(t, study=replace(t.study, main=("dmml",)))
S.active_tuning = lambda *a, **k: t   # the tiny study in place of DMML's own (the command line names only the book's studies)
raise SystemExit(C.main(["tune", "dmml", "--active", "--decide", "--yes", "--trials", "3", "--epochs", "1", "--results", {root!r}]))
"""

def _decide(root: Path, **kw):
    return subprocess.Popen([sys.executable, "-c", DECIDE.format(here=str(HERE), root=str(root))], env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

def _decided(root: Path) -> dict:
    "Each decision run's final metrics, by its folder."
    d = root/"tiny"/"tuned-active"
    return {str(f.parent.relative_to(d)): json.loads(f.read_text())["final"] for f in sorted(d.glob("*/seed*/metrics.json"))}


@pytest.mark.slow
def test_the_command_lines_decision_killed_part_way_resumes_to_the_same_numbers(tmp_path):
    "`dml-book tune <m> --active --decide` killed (kill -9) inside a decision run, then the same command: the numbers of an uninterrupted run, each run counted once in cost.json."
    T.tune(dmml_tuning(trials=3), str(tmp_path/"whole"), log=lambda s: None)   # the trials: the command finds them done
    p = _decide(tmp_path/"whole"); out = p.communicate(timeout=300)[0]
    assert p.returncode == 0, out
    shutil.copytree(tmp_path/"whole", tmp_path/"s", ignore=lambda d, names: ["tuned-active"] if Path(d).name == "tiny" else [])
    dec = tmp_path/"s"/"tiny"/"tuned-active"
    p = _decide(tmp_path/"s", start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline and not (
                len(list(dec.glob("*/seed*/run.json"))) >= 2 and [c for c in dec.glob("*/seed*/checkpoint.pt") if not (c.parent/"run.json").exists()]):
            time.sleep(0.02)
        os.killpg(p.pid, signal.SIGKILL)   # inside a decision run, two finished before it
    finally: p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL, p.communicate()[0]   # killed, not finished
    again = _decide(tmp_path/"s"); out = again.communicate(timeout=300)[0]
    assert again.returncode == 0, out
    whole = json.loads((tmp_path/"whole"/"tiny"/"tuned-active"/"cost.json").read_text())
    cost = json.loads((dec/"cost.json").read_text())
    assert _decided(tmp_path/"s") == _decided(tmp_path/"whole") and len(_decided(tmp_path/"s")) == whole["runs"]["decision"]
    assert cost["runs"] == whole["runs"], (cost, whole)   # each run counted once: the killed one too
