"""The readers of the stored studies check what they read (issue 72, item 7): a metric out of [0, 1], a configuration
without its seed, a garbled `study.json`, `study_time.json` or `run.json`, a mechanism record that disagrees with its own
value and threshold, NaN taken for met or feasible, a table that lost a column, null minutes in `cost.json`, and a FIFO
in place of any of these files: each is one `FileError` naming the file (or, for NaN, never counted), and no read blocks."""
import contextlib, io, json, os
from pathlib import Path
import numpy as np, pandas as pd, pytest
from dml_book.files import FileError

R1 = {"baseline": [0.50, 0.52, 0.51], "hdml": [0.47, 0.50, 0.48]}


pytestmark = pytest.mark.usefixtures("no_hang")   # a blocking read fails after 30 s (tests/conftest.py)


def run(folder: Path, seed: int, r1: float, method: str = "baseline", mechanism=None):
    "A stored run as the trainer writes it: metrics.json (config, environment, final, epochs) and run.json."
    folder.mkdir(parents=True, exist_ok=True)
    m = dict(config=dict(method=method, dataset="glyphs_xl", loss="triplet", seed=seed, epochs=2, method_kwargs={}), environment={},
             untrained={"R@1": 0.05}, final={"R@1": r1, "NMI": 0.8}, run=dict(steps_per_epoch=10, precision="fp32"),
             epochs=[dict(epoch=1, kind="epoch", **{"R@1": r1 - 0.1, "val_R@1": 0.6}), dict(epoch=2, kind="epoch", **{"R@1": r1, "val_R@1": 0.7})])
    if mechanism is not None: m["mechanism"] = mechanism
    (folder/"metrics.json").write_text(json.dumps(m))
    (folder/"run.json").write_text(json.dumps(dict(cpu_seconds=60.0, wall_seconds=61.0, device="cpu", gpu=None, threads=1)))


def study(root: Path, name: str = "hdml") -> Path:
    "A stored study of two arms and three paired seeds, with its design and its time."
    folder = root/name
    for arm, values in R1.items():
        for s, v in enumerate(values): run(folder/arm/f"seed{s}", s, v, arm)
    (folder/"study.json").write_text(json.dumps(dict(name=name, baseline="baseline", main=["hdml"], primary={"metric": "R@1", "stage": "final"},
                                                     arms={"baseline": {"label": "baseline", "differs": {}}, "hdml": {"label": "HDML", "differs": {}}})))
    (folder/"study_time.json").write_text(json.dumps(dict(cpu_seconds=360.0, runs=6, devices=["cpu"])))
    return folder


def fifo(path: Path):
    path.unlink(missing_ok=True); os.mkfifo(path)


def test_a_well_formed_study_reads(tmp_path):
    from dml_book.study import study_report
    rep = study_report("hdml", tmp_path) if study(tmp_path) else None
    assert len(rep["verdicts"]) == 1 and rep["facts"]["seeds"] == {"baseline": 3, "hdml": 3} and rep["facts"]["wall_seconds"] == 366.0


def test_findings_refuses_a_seed_whose_recall_is_out_of_range(tmp_path):
    "A seed's R@1 of 5.0 (500 points) never reaches a verdict: `findings` reads runs through `study.py`, which refuses the file."
    from dml_book.findings import finding
    folder = study(tmp_path); run(folder/"hdml"/"seed1", 1, 5.0, "hdml")
    with pytest.raises(FileError, match=r"hdml/seed1/metrics.json: final R@1=5.0 is out of range") as e: finding("hdml", root=tmp_path)
    assert "\n" not in str(e.value)
    run(folder/"hdml"/"seed1", 1, 0.5, "hdml")
    f = folder/"hdml"/"seed1"/"metrics.json"; m = json.loads(f.read_text()); m["epochs"][0]["val_R@1"] = -3.0; f.write_text(json.dumps(m))
    with pytest.raises(FileError, match=r"epoch 1 val_R@1=-3.0 is out of range"): finding("hdml", root=tmp_path)


def test_a_config_without_its_seed_is_one_line(tmp_path):
    from dml_book.study import study_report
    folder = study(tmp_path); f = folder/"baseline"/"seed2"/"metrics.json"
    m = json.loads(f.read_text()); del m["config"]["seed"]; f.write_text(json.dumps(m))
    with pytest.raises(FileError, match=r"seed2/metrics.json \(its config\) lacks the key 'seed'"): study_report("hdml", tmp_path)


@pytest.mark.parametrize("name", ["study.json", "study_time.json", "hdml/seed0/run.json", "hdml/seed0/metrics.json"])
def test_a_garbled_record_is_one_line_naming_it(tmp_path, name):
    from dml_book.study import study_report
    folder = study(tmp_path); (folder/name).write_text('{"baseline": ')
    with pytest.raises(FileError, match=rf"{name} is not valid JSON"): study_report("hdml", tmp_path)


@pytest.mark.parametrize("name", ["study.json", "study_time.json", "hdml/seed0/run.json", "hdml/seed0/metrics.json"])
def test_a_fifo_in_place_of_a_record_is_refused_without_blocking(tmp_path, name):
    from dml_book.findings import finding
    folder = study(tmp_path); fifo(folder/name)
    with pytest.raises(FileError, match=rf"{name} is not a regular file"): finding("hdml", root=tmp_path)


def test_records_of_the_wrong_shape_are_one_line(tmp_path):
    from dml_book.study import study_report
    folder = study(tmp_path); (folder/"study.json").write_text(json.dumps(dict(baseline="baseline", arms={"hdml": {"differs": {}}})))
    with pytest.raises(FileError, match=r"study.json: arms=.* is invalid"): study_report("hdml", tmp_path)
    study(tmp_path); (folder/"study_time.json").write_text(json.dumps(dict(cpu_seconds="an hour")))
    with pytest.raises(FileError, match=r"study_time.json: cpu_seconds='an hour' is invalid"): study_report("hdml", tmp_path)
    study(tmp_path); (folder/"hdml"/"seed0"/"run.json").write_text(json.dumps(dict(wall_seconds=-5.0)))
    with pytest.raises(FileError, match=r"run.json: wall_seconds=-5.0 is invalid"): study_report("hdml", tmp_path)


MECH = dict(criterion="synthetic weight", value=0.05, threshold=0.1, active=True)   # under its threshold, yet says active


def test_a_mechanism_record_that_disagrees_with_its_value_is_not_counted_as_met(tmp_path):
    from dml_book.study import mechanism_table, check_mechanism
    for s in range(3): run(tmp_path/"hdml"/f"seed{s}", s, 0.5, "hdml", mechanism={**MECH, "value": 0.2})
    assert mechanism_table(tmp_path, "hdml", logs=False).active.tolist() == [True] * 3
    run(tmp_path/"hdml"/"seed1", 1, 0.5, "hdml", mechanism=MECH)
    with pytest.raises(FileError, match=r"seed1/metrics.json: its mechanism record says active: true .* against its threshold 0.1"):
        mechanism_table(tmp_path, "hdml", logs=False)
    part = lambda v, a: dict(criterion="p", value=v, threshold=0.1, active=a)
    ok = dict(criterion="p and q", value=0.2, threshold=0.1, active=True, parts=[part(0.2, True), part(0.3, True)])
    assert check_mechanism(ok, "x", "fix") is ok
    with pytest.raises(FileError, match="its parts say otherwise"): check_mechanism({**ok, "parts": [part(0.2, True), part(0.05, False)]}, "x", "fix")
    with pytest.raises(FileError, match="disagrees with itself"): check_mechanism({**MECH, "value": None}, "x", "fix")   # no value is never met


def test_selection_refuses_an_inconsistent_mechanism_record(tmp_path):
    from types import SimpleNamespace
    from dml_book.selection import selection_frame, selection_folder
    t = SimpleNamespace(study=SimpleNamespace(name="toy", baseline="baseline", arms={"m": SimpleNamespace(epochs=30)}), constrained=("m",))
    trials = pd.DataFrame(dict(number=[0], state="COMPLETE", val_R1=[0.6], counted=True, feasible=[True], criterion_value=[0.2], params=[json.dumps({"lr_head": 1e-3})]))
    for s in (0, 1):
        out = selection_folder(tmp_path, t, "m")/"trial0"/f"seed{s}"; out.mkdir(parents=True)
        (out/"metrics.json").write_text(json.dumps({"final": {"val_R@1": 0.7}, "mechanism": MECH if s else {**MECH, "value": 0.2}}))
    with pytest.raises(FileError, match=r"trial0/seed1/metrics.json: its mechanism record says active: true"): selection_frame(t, "m", tmp_path, trials)


def test_nan_is_never_met_nor_feasible():
    from dml_book.selection import pick, candidates
    frame = pd.DataFrame(dict(candidate=[3, 1], seeds=2, diverged=0, short_val_R1=[70.0, 65.0], val_R1=[80.0, 75.0], active=[float("nan"), True]))
    assert pick(frame, 2).picked.tolist() == [False, True]   # the NaN criterion (truthy) is not taken for a held one
    trials = pd.DataFrame(dict(number=range(4), state="COMPLETE", val_R1=[0.9, 0.8, 0.7, 0.6], counted=True,
                               feasible=[float("nan"), True, True, True], criterion_value=[0.5, float("nan"), 0.4, 0.3], params="{}"))
    assert candidates(trials, 3, constrained=True).number.tolist() == [2, 3]   # no recorded feasibility, a NaN criterion: no candidate
    assert candidates(trials, 3).number.tolist() == [2, 3]   # the trials record feasibility: the arm is a constrained one
    assert candidates(trials.assign(feasible=float("nan")), 3).number.tolist() == [0, 1, 2]   # an arm searched without a criterion


def _active_store(tmp_path):
    "A results store holding what `show_active('dcml')` reads of the baseline arm: its selection.csv and device.csv."
    from dml_book.selection import active_tuning, selection_folder
    t = active_tuning("dcml"); arm = selection_folder(tmp_path, t, "baseline").parent; arm.mkdir(parents=True)
    p = json.dumps(t.first("baseline"))
    pd.DataFrame(dict(candidate=[0, 1], epochs=30, seeds=2, diverged=0, short_val_R1=[80.0, 79.0], val_R1=[81.0, 82.0], criterion=None,
                      criterion_value=float("nan"), active=None, params=p, picked=[False, True])).to_csv(arm/"selection.csv", index=False)
    pd.DataFrame(dict(number=[0, 1, 2], device="cuda", val_R1=[0.8, 0.79, 0.7], rerun_device="cpu", rerun_val_R1=[0.81, 0.8, 0.6], params=p)).to_csv(arm/"device.csv", index=False)
    return t, arm


def _show(tmp_path):
    from dml_book.selection import show_active
    with contextlib.redirect_stdout(io.StringIO()) as said: show_active("dcml", tmp_path)
    return said.getvalue()


def test_show_active_reads_its_tables_and_cost_checked(tmp_path):
    t, arm = _active_store(tmp_path)
    assert "Spearman's rho 1.00" in _show(tmp_path)
    cost = tmp_path/"dcml"/"tuned-active"/"cost.json"; cost.parent.mkdir(parents=True)
    cost.write_text(json.dumps(dict(tuning={"cpu": 54.5}, selection={"cpu": 29.2}, runs=dict(tuning=40, selection=12))))
    assert "84 CPU-minutes in all" in _show(tmp_path)
    cost.write_text(json.dumps(dict(tuning={"cpu": None}, runs=dict(tuning=40))))   # null minutes: TypeError before
    with pytest.raises(FileError, match=r"cost.json: tuning=\{'cpu': None\} is invalid: expected \{device: minutes >= 0\}"): _show(tmp_path)
    fifo(cost)
    with pytest.raises(FileError, match="cost.json is not a regular file"): _show(tmp_path)


@pytest.mark.parametrize("table,column", [("selection.csv", "picked"), ("selection.csv", "params"), ("device.csv", "rerun_val_R1"), ("device.csv", "device")])
def test_a_table_missing_a_column_is_one_line(tmp_path, table, column):
    t, arm = _active_store(tmp_path)
    pd.read_csv(arm/table).drop(columns=column).to_csv(arm/table, index=False)
    with pytest.raises(FileError, match=rf"{table} lacks the column\(s\) {column}"): _show(tmp_path)


@pytest.mark.parametrize("table", ["selection.csv", "device.csv"])
def test_a_fifo_in_place_of_a_table_is_refused_without_blocking(tmp_path, table):
    t, arm = _active_store(tmp_path); fifo(arm/table)
    with pytest.raises(FileError, match=rf"{table} is not a regular file"): _show(tmp_path)


def test_a_selection_with_two_picks_or_a_pick_whose_criterion_failed_is_refused(tmp_path):
    from dml_book.selection import picked_values, read_selection
    t, arm = _active_store(tmp_path); f = arm/"selection.csv"
    assert picked_values(t, "baseline", tmp_path) == t.first("baseline")
    pd.read_csv(f).assign(picked=True).to_csv(f, index=False)
    with pytest.raises(FileError, match="marks 2 candidates as picked"): picked_values(t, "baseline", tmp_path)
    pd.read_csv(f).assign(picked=[False, True], active=[True, False]).to_csv(f, index=False)
    with pytest.raises(FileError, match=r"its pick's criterion did not hold"): read_selection(f)


def test_trials_are_read_checked(tmp_path):
    from dml_book.tuning_report import read_trials
    arm = tmp_path/"dcml"/"tuning"/"baseline"; arm.mkdir(parents=True); f = arm/"trials.csv"
    good = pd.DataFrame(dict(number=[0, 1], state=["COMPLETE", "FAIL"], val_R1=[0.8, float("nan")], params="{}", counted=[True, False]))
    good.to_csv(f, index=False); assert len(read_trials(tmp_path, "dcml")) == 2
    good.drop(columns="params").to_csv(f, index=False)
    with pytest.raises(FileError, match=r"trials.csv lacks the column\(s\) params"): read_trials(tmp_path, "dcml")
    good.assign(val_R1=[8.0, float("nan")]).to_csv(f, index=False)
    with pytest.raises(FileError, match=r"row 1, val_R1=8.0 is invalid"): read_trials(tmp_path, "dcml")
    good.assign(counted=True).to_csv(f, index=False)
    with pytest.raises(FileError, match=r"trial 1 counts but records no validation R@1"): read_trials(tmp_path, "dcml")
    fifo(f)
    with pytest.raises(FileError, match="trials.csv is not a regular file"): read_trials(tmp_path, "dcml")


def test_a_table_of_published_figures_is_read_checked(tmp_path):
    from dml_book.results import read_published
    f = tmp_path/"pub.csv"
    f.write_text("dataset,method,metric,value,source\ncub200,hdml,R@1,53.7,CVPR 2019 Table 1\n")
    assert read_published(f).value.tolist() == [53.7]
    f.write_bytes(b"\x00\xff\xfe binary"); pytest.raises(FileError, read_published, f)
    fifo(f)
    with pytest.raises(FileError, match="pub.csv is not a regular file"): read_published(f)
