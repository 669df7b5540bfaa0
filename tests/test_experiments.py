"""Experiment notebooks: their shape (one `parameters` cell, nothing exported), their runs under papermill with the
defaults (done by tools/preview.py through `dml-book experiment`, reused here when the sources have not changed),
the JSON and figures each run leaves, the published figures and the GPU parameter files."""
import json, math, subprocess, sys
from pathlib import Path
import nbformat, pytest, yaml

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT/"nbs"/"experiments").glob("*.ipynb"))
NAMES = [p.stem for p in EXPERIMENTS]
PREVIEW = ROOT/"_preview"


@pytest.fixture(scope="session")
def runs():
    "The folder of the experiments' default runs: tools/preview.py builds it (or finds it up to date)."
    subprocess.run([sys.executable, str(ROOT/"tools"/"preview.py"), "--if-stale", "--out", str(PREVIEW)], check=True, cwd=ROOT)
    return PREVIEW/"runs"


def test_there_is_a_generic_notebook_and_one_per_method():
    assert set(NAMES) >= {"train_eval", "ala", "hdml", "dcml", "pads", "dmml"}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=NAMES)
def test_notebook_has_one_parameters_cell_and_exports_nothing(path):
    nb = nbformat.read(str(path), as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged parameters"
    assert all("#| export" not in c.source and "default_exp" not in c.source for c in nb.cells)
    from dml_book.results import notebook_parameters
    declared = notebook_parameters(path)
    assert "out_dir" in declared and "seeds" in declared
    for line in tagged[0].source.splitlines():   # flat, typed, commented
        if line.strip() and not line.startswith(("#", "from typing import")): assert ":" in line.split("=")[0] and "#" in line, line


@pytest.mark.parametrize("path", EXPERIMENTS, ids=NAMES)
def test_papermill_sees_every_documented_parameter(path):
    "papermill's inspection (what `-p` is checked against) lists each parameter of the cell, with its default and comment."
    import ast, papermill as pm
    from dml_book.results import notebook_parameters
    declared, seen = notebook_parameters(path), pm.inspect_notebook(str(path))
    assert list(seen) == list(declared), f"papermill misses {sorted(set(declared) - set(seen))}"
    for name, d in declared.items():
        assert ast.literal_eval(seen[name]["default"]) == d["default"], name
        assert seen[name]["help"] == d["help"] and d["help"], name
        kind = seen[name]["inferred_type_name"]
        assert kind.replace("Optional[", "").rstrip("]") == d["inferred_type_name"].replace(" | None", ""), (name, kind)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if n != "pretrain"])   # pretrain trains no metric-learning run: below
def test_default_run_leaves_json_figures_and_the_executed_notebook(runs, name):
    out = runs/name
    executed = nbformat.read(str(out/f"{name}.ipynb"), as_version=4)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    metrics = sorted(out.rglob("metrics.json"))
    assert metrics, f"no runs in {out}"
    for m in metrics:
        run = json.loads(m.read_text())
        assert {"config", "environment", "untrained", "final", "epochs"} <= set(run)
        assert run["environment"]["torch"] and "selected" in run, m
        for stage in (run["final"], run["selected"]["test"], run["selected"]["validation"]):
            assert stage and all(math.isfinite(v) for v in stage.values()), (m, stage)
        assert run["selected"]["epoch"] in [r["epoch"] for r in run["epochs"]]
        assert (m.parent/"log.jsonl").exists() and (m.parent/"checkpoint.pt").exists()
    figures = ["learning_curves.png"] + (["projection.png", "gallery.png"] if name == "train_eval" else ["comparison.png"])
    for f in figures:
        data = (out/f).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, f
    import pandas as pd
    summary = pd.read_csv(out/"summary.csv")
    assert (summary["stage"] == "selected").all() and summary["mean"].map(math.isfinite).all()
    if name != "train_eval":   # built-in data: no row of the paper stands beside these runs
        assert pd.read_csv(out/"comparison.csv").empty


@pytest.mark.slow
def test_pretrain_run_leaves_its_record_zero_shot_metrics_and_figures(runs):
    "The pretraining experiment: per seed a record (curve, accuracies, zero-shot metrics of the backbone and of a random one), two figures."
    import pandas as pd
    out = runs/"pretrain"
    executed = nbformat.read(str(out/"pretrain.ipynb"), as_version=4)
    assert not [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    rec = json.loads((out/"seed0"/"record.json").read_text())
    assert {"config", "curve", "epochs", "zero_shot", "zero_shot_random", "weights"} <= set(rec)
    assert rec["curve"] and all(math.isfinite(c["loss"]) for c in rec["curve"])
    for key in ("zero_shot", "zero_shot_random"): assert 0 <= rec[key]["R@1"] <= rec[key]["R@8"] <= 1, rec[key]
    summary = pd.read_csv(out/"summary.csv")
    assert summary.zero_shot_R1.tolist() == [rec["zero_shot"]["R@1"]]
    for f in ("training_curve.png", "zero_shot.png"): assert (out/f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_aggregate_over_seeds_matches_the_runs(runs):
    "The generic notebook runs two seeds: the summary's mean and std are those of the two metrics.json files."
    import numpy as np, pandas as pd
    from dml_book.results import runs_frame, summarize
    folders = sorted((runs/"train_eval").glob("*/seed*/metrics.json"))
    assert len(folders) == 2
    r1 = [json.loads(f.read_text())["selected"]["test"]["R@1"] for f in folders]
    row = summarize(runs_frame(runs/"train_eval"), metrics=["R@1"]).iloc[0]
    assert row["n"] == 2 and row["mean"] == pytest.approx(np.mean(r1)) and row["std"] == pytest.approx(np.std(r1, ddof=1))
    saved = pd.read_csv(runs/"train_eval"/"summary.csv")
    assert saved[saved.metric == "R@1"]["mean"].iloc[0] == pytest.approx(np.mean(r1))


def test_published_figures_have_a_source_on_every_row():
    from dml_book.results import read_published
    files = sorted((ROOT/"nbs"/"experiments"/"published").glob("*.csv"))
    assert files
    for f in files:
        df = read_published(f)
        assert f.stem in NAMES and len(df) and df.source.str.len().min() > 20


@pytest.mark.parametrize("path", sorted((ROOT/"params").glob("*.yaml")), ids=lambda p: p.name)
def test_parameter_files_name_only_parameters_of_their_notebook(path):
    from dml_book.results import notebook_parameters, coerce_parameters
    name = "train_eval" if path.stem.startswith("train_eval") else path.stem.split("_")[0]
    declared = notebook_parameters(ROOT/"nbs"/"experiments"/f"{name}.ipynb")
    given = yaml.safe_load(path.read_text())
    coerce_parameters(declared, given)   # raises on a name the notebook does not declare
    assert given.get("device") == "cuda" and given.get("data_root")
    if "variants" in given:
        src = "\n".join(c.source for c in nbformat.read(str(ROOT/"nbs"/"experiments"/f"{name}.ipynb"), as_version=4).cells)
        from dml_book.registry import METHODS
        import dml_book.methods  # noqa: F401
        if name in METHODS:   # a protocol may take its ablations from the method (DCML.ablations)
            src += "".join(f'"{a}"' for a in getattr(METHODS.get(name), "ablations", {}))
        for v in given["variants"]: assert f'"{v}"' in src, f"{path.name}: variant {v} is not in {name}.ipynb's protocol"


@pytest.mark.slow
def test_run_grid_launches_each_run_under_torchrun(tmp_path):
    "nproc_per_node=2: the run trains in two processes (torchrun), logs every step once and lands in the results store."
    from dml_book.results import ExperimentError, run_grid
    from dml_book.train import TrainConfig
    cfg = TrainConfig(dataset="digits", embedding_dim=8, batch_size=8, m_per_class=4, epochs=1, max_steps_per_epoch=3)
    df = run_grid({"baseline": cfg}, seeds=[3], out_dir=tmp_path, nproc_per_node=2)
    run = json.loads((tmp_path/"baseline"/"seed3"/"metrics.json").read_text())
    assert run["environment"]["world_size"] == 2 and run["config"]["seed"] == 3
    log = [json.loads(l) for l in (tmp_path/"baseline"/"seed3"/"log.jsonl").read_text().splitlines()]
    assert [l["step"] for l in log if l["kind"] == "step"] == [1, 2, 3]
    assert set(df.variant) == {"baseline"} and df.value.map(math.isfinite).all()
    with pytest.raises(ExperimentError, match="exited with") as e:   # a failing run: its own error, in the output tail
        run_grid({"bad": TrainConfig(dataset="digits", batch_size=64, m_per_class=8)}, out_dir=tmp_path, nproc_per_node=2)
    assert "a batch of 64 x 2 process(es) with m_per_class=8 needs 16 classes but the labels have only 5; set --batch-size" in str(e.value)


def test_dmml_experiment_reports_reid_metrics_on_the_market1501_layout(tmp_path):
    "On re-identification data the DMML experiment reports mAP and CMC@k (the paper's Tables 1-4), not Recall@K."
    import pandas as pd
    from dml_book.data.replicas import write_market
    write_market(tmp_path/"data", train_ids=tuple(range(2, 30, 2)), test_ids=(1, 3, 5, 7, 9))
    out = tmp_path/"exp"
    params = dict(dataset="market1501", data_root=str(tmp_path/"data"), dataset_kwargs={}, image_size=64, epochs=1,   # 64 x 32 pixels
                  max_steps_per_epoch=2, variants=["baseline", "dmml-no-margin"], taus=[0.2], out_dir=str(out))
    import papermill as pm
    pm.execute_notebook(str(ROOT/"nbs"/"experiments"/"dmml.ipynb"), str(tmp_path/"dmml.ipynb"), parameters=params,
                        kernel_name="python3", progress_bar=False, cwd=str(ROOT))
    summary = pd.read_csv(out/"summary.csv")
    assert set(summary.metric) >= {"mAP", "CMC@1", "CMC@5", "CMC@10"} and "R@1" not in set(summary.metric)
    assert set(summary.variant) == {"baseline", "dmml-no-margin", "dmml-tau0.2"} and summary["mean"].between(0, 1).all()
    from dml_book.methods.dmml import DMML
    loss = {v: DMML(**json.loads((out/v/"seed0"/"metrics.json").read_text())["config"]["method_kwargs"]).loss
            for v in ("dmml-no-margin", "dmml-tau0.2")}
    assert (loss["dmml-no-margin"].variant, loss["dmml-no-margin"].margin) == ("none", 0.4)   # Table 4, w/o Margin
    assert (loss["dmml-tau0.2"].variant, loss["dmml-tau0.2"].margin) == ("negative", 0.2)    # Table 4, tau = 0.2
    comparison = pd.read_csv(out/"comparison.csv", dtype=str)   # each variant beside the paper row of its role (Tables 3-4)
    assert list(comparison.columns) == ["role", "ours", "paper", "table", "ours mAP", "paper mAP", "ours CMC@1", "paper CMC@1"]
    assert comparison[["role", "ours", "paper", "table", "paper mAP", "paper CMC@1"]].values.tolist() == [
        ["baseline", "baseline", "Triplet", "Table 3", "76.2", "89.6"],
        ["ablation", "dmml-no-margin", "DMML w/o Margin", "Table 4", "80.8", "91.7"],
        ["ablation", "dmml-tau0.2", "DMML (tau=0.2)", "Table 4", "80.6", "92.0"]]
    for f in ("learning_curves.png", "comparison.png"): assert (out/f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _step_losses(log: Path) -> list[dict]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("kind") == "step"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ala", "hdml", "dcml", "pads", "dmml"])
def test_each_smoke_variant_trains_otherwise_than_the_baseline(runs, name):
    "At the default (smoke) length each variant's per-step loss departs from the baseline's: the method acts within the run."
    from dml_book.results import notebook_parameters
    variants = notebook_parameters(ROOT/"nbs"/"experiments"/f"{name}.ipynb")["variants"]["default"]
    steps = {v: _step_losses(runs/name/v/"seed0"/"log.jsonl") for v in variants}
    base = [s["loss"] for s in steps["baseline"]]
    assert len(base) >= 10 and all(math.isfinite(l) for l in base)
    for v in variants:
        if v == "baseline": continue
        losses = [s["loss"] for s in steps[v]]
        assert len(losses) == len(base), (v, len(losses), len(base))
        assert max(abs(a - b) for a, b in zip(losses, base)) > 1e-4, f"{name}: {v} trains exactly as the baseline in the smoke run"
        if name == "hdml":   # the synthetic tuples entered the metric loss (eq. 11's weight of the real ones fell below 1)
            assert min(s["weight"] for s in steps[v]) < 1, f"hdml: {v} never weighted a synthetic tuple"


def test_dml_book_experiment_shows_the_reader_no_kernel_transport_warning(tmp_path):
    "papermill's kernel gets CurveZMQ keys (dml_book.results.encrypted_kernel_manager): ipykernel's plain-TCP warning never reaches the terminal."
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell('out_dir: str = "runs"', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("from pathlib import Path\nPath(out_dir, 'ran.txt').write_text('yes')")]
    nbformat.write(nb, str(tmp_path/"tiny.ipynb"))
    r = subprocess.run([sys.executable, "-m", "dml_book.cli", "experiment", str(tmp_path/"tiny.ipynb"), "--no-progress", "--out-dir", str(tmp_path/"out")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path/"out"/"ran.txt").read_text() == "yes"   # the kernel ran the notebook, over the encrypted channel
    assert "without encryption" not in r.stderr + r.stdout and "WARNING" not in r.stderr, r.stderr

def test_a_notebook_without_a_kernelspec_runs_as_python_and_a_missing_out_dir_says_how_to_declare_it(tmp_path):
    "A notebook saved without metadata (as a script-built one) runs on the Python kernel; one with a plain `out_dir = ...` line is told what a parameter is."
    from dml_book.results import run_experiment, notebook_language, ExperimentError
    nb = nbformat.v4.new_notebook()   # no kernelspec, no language_info
    nb.cells = [nbformat.v4.new_code_cell('out_dir: str = "runs"', metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("from pathlib import Path\nPath(out_dir, 'ran.txt').write_text('yes')")]
    nbformat.write(nb, str(tmp_path/"bare.ipynb"))
    assert notebook_language(tmp_path/"bare.ipynb", "python3") == "python"
    with pytest.raises(ExperimentError, match="names no language .* kernel 'ir' is not Python"): notebook_language(tmp_path/"bare.ipynb", "ir")
    run_experiment(str(tmp_path/"bare.ipynb"), out_dir=str(tmp_path/"out"), progress=False)
    assert (tmp_path/"out"/"ran.txt").read_text() == "yes"
    nb.cells[0] = nbformat.v4.new_code_cell('out_dir = "runs"', metadata={"tags": ["parameters"]})
    nbformat.write(nb, str(tmp_path/"plain.ipynb"))
    with pytest.raises(ExperimentError, match=r"declares no out_dir parameter \(a parameter is an annotated line"): run_experiment(str(tmp_path/"plain.ipynb"))
