"""A book that reads without a build: the cells tagged `results` keep their outputs in the committed notebooks (each
method chapter's results and every experiment page with a figure), those outputs are what a fresh execution gives from
the stored results, and every other cell is clean (tools/saved_outputs.py; `make readme` writes them)."""
import json, re, sys
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


def _table(*values):
    "A pandas-style residual table as a fresh execution prints it."
    return "   relative difference\n" + "".join(f"{i}  {v:>19.6e}\n" for i, v in enumerate(values))


def test_a_number_that_moves_only_its_last_bits_reads_the_same():
    "Another CPU's summation order or BLAS kernel moves the last bits of a float64: the same reading, saved or fresh."
    x = 0.7224440894568690
    assert so.same_text(f"R@1 {x!r}", f"R@1 {x*(1 + 4e-16)!r}")              # 16 digits printed, the last ones moved
    assert so.same_text("loss 1.4142135623730951", "loss 1.4142135623730950")
    # residuals at rounding level move by their whole size: the cell's stated absolute bound reads them as one
    saved, fresh = _table(4.560519e-17, 1.651797e-10), _table(0.0, 1.40e-10)
    assert not so.same_text(saved, fresh)                                        # no bound stated: a change
    assert so.same_text(saved, fresh, atol=1e-6)
    assert so.same_text("a   0.5\nb 1.0", "a 0.5\nb     1.0")                    # padding is layout, not a reading


def test_a_changed_result_fails_within_the_tolerance():
    "A saved number perturbed beyond the tolerance, a changed digit of a short print, or changed words: all differ."
    assert not so.same_text("R@1 0.812", "R@1 0.813")
    assert not so.same_text("R@1 0.7224440894568690", "R@1 0.7224440964568690")   # moved by 1e-8 relative: past RTOL, a result
    assert not so.same_text(_table(4.56e-17, 1.65e-10), _table(4.56e-17, 2.0e-6), atol=1e-6)   # past the stated bound
    assert not so.same_text("better (p = 0.01)", "worse (p = 0.01)")
    assert not so.same_text("seeds 5", "seeds 5 6")                             # a number more is a change
    assert not so.same_text("nan", "0.0") and so.same_text("nan", "nan")


def test_a_cells_tolerance_is_stated_in_its_tags_and_checked():
    cell = lambda *tags: {"cell_type": "code", "metadata": {"tags": ["results", *tags]}}
    assert so.tolerance(cell()) == {"atol": 0.0, "rtol": so.RTOL}
    assert so.tolerance(cell("atol=1e-12")) == {"atol": 1e-12, "rtol": so.RTOL}
    with pytest.raises(SystemExit, match="states no number"): so.tolerance(cell("atol=small"))
    with pytest.raises(SystemExit, match=">= 0"): so.tolerance(cell("rtol=-1"))
    out = lambda v: [{"output_type": "stream", "name": "stdout", "text": f"largest relative difference {v:.1e}\n"}]
    assert so.same_outputs(so.comparable(out(2.6e-16)), so.comparable(out(1.9e-16)), **so.tolerance(cell("atol=1e-12")))
    assert not so.same_outputs(so.comparable(out(2.6e-16)), so.comparable(out(1.9e-16)), **so.tolerance(cell()))


def test_every_cell_that_prints_residuals_states_its_bound():
    "A tagged cell that prints relative differences at rounding level must state the bound it asserts, or another CPU fails it."
    for nb in so.notebooks():
        for c in json.loads(nb.read_text())["cells"]:
            if not so.is_tagged(c) or "relative difference" not in "".join(c["source"]): continue
            printed = "".join(t for _, t in so.comparable(c.get("outputs", [])))
            if re.search(r"e-(1[0-9]|0[7-9])\b", printed):
                assert so.tolerance(c)["atol"] > 0, f"{nb.relative_to(ROOT)}: cell {c['id']} prints residuals; tag it atol=<the bound it asserts>"
