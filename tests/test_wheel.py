"The built wheel is enough to run an experiment: notebooks, params and published figures ship inside the package."
import json, os, subprocess, sys, zipfile
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    "The wheel built from this tree (no build isolation: no download), unpacked with pip into a folder of its own."
    d = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(d/"whl"), str(ROOT)],
                   check=True, capture_output=True, cwd=d)
    wheel, = (d/"whl").glob("dml_book-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(d/"site"), str(wheel)],
                   check=True, capture_output=True)
    return wheel, d/"site"


def test_wheel_ships_experiments_params_and_published_figures(installed):
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for nb in (ROOT/"nbs"/"experiments").glob("*.ipynb"):
        if not nb.name.startswith("_"): assert f"dml_book/_experiments/{nb.name}" in names
    for p in (ROOT/"params").glob("*.yaml"): assert f"dml_book/_experiments/params/{p.name}" in names
    for c in (ROOT/"nbs"/"experiments"/"published").glob("*.csv"): assert f"dml_book/_experiments/published/{c.name}" in names
    assert "dml_book/inference.py" in names and "dml_book/cli.py" in names


@pytest.mark.slow
def test_installed_wheel_runs_an_experiment_outside_a_clone(installed, tmp_path):
    "From an empty folder, with only the installed copy importable, `dml-book experiment train_eval` runs."
    _, site = installed
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    where = subprocess.run([sys.executable, "-c", "import dml_book, dml_book.results as r; print(dml_book.__file__); print(r.experiments_dir())"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout.split()
    assert where[0].startswith(str(site)) and where[1] == str(site/"dml_book"/"_experiments"), where
    r = subprocess.run([sys.executable, "-m", "dml_book.cli", "experiment", "train_eval", "--no-progress", "-p", "epochs", "1",
                        "-p", "max_steps_per_epoch", "2", "-p", "seeds", "[0]", "-p", "projection", "None"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    executed = tmp_path/"runs"/"experiments"/"train_eval"/"train_eval.ipynb"
    meta = json.loads(executed.read_text())["metadata"]["papermill"]
    assert meta["input_path"] == str(site/"dml_book"/"_experiments"/"train_eval.ipynb")   # the wheel's own notebook
    assert list((tmp_path/"runs").rglob("metrics.json"))


def test_wheel_ships_the_studies_summaries_and_no_logs(installed):
    "Each study.json and each run's metrics.json (and run.json) under dml_book/_results; no logs, checkpoints or data records."
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n[len("dml_book/_results/"):] for n in names if n.startswith("dml_book/_results/")}
    for f in [*(ROOT/"results").rglob("study.json"), *(ROOT/"results").rglob("metrics.json"), *(ROOT/"results").rglob("infeasible.json")]:
        assert str(f.relative_to(ROOT/"results")) in shipped, f
    assert {Path(n).name for n in shipped} <= {"study.json", "study_time.json", "metrics.json", "run.json", "diverged.json", "infeasible.json"}
    assert wheel.stat().st_size < 8 << 20, wheel.stat().st_size   # the summaries are small; checkpoints and logs would not be


def test_installed_wheel_reports_the_five_verdicts_outside_a_clone(installed, tmp_path):
    "From an empty folder, with only the installed copy importable, `dml_book.findings` reports what the clone's results/ give."
    _, site = installed
    from dml_book.findings import findings, verdict_cell
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    code = ("import json, dml_book.findings as f, dml_book.results as r, dml_book.study as s\n"
            "print(json.dumps(dict(where=str(r.results_dir()), found=f.findings().to_dict('records'),"
            " hdml=s.study_report('hdml')['verdicts'], cells=[f.verdict_cell(m) for m in ('ala', 'hdml', 'dcml', 'pads', 'dmml')])))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got["where"] == str(site/"dml_book"/"_results")
    assert got["found"] == findings(root=ROOT/"results").to_dict("records")
    assert got["cells"] == [verdict_cell(m, ROOT/"results") for m in ("ala", "hdml", "dcml", "pads", "dmml")]   # the README's, searches that kept no setting at work included
    assert {f["method"] for f in got["found"] if f["regime"] == "from scratch"} == {"ala", "hdml", "dcml", "pads", "dmml"}
    assert len(got["hdml"]) >= 4 and all(v.startswith("On glyphs-XL") for v in got["hdml"])


def test_the_release_workflows_wheel_check_passes_on_the_installed_wheel(installed, tmp_path):
    "tools/wheel_check.py, as release.yml runs it: from an empty folder, the installed copy against the clone's results/."
    _, site = installed
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, str(ROOT/"tools"/"wheel_check.py"), str(ROOT/"results")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"the installed dml_book ({site/'dml_book'}) reports the clone's" in r.stdout
    inside = subprocess.run([sys.executable, str(ROOT/"tools"/"wheel_check.py"), str(ROOT/"results")], capture_output=True, text=True,
                            env={**env, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert inside.returncode != 0 and "imported from the clone" in inside.stderr   # the clone's own package proves nothing
