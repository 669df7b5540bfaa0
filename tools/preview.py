"""Offline HTML preview of the executed book, without Quarto (`make preview`; part of `make test`).

1. chapters: a copy of nbs/ is executed by `nbdev-test --save` (the same runner, flags and timeout as `nbdev-test`,
   so this step *is* the notebook test: it fails when a chapter fails) and keeps the outputs;
2. experiments: every notebook of nbs/experiments runs under papermill with its defaults through
   `dml-book experiment NAME --out-dir OUT/runs/NAME` (the executed notebook is saved beside its results);
3. pages: each executed notebook becomes one HTML page with `jupyter nbconvert` (hidden cells and nbdev directives
   removed, figures embedded), named as nbdev names them (`20_methods.ala.ipynb` -> `methods.ala.html`), in the
   reading order of nbs/sidebar.yml, with an index page linking the chapters in order. The pages need no network:
   equations are typeset by a copy of MathJax 2.7 from the `jupyter-server-mathjax` package (a dev dependency) in
   OUT/site/mathjax/, and nbconvert's require.js (for widgets, which the book has none of) is left out.

`OUT/stamp.json` records a hash of the sources the preview was built from; `--if-stale` rebuilds only when they changed.
"""
from __future__ import annotations
import argparse, hashlib, html, json, os, re, shutil, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/"nbs"
BIN = Path(sys.executable).parent


def _notebook_source(path: Path) -> bytes:
    "What executing a notebook depends on: its cells' sources, not their saved outputs or tags."
    cells = json.loads(path.read_text())["cells"]
    return json.dumps([(c["cell_type"], c["source"]) for c in cells]).encode()


def stored_results() -> list[Path]:
    "The files of results/ that pages read (json, jsonl, csv): those git tracks (not a tuning run's files in progress)."
    r = subprocess.run(["git", "ls-files", "-z", "results"], cwd=ROOT, capture_output=True, text=True)
    names = r.stdout.split("\0") if r.returncode == 0 else [str(f.relative_to(ROOT)) for f in (ROOT/"results").rglob("*")]
    return [ROOT/n for n in names if n.endswith((".json", ".jsonl", ".csv")) and (ROOT/n).is_file()]


def sources_hash() -> str:
    """A hash of everything the preview depends on: the notebooks' cells (not their outputs), the package, the sidebar,
    the published figures, the stored results and the parity fixtures that results sections read."""
    h = hashlib.sha256()
    files = sorted([*NBS.rglob("*.ipynb"), *NBS.rglob("*.yml"), *NBS.rglob("*.csv"), *(ROOT/"dml_book").rglob("*.py"), Path(__file__),
                    *stored_results(),
                    *(ROOT/"tests"/"fixtures"/"parity").glob("*")])
    for f in files:
        if any(p.startswith(("_", ".")) and p not in (".notest",) for p in f.relative_to(ROOT).parts[:-1]): continue
        h.update(str(f.relative_to(ROOT)).encode()); h.update(_notebook_source(f) if f.suffix == ".ipynb" else f.read_bytes())
    return h.hexdigest()


def reading_order() -> list[tuple[str, list[str]]]:
    "Sections of nbs/sidebar.yml: [(section title, [notebook paths relative to nbs/])], the home page first."
    import yaml
    contents = yaml.safe_load((NBS/"sidebar.yml").read_text())["website"]["sidebar"]["contents"]
    out = []
    for item in contents:
        if isinstance(item, str): out.append(("", [item]))
        else: out.append((item["section"], list(item["contents"])))
    return out


def page_name(nb: str) -> str:
    "The HTML name nbdev/Quarto give a notebook: number prefix dropped (`20_methods.ala.ipynb` -> `methods.ala.html`)."
    p = Path(nb)
    return str(p.with_name(re.sub(r"^\d+[a-z]?_", "", p.stem) + ".html"))


def execute_chapters(out: Path, n_workers: int = 2) -> Path:
    "Run nbdev-test --save on a copy of nbs/ (without the experiments): the executed chapters."
    dest = out/"executed"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(NBS, dest, ignore=shutil.ignore_patterns("experiments", "_*", ".ipynb_checkpoints"))
    t0 = time.time()
    r = subprocess.run([str(BIN/"nbdev-test"), "--n-workers", str(n_workers), "--timing", "--save", str(dest)], cwd=ROOT)
    if r.returncode: sys.exit(f"preview: nbdev-test failed on the chapters (exit {r.returncode})")
    print(f"preview: chapters executed in {time.time() - t0:.0f} s")
    for w in stray_warnings(dest): print(f"preview: a chapter printed a warning: {w}")   # each one is a chapter to fix
    return dest


def stray_warnings(executed: Path) -> list[str]:
    "Warnings the executed chapters printed (stderr outputs that name a Warning): `chapter.ipynb: first line`."
    import nbformat
    found = []
    for nb_path in sorted(executed.glob("*.ipynb")):
        for c in nbformat.read(str(nb_path), as_version=4).cells:
            for o in c.get("outputs", []):
                text = o.get("text", "") if o.get("output_type") == "stream" and o.get("name") == "stderr" else ""
                if "Warning" in text: found.append(f"{nb_path.name}: {text.strip().splitlines()[0][:160]}")
    return found


# Seconds each experiment took in `make test`'s preview (one thread, two at a time): only the order they start in, the
# longest first, so that the last one to finish is not a long one started late (a new experiment counts as 60 s). Each
# preview records what it measured in OUT/runs/seconds.json and the next one on this machine starts in that order.
EXPERIMENT_SECONDS = {"hdml": 52, "dcml": 48, "train_eval": 45, "dmml": 42, "ala": 41, "pads": 41, "pretrain": 18}

def run_experiments(out: Path, n_workers: int = 2) -> Path:
    """Every experiment notebook under papermill with its defaults, through `dml-book experiment`, `n_workers` at a time
    (one thread each, as the chapters run); each one's output goes to `OUT/runs/<name>.log`."""
    from concurrent.futures import ThreadPoolExecutor
    runs = out/"runs"; runs.mkdir(parents=True, exist_ok=True)
    def run(nb: Path) -> tuple[str, int, float]:
        t0 = time.time()
        with open(runs/f"{nb.stem}.log", "w") as log:
            r = subprocess.run([str(BIN/"dml-book"), "experiment", nb.stem, "--out-dir", str(runs/nb.stem), "--no-progress"],
                               cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return nb.stem, r.returncode, time.time() - t0
    record = runs/"seconds.json"
    measured = {**EXPERIMENT_SECONDS, **(json.loads(record.read_text()) if record.is_file() else {})}
    longest_first = sorted((NBS/"experiments").glob("*.ipynb"), key=lambda nb: -measured.get(nb.stem, 60))
    with ThreadPoolExecutor(max_workers=n_workers) as pool:
        for name, rc, seconds in pool.map(run, longest_first):
            if rc:
                print((runs/f"{name}.log").read_text()[-3000:])
                sys.exit(f"preview: experiment {name} failed (exit {rc}); see {runs/name/(name + '.ipynb')} and {runs/(name + '.log')}")
            print(f"preview: experiment {name} ran in {seconds:.0f} s")
            measured[name] = round(seconds)
    record.write_text(json.dumps(measured, indent=1) + "\n")
    return runs


_DIRECTIVE = re.compile(r"^\s*#\|\s*(\S+)")

def _clean(nb):
    "Drop hidden and nbdev-only cells, strip nbdev directive lines; the rest is what a reader sees."
    cells = []
    for c in nb.cells:
        c.metadata.pop("execution", None)   # nbdev-test --save records timings that nbformat's schema rejects
        lines = c.source.splitlines()
        flags = {m.group(1).rstrip(":") for l in lines if (m := _DIRECTIVE.match(l))}
        if c.cell_type == "code" and flags & {"hide", "default_exp", "exporti"}: continue
        if c.cell_type == "code" and any(l.strip() in ("#| echo: false",) for l in lines): c.metadata["jupyter"] = {"source_hidden": True}
        if c.cell_type == "code": c.source = "\n".join(l for l in lines if not _DIRECTIVE.match(l)).strip("\n")
        if c.cell_type == "code" and not c.source and not c.get("outputs"): continue
        cells.append(c)
    nb.cells = cells
    return nb


NAV_CSS = """<style>.dml-nav{font-family:system-ui,sans-serif;background:#2c3e50;color:#fff;padding:.5em 1em;display:flex;gap:1.5em;
position:sticky;top:0;z-index:10}.dml-nav a{color:#fff}.dml-nav .title{font-weight:700}</style>"""

def _nav(prefix: str, prev: tuple | None, nxt: tuple | None) -> str:
    parts = [f'<a class="title" href="{prefix}index.html">dml_book</a>']
    if prev: parts.append(f'<a href="{prefix}{prev[0]}">&larr; {html.escape(prev[1])}</a>')
    if nxt: parts.append(f'<a href="{prefix}{nxt[0]}">{html.escape(nxt[1])} &rarr;</a>')
    return NAV_CSS + '<nav class="dml-nav">' + "".join(parts) + "</nav>"


# `page.html#figure` starts the page at its first figure (cells before it hidden): what a headless screenshot can show
_FIGURE_VIEW = """<script>if (location.hash == "#figure") { const f = document.getElementById("first-figure");
if (f) for (const c of document.querySelectorAll(".jp-Cell")) { if (c.contains(f)) break; c.style.display = "none"; } }</script>"""

def _title(nb) -> str:
    for c in nb.cells:
        if c.cell_type == "markdown" and (m := re.search(r"^#\s+(.+)$", c.source, re.M)): return m.group(1).strip()
    return "untitled"


MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"   # a configuration the packaged MathJax ships

def mathjax_source() -> Path:
    "The folder of MathJax 2.7 that the `jupyter-server-mathjax` package ships (MathJax.js, config/, jax/, fonts/)."
    try: import jupyter_server_mathjax
    except ImportError: sys.exit("preview: equations need a local MathJax: pip install jupyter-server-mathjax (make install)")
    return Path(jupyter_server_mathjax.__file__).parent/"static"


def offline(body: str) -> str:
    "A page without nbconvert's CDN require.js (needed only by widgets)."
    return re.sub(r'<script src="https://[^"]*require[^"]*"></script>\s*', "", body)


def render(exporter, nb, title: str, prefix: str, prev: tuple | None, nxt: tuple | None) -> str:
    "One notebook as a page that needs no network: MathJax from `<prefix>mathjax/`, the navigation bar, the first figure marked."
    exporter.mathjax_url = f"{prefix}mathjax/MathJax.js?config={MATHJAX_CONFIG}"
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    body = offline(body)
    body = re.sub(r'<img (?=[^>]*src="data:image/png)', '<img id="first-figure" ', body, count=1)
    body = body.replace("</body>", _FIGURE_VIEW + "</body>", 1)
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + _nav(prefix, prev, nxt), body, count=1)


_EXPORTER = None

def _write_page(job: tuple):
    "Render one page (`render`'s arguments after the exporter) to its file, with this process's exporter."
    global _EXPORTER
    from nbconvert import HTMLExporter
    _EXPORTER = _EXPORTER or HTMLExporter(template_name="lab")
    path, *args = job
    path.write_text(render(_EXPORTER, *args))


def build_pages(out: Path, chapters: Path, runs: Path, n_workers: int = 2) -> list[dict]:
    "One HTML page per notebook in reading order, plus the index, rendered `n_workers` at a time; returns the pages built."
    import nbformat
    site = out/"site"
    shutil.rmtree(site, ignore_errors=True); (site/"experiments").mkdir(parents=True)
    shutil.copytree(mathjax_source(), site/"mathjax")
    pages = []
    for section, nbs in reading_order():
        for rel in nbs:
            src = runs/Path(rel).stem/Path(rel).name if rel.startswith("experiments/") else chapters/rel
            if not src.exists(): sys.exit(f"preview: no executed notebook for {rel} (looked for {src})")
            nb = _clean(nbformat.read(str(src), as_version=4))
            pages.append(dict(section=section, notebook=rel, page=page_name(rel), title=_title(nb), nb=nb))
    jobs = []
    for i, p in enumerate(pages):
        prefix = "../" * p["page"].count("/")
        prev = (pages[i-1]["page"], pages[i-1]["title"]) if i else None
        nxt = (pages[i+1]["page"], pages[i+1]["title"]) if i + 1 < len(pages) else None
        p["file"] = "home.html" if p["notebook"] == "index.ipynb" else p["page"]
        jobs.append((site/p["file"], p.pop("nb"), p["title"], prefix, prev, nxt))
    from concurrent.futures import ProcessPoolExecutor   # nbconvert is pure Python: a process per worker, not threads
    with ProcessPoolExecutor(max_workers=n_workers) as pool: list(pool.map(_write_page, jobs))
    _write_index(site, pages)
    shutil.copy(NBS/"styles.css", site/"styles.css")
    return pages


def _write_index(site: Path, pages: list[dict]):
    "The index: what the project is, how to install it and run the experiments, and the chapters in reading order."
    toc, section = [], None
    for p in pages:
        if p["section"] != section:
            if section is not None: toc.append("</ol>")
            section = p["section"]
            toc.append(f"<h3>{html.escape(section or 'Start here')}</h3><ol>")
        toc.append(f'<li><a href="{p["file"]}">{html.escape(p["title"])}</a> <small>({html.escape(p["notebook"])})</small></li>')
    toc.append("</ol>")
    (site/"index.html").write_text(f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>dml_book: offline preview</title>
<link rel="stylesheet" href="styles.css"><style>body{{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;line-height:1.5}}
code,pre{{background:#f4f4f4}}pre{{padding:.6em}}</style></head><body>
<h1>dml_book</h1>
<p><b>A literate, executable book on deep metric learning — adaptive sampling and meta-learning — and the PyTorch library
extracted from it.</b> Every chapter is a notebook and a module of the <code>dml_book</code> package: the base (data, samplers,
losses, miners, metrics, models, training), then the published methods, a chapter each, then experiments that run each
paper's protocol and ablations and compare them with the numbers the paper reports.</p>
<p>This is the offline preview, built without Quarto from the executed notebooks (<code>make preview</code>); the site itself
is built with <code>make docs</code> (<code>nbdev-docs</code>, which needs Quarto). Start with <a href="home.html">the home page</a>.</p>
{install_section()}
<h2>Run the experiments</h2>
<pre>dml-book experiment train_eval -p method hdml -p epochs 5     # any method, seconds on a CPU
dml-book experiment hdml                                         # a paper's protocol and ablations, built-in data
papermill nbs/experiments/pads.ipynb out.ipynb -k python3 -f params/pads_cub200.yaml   # the paper's setting, on a GPU</pre>
<p>Each run writes its configuration, environment, per-epoch and final metrics as JSON in its output folder, with the
executed notebook beside them.</p>
<h2>Chapters, in reading order</h2>
{''.join(toc)}
</body></html>""")


def install_section(nbs: Path = NBS) -> str:
    "The home page's Install section (nbs/index.ipynb, README.md's too) as HTML: one wording of how to install, everywhere."
    import mistune
    for c in json.loads((nbs/"index.ipynb").read_text())["cells"]:
        text = "".join(c["source"]) if c["cell_type"] == "markdown" else ""
        if m := re.search(r"^## Install\n.*?(?=^## |\Z)", text, re.M | re.S): return mistune.html(m.group(0))
    sys.exit("preview: nbs/index.ipynb has no '## Install' section")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT/"_preview"), help="output folder (default: _preview)")
    ap.add_argument("--if-stale", action="store_true", help="do nothing when OUT was built from the current sources")
    ap.add_argument("--n-workers", type=int, default=2, help="notebooks, experiments and pages at once")
    ap.add_argument("--pages-only", action="store_true", help="only rebuild the HTML from OUT/executed and OUT/runs")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve(); stamp = out/"stamp.json"
    digest = sources_hash()
    if args.if_stale and stamp.exists() and json.loads(stamp.read_text()).get("sources") == digest:
        return print(f"preview: {out} is up to date")
    stamp.unlink(missing_ok=True); out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MPLBACKEND", "Agg")
    if args.pages_only: chapters, runs = out/"executed", out/"runs"
    else: chapters, runs = execute_chapters(out, args.n_workers), run_experiments(out, args.n_workers)
    pages = build_pages(out, chapters, runs, args.n_workers)
    stamp.write_text(json.dumps(dict(sources=digest, pages=[{k: v for k, v in p.items()} for p in pages]), indent=1))
    print(f"preview: {len(pages)} pages in {out/'site'}; open {out/'site'/'index.html'}")


if __name__ == "__main__": main()
