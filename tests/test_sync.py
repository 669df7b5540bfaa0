"The package is the notebooks' export, the notebooks are clean, and README.md is index.ipynb: checked in a copy of the tree."
import filecmp, json, shutil, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tree(tmp_path):
    for name in ("nbs", "dml_book"): shutil.copytree(ROOT/name, tmp_path/name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    shutil.copy(ROOT/"pyproject.toml", tmp_path)
    return tmp_path


def _differences(a: Path, b: Path, pattern: str):
    "Files matching `pattern` that differ between folders a and b, or exist in only one of them."
    fa = {p.relative_to(a) for p in a.rglob(pattern) if "__pycache__" not in p.parts}
    fb = {p.relative_to(b) for p in b.rglob(pattern) if "__pycache__" not in p.parts}
    return sorted(str(p) for p in fa ^ fb) + sorted(str(p) for p in fa & fb if not filecmp.cmp(a/p, b/p, shallow=False))


def test_package_is_in_sync_with_the_notebooks(tmp_path):
    tree = _tree(tmp_path)
    subprocess.run([BIN/"nbdev-export"], cwd=tree, check=True, capture_output=True)
    assert _differences(ROOT/"dml_book", tree/"dml_book", "*.py") == [], "run nbdev-export and commit the result"


def test_notebooks_are_clean(tmp_path):
    tree = _tree(tmp_path)
    subprocess.run([BIN/"nbdev-clean"], cwd=tree, check=True, capture_output=True)
    assert _differences(ROOT/"nbs", tree/"nbs", "*.ipynb") == [], "run nbdev-clean and commit the result"


def test_readme_is_the_index_notebook(tmp_path):
    """README.md is nbconvert's markdown of index.ipynb, its links to pages of the book made links to their notebooks, and
    the forest plot's cell (code and figure) one line: the home page's saved figure, `nbs/images/first_screen.png`."""
    sys.path.insert(0, str(ROOT/"tools"))
    from navigation import notebook_links, FIGURE, FIGURE_ID
    index = json.loads((ROOT/"nbs"/"index.ipynb").read_text())
    index["cells"] = [c for c in index["cells"] if c.get("id") != FIGURE_ID]   # nbconvert would show its code and a figure file of its own
    (tmp_path/"index.ipynb").write_text(json.dumps(index))
    subprocess.run([BIN/"jupyter", "nbconvert", "--to", "markdown", str(tmp_path/"index.ipynb"), "--output-dir", str(tmp_path),
                    "--output", "README"], check=True, capture_output=True)
    figure = f"![Every line of the table above with its 95% interval](nbs/{FIGURE.as_posix()})\n\n"
    readme = (ROOT/"README.md").read_text()
    assert readme.count(figure) == 1 and (ROOT/"nbs"/FIGURE).is_file(), "README.md shows the forest plot once, from the home page's saved figure: make readme"
    assert notebook_links((tmp_path/"README.md").read_text()) == readme.replace(figure, ""), "run `make readme` and commit README.md"
