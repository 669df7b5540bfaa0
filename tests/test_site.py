"""The book as a site: Quarto configuration and sidebar (checked without Quarto), `nbdev-proc-nbs`, and the offline
preview (tools/preview.py) rendered by a headless Chromium."""
import json, os, re, shutil, subprocess, sys
from pathlib import Path
import pytest, yaml

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/"nbs"
BIN = Path(sys.executable).parent
PREVIEW = ROOT/"_preview"


def _sidebar_entries():
    def walk(items):
        for i in items:
            if isinstance(i, str): yield i
            else: yield from walk(i["contents"])
    return list(walk(yaml.safe_load((NBS/"sidebar.yml").read_text())["website"]["sidebar"]["contents"]))


def test_sidebar_lists_every_chapter_and_experiment_in_reading_order():
    entries = _sidebar_entries()
    notebooks = sorted(str(p.relative_to(NBS)) for p in [*NBS.glob("*.ipynb"), *(NBS/"experiments").glob("*.ipynb")]
                       if not p.name.startswith("_"))
    assert sorted(entries) == notebooks, "nbs/sidebar.yml and the notebooks differ: " + str(set(entries) ^ set(notebooks))
    front = [e for e in entries if "/" not in e and not e[0].isdigit() and e != "index.ipynb"]
    chapters = [e for e in entries if "/" not in e and e[0].isdigit()]
    assert entries[0] == "index.ipynb" and entries[1:1 + len(front)] == front == ["what_we_found.ipynb"]   # what we found, up front
    assert chapters == sorted(chapters)   # numbered chapters in order: base, then methods
    assert all(e.startswith("experiments/") for e in entries[1 + len(front) + len(chapters):])
    sections = [s["section"] for s in yaml.safe_load((NBS/"sidebar.yml").read_text())["website"]["sidebar"]["contents"] if isinstance(s, dict)]
    assert sections == ["The base", "The methods", "Experiments"]


def test_quarto_configuration_is_complete():
    q = yaml.safe_load((NBS/"_quarto.yml").read_text())
    assert q["project"]["type"] == "website" and set(q["metadata-files"]) == {"nbdev.yml", "sidebar.yml"}
    assert q["format"]["html"]["css"] == "styles.css" and (NBS/"styles.css").exists()
    assert q["execute"]["enabled"] is True   # the site shows executed chapters and experiment runs
    n = yaml.safe_load((NBS/"nbdev.yml").read_text())
    assert n["project"]["output-dir"] == "_docs" and n["website"]["title"] == "dml_book"
    for item in q["website"]["navbar"]["left"]: assert (NBS/item["href"]).exists(), item


@pytest.mark.slow
def test_nbdev_proc_nbs_processes_every_notebook(tmp_path):
    "nbdev-proc-nbs on a copy of the tree; without Quarto a stand-in `quarto` keeps nbdev from trying to install it."
    for name in ("nbs", "dml_book"): shutil.copytree(ROOT/name, tmp_path/name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT/"pyproject.toml", tmp_path)
    env = dict(os.environ)
    if not shutil.which("quarto"): env["PATH"] = f"{ROOT/'tools'/'no-quarto'}{os.pathsep}{env['PATH']}"
    r = subprocess.run([str(BIN/"nbdev-proc-nbs")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    proc = tmp_path/"_proc"
    for e in _sidebar_entries(): assert (proc/e).exists(), f"{e} was not processed"
    for f in ("_quarto.yml", "sidebar.yml", "nbdev.yml"): assert (proc/f).exists(), f
    assert (tmp_path/"nbs"/"nbdev.yml").read_text() == (NBS/"nbdev.yml").read_text(), "nbdev regenerates nbs/nbdev.yml: commit its output"


@pytest.fixture(scope="session")
def preview():
    subprocess.run([sys.executable, str(ROOT/"tools"/"preview.py"), "--if-stale", "--out", str(PREVIEW)], check=True, cwd=ROOT)
    return PREVIEW/"site"


@pytest.mark.slow
def test_preview_has_every_page_and_an_index_in_reading_order(preview):
    sys.path.insert(0, str(ROOT/"tools"))
    from preview import page_name
    entries = _sidebar_entries()
    index = (preview/"index.html").read_text()
    links = re.findall(r'<li><a href="([^"]+)"', index)
    assert links == ["home.html"] + [page_name(e) for e in entries[1:]]
    for link in links:
        page = (preview/link).read_text()
        assert "<nav class=\"dml-nav\">" in page and "jp-Cell" in page, link
    for e in entries:   # every experiment page shows its figures
        if e.startswith("experiments/"): assert (preview/page_name(e)).read_text().count("data:image/png") >= 2, e


def system_install_command(package: str) -> str:
    "The command that installs a missing Debian package the tests use, as `make install`'s step prints it."
    r = subprocess.run(["sh", str(ROOT/"tools"/"system_packages.sh"), "--command"], capture_output=True, text=True)
    return r.stdout.strip() or f"sudo apt-get install -y {package}"


@pytest.fixture(scope="session")
def chromium():
    "Debian's chromium, which `make install` installs (tools/system_packages.sh); a skip naming the command when missing."
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None: pytest.skip(f"chromium is not installed: {system_install_command('chromium')} (or make install, as root)")
    return exe


def test_system_packages_script_lists_chromium_and_no_test_runs_apt_get():
    "The set-up step installs the tests' Debian packages; no test file installs anything."
    script = (ROOT/"tools"/"system_packages.sh").read_text()
    listed = script.split('PACKAGES="', 1)[1].split('"', 1)[0].split()
    assert "chromium" in listed
    make = (ROOT/"Makefile").read_text()
    assert "sh tools/system_packages.sh" in make.split("\ninstall:", 1)[1].split("\n\n", 1)[0]   # make install's step
    assert re.search(r"^test: install$", make, re.M)   # which make test runs first
    for f in (ROOT/"tests").glob("*.py"):
        code = f.read_text()
        assert not re.search(r"[\"']apt(-get)?[\"']\s*,\s*[\"']install", code), f"{f.name} runs apt-get"


@pytest.mark.parametrize("installed", [False, True])
def test_system_packages_script_names_what_is_missing(tmp_path, installed):
    "With dpkg answering that every package is (not) installed, `--command` prints nothing (the command that installs them all)."
    stub = tmp_path/"dpkg-query"
    stub.write_text("#!/bin/sh\n" + ("printf 'install ok installed'\n" if installed else "exit 1\n")); stub.chmod(0o755)
    r = subprocess.run(["sh", str(ROOT/"tools"/"system_packages.sh"), "--command"], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    listed = (ROOT/"tools"/"system_packages.sh").read_text().split('PACKAGES="', 1)[1].split('"', 1)[0].split()
    assert r.returncode == 0 and r.stdout.strip() == ("" if installed else "sudo apt-get install -y " + " ".join(listed)), r


def _screenshot(chromium, url, png):
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={png}",
                        "--window-size=1200,900", url], capture_output=True, text=True, timeout=180)
    assert png.exists(), r.stderr
    from PIL import Image
    img = Image.open(png).convert("RGB")
    assert img.size == (1200, 900)
    return img


def _ink(img):
    "Share of pixels that are not (near) white, and the number of distinct colours: a blank or error page has few."
    import numpy as np
    px = np.asarray(img.convert("RGB").resize((300, 225))).reshape(-1, 3)
    return float((px.min(axis=1) < 230).mean()), len(np.unique(px, axis=0))


@pytest.mark.slow
def test_chromium_renders_the_index_and_a_method_chapter_with_figures(preview, chromium):
    shots = PREVIEW/"screenshots"; shots.mkdir(exist_ok=True)
    index = _screenshot(chromium, (preview/"index.html").as_uri(), shots/"index.png")
    ink, colours = _ink(index)
    assert 0.02 < ink < 0.9, ink
    page = preview/"methods.hdml.html"
    assert 'id="first-figure"' in page.read_text(), "the HDML chapter has no figure"
    chapter = _screenshot(chromium, page.as_uri() + "#figure", shots/"methods.hdml.png")
    ink, colours = _ink(chapter)
    assert ink > 0.05 and colours > 200, (ink, colours)   # a plotted figure, not text alone or an error page


# Links and equations work offline: every local link of the book names a page of it, and the preview's pages load
# MathJax (and nothing else) from the preview itself.
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _book_pages() -> set[str]:
    sys.path.insert(0, str(ROOT/"tools"))
    from preview import page_name
    return {"index.html" if e == "index.ipynb" else page_name(e) for e in _sidebar_entries()}


def test_notebook_links_name_pages_of_the_book():
    "A markdown link to another chapter names its page (`inference.html`), which Quarto and the preview both serve."
    import posixpath
    pages, bad = _book_pages(), []
    for nb in [*NBS.glob("*.ipynb"), *(NBS/"experiments").glob("*.ipynb")]:
        here = posixpath.dirname(str(nb.relative_to(NBS)))
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] != "markdown": continue
            for link in _LINK.findall("".join(cell["source"])):
                if link.startswith(("http:", "https:", "#", "mailto:")): continue
                target = posixpath.normpath(posixpath.join(here, link.split("#")[0]))
                if target.endswith(".ipynb") or (target not in pages and not (NBS/target).exists()): bad.append(f"{nb.name}: {link}")
    assert not bad, bad


def _local_refs(page: str) -> list[str]:
    return [u for u in re.findall(r'(?:src|href)="([^"]+)"', page) if not u.startswith(("#", "data:", "mailto:"))]


def test_a_preview_page_needs_no_network(tmp_path):
    "One chapter rendered as the preview renders it: its scripts are local, and MathJax is there to load."
    import nbformat
    from nbconvert import HTMLExporter
    sys.path.insert(0, str(ROOT/"tools"))
    from preview import render, mathjax_source, _clean
    nb = _clean(nbformat.read(str(NBS/"03_distances.ipynb"), as_version=4))
    assert "$" in "".join(c.source for c in nb.cells if c.cell_type == "markdown")   # a chapter with equations
    (tmp_path/"experiments").mkdir(); shutil.copytree(mathjax_source(), tmp_path/"mathjax")
    for name, prefix in (("distances.html", ""), ("experiments/x.html", "../")):
        page = render(HTMLExporter(template_name="lab"), nb, "Distances", prefix, None, None)
        refs = _local_refs(page)
        assert not [u for u in refs if u.startswith(("http:", "https:", "//"))], refs
        mj = [u for u in refs if "MathJax.js" in u]
        assert len(mj) == 1 and (tmp_path/name).parent.joinpath(mj[0].split("?")[0]).resolve().is_file(), mj
    assert (tmp_path/"mathjax"/"config"/"TeX-AMS-MML_HTMLorMML-full.js").is_file()


@pytest.mark.slow
def test_preview_has_no_broken_local_link(preview):
    "Every href and src of every page of the preview, followed: a file of the preview (anchors aside), or a web address."
    bad = []
    for page in [*preview.glob("*.html"), *preview.glob("experiments/*.html")]:
        for ref in _local_refs(page.read_text()):
            if ref.startswith(("http:", "https:")):
                assert "mathjax" not in ref.lower() and "require" not in ref, (page.name, ref)   # nothing the page needs
                continue
            if not (page.parent/ref.split("#")[0].split("?")[0]).resolve().exists(): bad.append(f"{page.name}: {ref}")
    assert not bad, bad
