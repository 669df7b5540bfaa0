"`dml-book` answers --help, usage errors and bad paths without importing torch (seconds to import), and checks output names first."
import subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*argv):
    "Run `main(argv)` in a fresh interpreter; its exit code, stderr, and whether torch was imported."
    code = ("import sys; from dml_book.cli import main\n"
            f"try: rc = main({list(argv)!r})\nexcept SystemExit as e: rc = e.code\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    flag, rc = r.stdout.split()[-2:]
    return int(rc), r.stderr, flag == "TORCH"


def test_help_and_usage_errors_import_no_torch():
    for argv in (["--help"], ["search", "--help"], ["embed", "--help"], ["nope"], ["evaluate"]):
        rc, err, torch_loaded = run_cli(*argv)
        assert not torch_loaded, argv
        assert rc == (0 if "--help" in argv else 2), (argv, rc, err)


def test_bad_paths_and_output_names_fail_at_once(tmp_path):
    img = tmp_path/"a.png"; img.write_bytes(b"")
    run = tmp_path/"run"; run.mkdir()
    (tmp_path/"adir.npz").mkdir(); ix = tmp_path/"ix"; ix.mkdir(); (ix/"index.json").write_text("{}")
    for argv, msg in [(["evaluate", str(tmp_path/"nope")], "run folder"),
                      (["embed", str(run), str(img), "--out", str(tmp_path/"x.csv")], "x.csv: the output must end in .npz or .npy"),
                      (["embed", str(run), str(img), "--out", str(tmp_path/"adir.npz")], "adir.npz is a folder, not a file"),
                      (["search", str(ix), str(img), "--gallery-figure", "hits.txt"], "hits.txt: the output must end in .png"),
                      (["embed", str(run), str(tmp_path/"missing.png"), "--out", str(tmp_path/"x.npz")], "missing.png does not exist"),
                      (["index", str(tmp_path/"nope"), str(img), "--out", str(tmp_path/"ix")], "run folder"),
                      (["search", str(run), str(img)], "is not an index folder"),
                      (["search", str(run), str(img), "--gallery-figure", "hits.txt"], "is not an index folder")]:
        rc, err, torch_loaded = run_cli(*argv)
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert not torch_loaded, argv


def test_train_shows_no_progress_bars_in_a_redirected_log(tmp_path):
    "Progress bars by default on a terminal only: stdout to a file or a pipe gets the results table and no bar frames."
    r = subprocess.run([sys.executable, "-m", "dml_book.cli", "train", "--dataset", "digits", "--epochs", "2",
                        "--max-steps-per-epoch", "3", "--no-umap", "--out", str(tmp_path/"run")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "untrained" in r.stdout and "%" not in r.stdout and "\r" not in r.stdout, r.stdout
    import json
    assert json.loads((tmp_path/"run"/"metrics.json").read_text())["config"]["progress"] is False


def test_usage_errors_are_one_line():
    "argparse's usage errors as every other error: `dml-book: error: ...`, one line, exit 2 (before: usage lines, then the error)."
    for argv, fragment in [(["nope"], "argument command: invalid choice: 'nope'"), ([], "the following arguments are required: command"),
                           (["evaluate"], "the following arguments are required: run_dir"),
                           (["search", "ix", "q.png", "-k", "0"], "argument -k: must be a positive integer, not '0'"),
                           (["embed", "run", "x", "--out", "e.npz", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
                           (["tune", "ala", "--jobs", "x" * 5000], "argument --jobs")]:
        rc, err, torch_loaded = run_cli(*argv)
        assert rc == 2 and err.startswith("dml-book: error: ") and err.count("\n") == 1 and fragment in err, (argv, err)
        assert "usage:" not in err and len(err) <= 2001 and not torch_loaded, (argv, err)
