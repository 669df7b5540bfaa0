"""Every registered method trains two steps by name on the built-in glyphs, through `dml-book train`'s entry point, with
the method's own defaults: a method without presets is covered as well as one with them (tests/test_preset_smoke.py runs
the presets). The names are read from the registry, so a method added later is covered without touching this file."""
import json, math
import pytest
import dml_book.methods  # noqa: F401  (fills METHODS)
from dml_book.registry import METHODS
from dml_book.cli import main
from dml_book.methods.base import declared_activity, log_frames

GLYPHS = {"size": 16, "per_font": 1}   # the built-in glyphs at a quarter of the pixels and half the images


@pytest.mark.parametrize("method", METHODS.names())
def test_every_registered_method_trains_two_steps_by_name(method, tmp_path, one_thread):
    out = tmp_path/"run"
    assert main(["train", "--method", method, "--dataset", "glyphs", "--dataset-kwargs", json.dumps(GLYPHS), "--epochs", "1",
                 "--max-steps-per-epoch", "2", "--ks", "1", "--device", "cpu", "--num-workers", "0", "--no-umap", "--no-progress",
                 "--out", str(out)]) == 0
    metrics = json.loads((out/"metrics.json").read_text())
    assert metrics["config"]["method"] == method and metrics["config"]["method_kwargs"] == {}   # by name, its defaults
    steps = [json.loads(l) for l in (out/"log.jsonl").read_text().splitlines() if json.loads(l)["kind"] == "step"]
    assert [s["step"] for s in steps] == [1, 2] and all(math.isfinite(s["loss"]) for s in steps)
    assert 0 <= metrics["final"]["R@1"] <= 1
    records = [json.loads(l) for l in (out/"log.jsonl").read_text().splitlines()]
    assert metrics["mechanism"] == declared_activity(METHODS.get(method), *log_frames(records), metrics["config"])   # what the log says
    mech = metrics["mechanism"]
    if method in ("hdml", "ala", "dcml", "pads", "dmml"): assert {"criterion", "value", "threshold", "active"} <= set(mech)
    else: assert mech is None   # the baseline and the episode baseline declare no mechanism
    if method == "hdml": assert mech["parts"][0]["value"] == 0.0 and not mech["active"]   # w = 1 until J_gen's first window (64 steps)
    if method == "pads": assert mech["value"] == 0.0 and not mech["active"]   # no policy step in 2 iterations (one every 30): p = p_0
    if method == "dmml": assert (mech["value"], mech["active"]) == (5.0, True)   # n_support's default
    if method == "dcml": assert math.isfinite(mech["value"])   # the compositors' weights were logged


def test_a_resumed_run_records_the_criterion_of_its_whole_log(tmp_path, one_thread):
    "Started again on its finished checkpoint, a run rewrites metrics.json with the criterion of the history it restored."
    from dml_book.train import Trainer, TrainConfig
    cfg = TrainConfig(dataset="glyphs", dataset_kwargs=GLYPHS, method="dcml", epochs=2, max_steps_per_epoch=2, eval_every=2, ks=(1,), device="cpu",
                      num_workers=0, umap=False, progress=False, out=str(tmp_path/"run"))
    Trainer(cfg).fit()
    first = json.loads((tmp_path/"run"/"metrics.json").read_text())["mechanism"]
    (tmp_path/"run"/"metrics.json").unlink()
    Trainer(cfg).fit()   # resumes at epoch 2 of 2: no step taken, the epoch records come from the checkpoint
    assert first["value"] is not None and json.loads((tmp_path/"run"/"metrics.json").read_text())["mechanism"] == first


@pytest.mark.parametrize("method", ["ala", "hdml", "dcml", "pads", "dmml"])
def test_every_method_trains_switched_off_by_name_and_fails_its_criterion(method, tmp_path, one_thread):
    "`--method-kwargs '{\"mechanism_off\": true}'` (the protocol's switch) trains by name; the run reads the mechanism's fixed value and is not at work."
    from dml_book.methods.base import MECHANISM_SWITCH, has_switch, against_null, null_record, switched_off
    assert has_switch(METHODS.get(method)) and MECHANISM_SWITCH == "mechanism_off"
    out = tmp_path/"run"
    assert main(["train", "--method", method, "--dataset", "glyphs", "--dataset-kwargs", json.dumps(GLYPHS), "--epochs", "1",
                 "--max-steps-per-epoch", "2", "--ks", "1", "--device", "cpu", "--num-workers", "0", "--no-umap", "--no-progress",
                 "--method-kwargs", json.dumps(switched_off({})), "--out", str(out)]) == 0
    mech = json.loads((out/"metrics.json").read_text())["mechanism"]
    fixed = {"dcml": 0.0, "pads": 0.0, "dmml": 1.0}   # uniform compositors: no selection; p = p_0: KL 0; one support image
    if method in fixed: assert mech["value"] == fixed[method]
    if method == "hdml": assert mech["parts"][0]["value"] == 0.0   # J_metric = J(T): 1 - w = 0
    if method == "ala": mech = against_null(mech, null_record("assessor frozen at initialisation", [mech["value"]]))   # its own draw
    assert mech["active"] is False
