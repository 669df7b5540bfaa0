"""A book that reads without a build: the cells tagged `results` keep their outputs in the committed notebooks (each
method chapter's results and every experiment page with a figure), those outputs are what a fresh execution gives from
the stored results, and every other cell is clean (tools/saved_outputs.py; `make readme` writes them)."""
import json, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/"tools"))
import saved_outputs as so


def _figures(cell) -> int:
    return sum(1 for o in cell.get("outputs", []) for m in o.get("data", {}) if m.startswith("image/"))


def test_comparable_ignores_what_changes_between_executions_and_nothing_else():
    out = lambda t: [{"output_type": "execute_result", "data": {"text/plain": t}, "metadata": {}, "execution_count": 3}]
    assert so.comparable(out("<Axes at 0x7f3a>  \n")) == so.comparable(out("<Axes at 0x1c2b>"))
    assert so.comparable(out("R@1 0.812")) != so.comparable(out("R@1 0.813"))
    assert so.comparable(out("PosixPath('/work/ci/main/results/dcml')")) == so.comparable(out("PosixPath('/home/me/dml_book/results/dcml')"))
    assert so.comparable(out("results/dcml")) != so.comparable(out("results/hdml"))   # a path's meaningful part still counts
    png = lambda b: [{"output_type": "display_data", "data": {"image/png": b, "text/plain": "<Figure>"}, "metadata": {}}]
    assert so.comparable(png("AAAA")) == so.comparable(png("BBBB")) != so.comparable([])
    assert so.comparable([{"output_type": "stream", "name": "stdout", "text": ["a\n", "b\n"]}]) == [("stdout", "a\nb")]
    one, two = {"output_type": "stream", "name": "stdout", "text": "a\nb\n"}, [{"output_type": "stream", "name": "stdout", "text": t} for t in ("a\n", "b\n")]
    assert so.comparable([one]) == so.comparable(two)   # the kernel's flushes split a cell's prints at random


def test_only_tagged_cells_keep_outputs_and_every_tagged_cell_has_some():
    for nb in so.notebooks():
        for c in json.loads(nb.read_text())["cells"]:
            if c["cell_type"] != "code": continue
            rel = nb.relative_to(ROOT)
            if so.is_tagged(c):
                assert c["outputs"], f"{rel}: tagged cell {c['id']} has no saved output: run `make readme`"
                assert not any(o["output_type"] == "error" for o in c["outputs"]), (rel, c["id"])
            else: assert not c.get("outputs"), f"{rel}: cell {c['id']} keeps outputs but is not tagged '{so.TAG}'"


def _tables(cell) -> int:
    return sum(1 for o in cell.get("outputs", []) if "text/html" in o.get("data", {}) and "<table" in "".join(o["data"]["text/html"]))


def test_each_base_chapter_a_reader_needs_shows_a_figure_or_a_table():
    "The figures chapter, the data, sampler, loss, metric and training chapters keep a figure or a small table on a repository viewer."
    assert {"09_viz", "01_data.builtin", "02_samplers", "04_losses.base", "06_metrics", "08_train"} <= set(so.BASE_CHAPTERS)
    for name in so.BASE_CHAPTERS:
        cells = [c for c in json.loads((so.NBS/f"{name}.ipynb").read_text())["cells"] if so.is_tagged(c)]
        assert sum(_figures(c) + _tables(c) for c in cells), f"nbs/{name}.ipynb: no saved figure or table (tag the cell 'results', then make readme)"


def test_each_method_chapter_and_experiment_page_holds_a_saved_figure():
    pages = [so.NBS/f"{c}.ipynb" for c in so.METHOD_CHAPTERS] + sorted((so.NBS/"experiments").glob("*.ipynb"))
    for nb in pages:
        cells = [c for c in json.loads(nb.read_text())["cells"] if so.is_tagged(c)]
        assert sum(map(_figures, cells)), f"{nb.relative_to(ROOT)}: no saved figure"


@pytest.mark.slow
def test_saved_outputs_equal_a_fresh_execution():
    "The preview `make test` builds is a fresh execution of every notebook; the saved outputs must be what it shows."
    so.build_preview()
    found = so.problems()
    assert not found, "\n".join(found[:10]) + "\nrun `make readme` and commit the notebooks"
