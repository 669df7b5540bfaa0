"""The navigation is generated from the chapters (tools/navigation.py, run by `make readme`): the committed sidebar and
methods table are what the chapters give, and a new method is one notebook plus what `nbdev-export` and `make readme`
generate, checked on a copy of the tree with a toy chapter added."""
import json, os, shutil, subprocess, sys
from pathlib import Path
import pytest, yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT/"tools"))
import navigation as nav


def _cell(kind, text, id):
    c = {"cell_type": kind, "id": id, "metadata": {}, "source": text.splitlines(keepends=True)}
    return c if kind == "markdown" else {**c, "execution_count": None, "outputs": []}

TOY = '''class Toy(Method):
    "Toy method: the configured loss on every valid tuple, whatever the miner."
    def tuples(self, trainer, embeddings, labels): return None'''

def write_toy(nbs: Path, name="toy", registered=None, number="25"):
    "A method chapter as a newcomer writes it: title, summary, module, imports, one registered class."
    cells = [_cell("markdown", f"# Toy: a method in one notebook\n> Every valid tuple | no miner.", "c0"),
             _cell("code", f"#| default_exp methods.{name}", "c1"),
             _cell("code", "#| export\nfrom dml_book.methods.base import Method\nfrom dml_book.registry import METHODS", "c2"),
             _cell("code", f'#| export\n@METHODS.register("{registered or name}")\n{TOY}', "c3")]
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = nbs/f"{number}_methods.{name}.ipynb"
    path.write_text(json.dumps(nb, indent=1) + "\n")
    return path


def _copy_nbs(tmp_path) -> Path:
    shutil.copytree(ROOT/"nbs", tmp_path/"nbs", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return tmp_path/"nbs"


def test_committed_navigation_is_what_the_chapters_give():
    assert nav.stale() == [], "nbs/sidebar.yml or the methods table of nbs/index.ipynb is stale: run `make readme` and commit"


def test_every_method_chapter_is_a_row_and_every_chapter_is_in_the_sidebar():
    chs, exps = nav.chapters()
    rows = nav.methods_table().splitlines()[2:]
    methods = nav.method_chapters(chs)
    own = [c.module.split(".", 1)[1] for c in methods]
    assert own == ["ala", "hdml", "dcml", "pads", "dmml"]   # the policy chapter is no method
    assert all(o in c.methods for o, c in zip(own, methods))   # each registers its own name (DMML also its episode baseline)
    assert [r.split("](")[1].split(")")[0] for r in rows] == [c.page for c in methods]
    assert rows[0].startswith("| [ALA](methods.ala.html) | adaptive learnable assessment | An LSTM assessor")
    assert all(r.endswith(f"| [experiment](experiments/{o}.html) |") for r, o in zip(rows, own))   # each linked to its studies
    first = nav.first_table().splitlines()[2:]   # the first screen: each method in chapter order, from scratch then pretrained
    assert [r.split("](")[0] for r in first] == [f"| [{o.upper()}" for o in own for _ in range(2)]
    assert [r.split(" | ")[1] for r in first] == ["from scratch", "pretrained"] * len(own)
    entries = nav.sidebar().split("contents:")[-1]
    assert entries.index("experiments/train_eval.ipynb") < entries.index("experiments/ala.ipynb")   # generic first


def test_a_toy_chapter_enters_the_sidebar_and_the_methods_table(tmp_path):
    nbs = _copy_nbs(tmp_path)
    write_toy(nbs)
    (nbs/"experiments"/"toy.ipynb").write_text((nbs/"experiments"/"pads.ipynb").read_text()
                                               .replace("# PADS: the protocol", "# Toy: the protocol"))
    nav.main(["--nbs", str(nbs)])
    assert nav.stale(nbs) == []
    side = yaml.safe_load((nbs/"sidebar.yml").read_text())["website"]["sidebar"]["contents"]
    sections = {s["section"]: s["contents"] for s in side if isinstance(s, dict)}
    assert sections["The methods"][-2:] == ["24_methods.dmml.ipynb", "25_methods.toy.ipynb"]
    assert sections["Experiments"][-2:] == ["experiments/pads.ipynb", "experiments/toy.ipynb"]
    index = "".join(next(c["source"] for c in json.loads((nbs/"index.ipynb").read_text())["cells"] if c.get("id") == nav.TABLE_ID))
    assert index.splitlines()[-1] == r"| [Toy](methods.toy.html) | a method in one notebook | Every valid tuple \| no miner. | [experiment](experiments/toy.html) |"
    first = "".join(next(c["source"] for c in json.loads((nbs/"index.ipynb").read_text())["cells"] if c.get("id") == nav.FIRST_ID))
    assert first.splitlines()[-1] == "| [TOY](methods.toy.html) | pretrained | not yet measured | not yet measured |"
    lines = "".join(next(c["source"] for c in json.loads((nbs/"what_we_found.ipynb").read_text())["cells"] if c.get("id") == nav.LINES_ID))
    assert lines.splitlines()[-1] == "| [Toy](methods.toy.html) | no study stored |"
    assert "| [Toy](nbs/25_methods.toy.ipynb) |" in (tmp_path/"README.md").read_text()   # the README, its links from the root


def test_a_chapter_that_breaks_the_naming_rule_is_named_with_the_fix(tmp_path):
    nbs = _copy_nbs(tmp_path)
    write_toy(nbs, "toy", registered="toy_method")
    with pytest.raises(nav.NavigationError) as e: nav.sidebar(nbs)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("nbs/25_methods.toy.ipynb registers method 'toy_method'")
    assert "must equal the chapter's module name" in msg and "@METHODS.register('toy')" in msg
    r = subprocess.run([sys.executable, str(ROOT/"tools"/"navigation.py"), "--nbs", str(nbs)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip() == f"navigation: error: {msg}"


def test_a_chapter_without_title_or_summary_is_named(tmp_path):
    nbs = _copy_nbs(tmp_path)
    p = write_toy(nbs)
    nb = json.loads(p.read_text()); nb["cells"][0]["source"] = ["# Toy\n"]; p.write_text(json.dumps(nb))
    with pytest.raises(nav.NavigationError, match=r"nbs/25_methods.toy.ipynb: its first cell must be markdown that opens"):
        nav.methods_table(nbs)


def test_a_method_is_one_notebook_plus_generated_files(tmp_path):
    """On a copy of the tree: the toy chapter, `nbdev-export` and tools/navigation.py change nothing but the
    chapter and generated files, and `dml-book list methods` and the registry know the method."""
    for name in ("nbs", "dml_book"): shutil.copytree(ROOT/name, tmp_path/name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    for name in ("pyproject.toml", "README.md"): shutil.copy(ROOT/name, tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    write_toy(tmp_path/"nbs")
    subprocess.run([BIN/"nbdev-export"], cwd=tmp_path, check=True, capture_output=True)
    subprocess.run([sys.executable, str(ROOT/"tools"/"navigation.py"), "--nbs", str(tmp_path/"nbs")], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(tmp_path)})   # sidebar, home page and README.md
    after = {p for p in tmp_path.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    changed = sorted(str(p.relative_to(tmp_path)) for p in after if before.get(p) != p.read_bytes())
    assert changed == ["README.md", "dml_book/_modidx.py", "dml_book/methods/toy.py", "nbs/25_methods.toy.ipynb",
                       "nbs/index.ipynb", "nbs/sidebar.yml", "nbs/what_we_found.ipynb"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "dml_book.cli", "list", "methods"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "  toy       Toy method: the configured loss on every valid tuple, whatever the miner." in r.stdout.splitlines()


def test_readme_opens_with_the_project_the_first_table_the_figure_and_the_two_commands():
    "The first screen (60 lines): what the project is, the first table (its ten rows), the forest plot, `make demo` and `make test`."
    head = (ROOT/"README.md").read_text().splitlines()[:60]
    text = "\n".join(head)
    assert head[0] == "# dml_book" and "deep metric learning" in head[1]
    assert [l for l in head if l.startswith("| [")][:10] == nav.notebook_links(nav.first_table()).splitlines()[2:]
    assert "make demo" in text and "make test" in text
    png = nav.forest_png((ROOT/"nbs"/"index.ipynb").read_text())
    if png is not None:   # saved by tools/saved_outputs.py; README shows the same bytes
        assert f"](nbs/{nav.FIGURE.as_posix()})" in text and (ROOT/"nbs"/nav.FIGURE).read_bytes() == png


def test_the_readme_shows_the_saved_figure_and_not_its_code(tmp_path):
    "A home page whose figure cell has a saved PNG: README.md links the file navigation writes, with those bytes; no code of the cell."
    import base64
    nbs = _copy_nbs(tmp_path)
    nb = json.loads((nbs/"index.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c.get("id") == nav.FIGURE_ID)
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    cell["outputs"] = [{"output_type": "display_data", "metadata": {}, "data": {"image/png": base64.b64encode(png).decode(), "text/plain": ["<Figure>"]}}]
    (nbs/"index.ipynb").write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    nav.main(["--nbs", str(nbs)])
    assert (nbs/nav.FIGURE).read_bytes() == png and nav.stale(nbs) == []
    readme = (tmp_path/"README.md").read_text()
    assert f"![Every line of the table above with its 95% interval](nbs/{nav.FIGURE.as_posix()})" in readme
    assert "plot_first_screen" not in readme and "echo: false" not in readme
