"""Every registered method trains two steps by name on the built-in glyphs, through `dml-book train`'s entry point, with
the method's own defaults: a method without presets is covered as well as one with them (tests/test_preset_smoke.py runs
the presets). The names are read from the registry, so a method added later is covered without touching this file."""
import json, math
import pytest
import dml_book.methods  # noqa: F401  (fills METHODS)
from dml_book.registry import METHODS
from dml_book.cli import main

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
