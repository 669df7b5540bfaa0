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
    assert {Path(n).name for n in shipped} <= {"study.json", "study_time.json", "metrics.json", "run.json", "diverged.json", "infeasible.json",
                                               "plan.json", "deviations.json", "deviations_before_plans.json"}   # and the certified plans with their records
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


def _small_tree(root: Path, outside: Path) -> Path:
    "A source tree as a clone's, its results/ one study with every summary findings() reads, and links into `outside`."
    tree = root/"tree"
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"): (tree/name).parent.mkdir(parents=True, exist_ok=True); (tree/name).write_bytes((ROOT/name).read_bytes())
    import shutil
    shutil.copytree(ROOT/"dml_book", tree/"dml_book", ignore=shutil.ignore_patterns("__pycache__", "_results", "_experiments"))
    for src in ("nbs/experiments", "params"): shutil.copytree(ROOT/src, tree/src, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    study = tree/"results"/"toy"
    files = {"study.json": "{}", "study_time.json": "{}", "baseline/seed0/metrics.json": "{}", "baseline/seed0/run.json": "{}",
             "toy/seed0/diverged.json": "{}", "tuning/toy-active/infeasible.json": "{}", "certified/plan.json": "{}",
             "baseline/seed0/log.jsonl": "", "baseline/seed0/checkpoint.pt": ""}
    for rel, text in files.items(): (study/rel).parent.mkdir(parents=True, exist_ok=True); (study/rel).write_text(text)
    outside.mkdir(); (outside/"metrics.json").write_text('{"outside-the-tree-7f3a": 1}'); (outside/"seed0").mkdir(); (outside/"seed0"/"metrics.json").write_text('{"outside-the-tree-7f3a": 2}')
    (study/"toy"/"seed1").mkdir(); (study/"toy"/"seed1"/"metrics.json").symlink_to(outside/"metrics.json")   # a linked file
    (study/"linked").symlink_to(outside)   # a linked folder
    return tree


def test_the_wheel_built_from_the_sdist_ships_every_summary_and_no_linked_file(tmp_path):
    """`python -m build` as the release workflow runs it (the sdist, then the wheel from the sdist): both carry every file
    findings() reads (diverged.json, infeasible.json and plan.json included) and no file reached through a link."""
    tree = _small_tree(tmp_path, tmp_path/"outside")
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o", str(tmp_path/"dist"), str(tree)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    import tarfile
    sdist, = (tmp_path/"dist").glob("dml_book-*.tar.gz"); wheel, = (tmp_path/"dist").glob("dml_book-*.whl")
    in_sdist = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if n.count("/") and n.split("/", 1)[1].startswith("results/")}
    in_wheel = {n[len("dml_book/_results/"):] for n in zipfile.ZipFile(wheel).namelist() if n.startswith("dml_book/_results/")}
    want = {"toy/study.json", "toy/study_time.json", "toy/baseline/seed0/metrics.json", "toy/baseline/seed0/run.json",
            "toy/toy/seed0/diverged.json", "toy/tuning/toy-active/infeasible.json", "toy/certified/plan.json"}
    assert {f for f in in_sdist if "." in Path(f).name} == {f"results/{w}" for w in want}, in_sdist
    assert in_wheel == want, in_wheel
    z = zipfile.ZipFile(wheel)
    assert not [n for n in z.namelist() if b"outside-the-tree-7f3a" in z.read(n)]   # nothing of the links' targets
