"""The book's navigation, generated from the chapters themselves (`make readme` runs this, then writes README.md).

Every notebook opens with `# Title` and `> one-line summary` (STYLE.md); from those and the file names this writes

1. `nbs/sidebar.yml`: the home page, the front pages (notebooks without a number: `what_we_found.ipynb`, what we found),
   the base chapters (numbered below 20), the method chapters (20 and above), then the experiments (the generic ones,
   then one per method), each section in file-name order;
2. the first screen of `nbs/index.ipynb` (the markdown cell with id `first-screen`): per method and regime, the
   mechanism's effect and the method against its tuned baseline (`dml_book.findings.first_screen`, from `results/`),
   and its methods table (id `methods-table`): one row per chapter that registers a method with
   `@METHODS.register(...)`, its title and summary, linked to its page and to its experiment;
3. every line of every study with its notes, on the findings page (`nbs/what_we_found.ipynb`, the cell with id
   `every-line`: `dml_book.findings.verdict_cell` per method);
4. `README.md`: the home page as markdown (nbconvert), its links to pages of the book made links to their notebooks
   (`methods.ala.html` -> `nbs/20_methods.ala.ipynb`), so that they resolve on the repository viewer, and the home
   page's forest plot (the saved output of its cell `first-screen-figure`, which `tools/saved_outputs.py` keeps) as
   `nbs/images/first_screen.png`: run this again after `tools/saved_outputs.py --write` when that figure changed.

A method chapter `2x_methods.NAME.ipynb` must register its method under NAME, its module's name: `dml-book train
--method NAME`, the experiment `nbs/experiments/NAME.ipynb` and the chapter's page all go by it. A chapter that breaks
the rule stops the generator with a message naming the chapter and the fix.

    python tools/navigation.py           # write both files
    python tools/navigation.py --check   # exit 1, naming the files, when they differ from what the chapters give
"""
from __future__ import annotations
import argparse, json, re, sys
from dataclasses import dataclass
from pathlib import Path

NBS = Path(__file__).resolve().parents[1]/"nbs"
METHODS_FROM = 20   # chapters numbered 20 and above are the methods; below, the base
TABLE_ID = "methods-table"   # the id of the index's generated methods table
FIRST_ID = "first-screen"   # the id of the index's generated first table (the findings at a glance)
FIGURE_ID = "first-screen-figure"   # the id of the index's code cell that draws the forest plot (tagged `results`)
LINES_ID = "every-line"   # the id of the findings page's generated table of every line
FIGURE = Path("images")/"first_screen.png"   # the forest plot for README.md, under nbs/, as the home page saved it
BOOK_ORDER = lambda nbs: [c.methods[0] for c in method_chapters(chapters(nbs)[0])]   # the methods in chapter order
REGISTER = re.compile(r"""^@METHODS\.register\(\s*["']([^"']+)["']\s*\)""", re.M)


class NavigationError(ValueError):
    "A chapter the navigation cannot be built from: the message names the notebook and the fix."


@dataclass
class Chapter:
    path: str            # relative to nbs/, e.g. "20_methods.ala.ipynb"
    title: str           # the text of its `# Title`
    summary: str         # its `> summary`
    module: str | None   # its `#| default_exp` (None: an experiment or the home page)
    methods: list        # the names it registers with `@METHODS.register(...)` in exported cells

    @property
    def number(self) -> int: return int(re.match(r"\d+", self.path).group()) if self.path[:1].isdigit() else -1
    @property
    def page(self) -> str:
        "The page nbdev/Quarto make of it: number prefix dropped (`20_methods.ala.ipynb` -> `methods.ala.html`)."
        p = Path(self.path)
        return str(p.with_name(re.sub(r"^\d+[a-z]?_", "", p.stem) + ".html"))


def read_chapter(nbs: Path, # the notebooks' folder
                 path: Path, # one notebook in it
                ) -> Chapter:
    "Title, summary, module and registered methods of the notebook at `path`."
    rel = str(path.relative_to(nbs))
    cells = json.loads(path.read_text())["cells"]
    src = lambda c: "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
    first = src(cells[0]).splitlines() if cells and cells[0]["cell_type"] == "markdown" else []
    title = next((l[2:].strip() for l in first if l.startswith("# ")), None)
    summary = next((l[1:].strip() for l in first if l.startswith(">")), None)
    if not title or not summary:
        raise NavigationError(f"nbs/{rel}: its first cell must be markdown that opens with '# Title' and '> one-line summary' "
                              "(STYLE.md): the sidebar and the home page's methods table are made from them")
    code = [src(c) for c in cells if c["cell_type"] == "code"]
    module = next((m.group(1) for s in code for m in [re.search(r"^#\|\s*default_exp\s+(\S+)", s, re.M)] if m), None)
    exported = [s for s in code if re.match(r"#\|\s*export\b", s)]
    return Chapter(rel, title, summary, module, [n for s in exported for n in REGISTER.findall(s)])


def chapters(nbs: Path = NBS) -> tuple[list[Chapter], list[Chapter]]:
    "The numbered chapters and the experiments of `nbs`, in file-name order; scratch notebooks (`_*`) left out."
    read = lambda ps: [read_chapter(nbs, p) for p in sorted(ps) if not p.name.startswith("_")]
    return read(p for p in nbs.glob("*.ipynb") if p.name[:1].isdigit()), read((nbs/"experiments").glob("*.ipynb"))


def front(nbs: Path = NBS) -> list[str]:
    "The front pages: notebooks of `nbs` without a number (not the home page, not scratch), read right after the home page."
    return sorted(p.name for p in nbs.glob("*.ipynb") if not p.name[:1].isdigit() and p.name != "index.ipynb" and not p.name.startswith("_"))


def method_chapters(chs: list[Chapter]) -> list[Chapter]:
    "The chapters that register a method, each checked against the naming rule."
    out = []
    for c in chs:
        if c.number < METHODS_FROM or not c.methods: continue
        own = (c.module or "").split(".", 1)[-1]
        wrong = [n for n in c.methods if n != own] if own not in c.methods else []   # a chapter may also register helpers of its method
        if not (c.module or "").startswith("methods.") or wrong:
            raise NavigationError(
                f"nbs/{c.path} registers method {(wrong or c.methods)[0]!r} but its module is {c.module!r}: the name in "
                f"@METHODS.register(...) must equal the chapter's module name, so write @METHODS.register({own!r}) "
                f"in a chapter with `#| default_exp methods.{own}`, or name the chapter NN_methods.{(wrong or c.methods)[0]}.ipynb")
        out.append(c)
    return out


def sidebar(nbs: Path = NBS) -> str:
    "The text of nbs/sidebar.yml."
    chs, exps = chapters(nbs)
    names = {c.methods[0] for c in method_chapters(chs)}
    exps = sorted(exps, key=lambda e: (Path(e.path).stem in names, e.path))   # the generic experiments first
    sections = [("The base", [c for c in chs if c.number < METHODS_FROM]), ("The methods", [c for c in chs if c.number >= METHODS_FROM]),
                ("Experiments", exps)]
    lines = ["# Generated by tools/navigation.py from the notebooks (`make readme` runs it): do not edit by hand.",
             "# The book in reading order (custom_sidebar = true in pyproject.toml, so nbdev does not regenerate this file): the",
             f"# home page, the front pages, the base chapters (numbered below {METHODS_FROM}), the method chapters, then the experiments.",
             "website:", "  sidebar:", "    contents:", "      - index.ipynb", *(f"      - {f}" for f in front(nbs))]
    for name, items in sections:
        lines += [f"      - section: {name}", "        contents:", *(f"          - {c.path}" for c in items)]
    return "\n".join(lines) + "\n"


esc = lambda s: s.replace("|", "\\|")

def _experiment(nbs: Path, name: str) -> str | None:
    return f"experiments/{name}.html" if (nbs/"experiments"/f"{name}.ipynb").exists() else None

def methods_table(nbs: Path = NBS) -> str:
    "The markdown of the home page's methods table: one row per method chapter, from its title and summary, linked to its page and its experiment."
    rows = ["| chapter | method | in one line | study |", "| --- | --- | --- | --- |"]
    for c in method_chapters(chapters(nbs)[0]):
        short, _, long = c.title.partition(": ")
        exp = _experiment(nbs, c.methods[0])
        rows.append(f"| [{esc(short)}]({c.page}) | {esc(long)} | {esc(c.summary)} | {f'[experiment]({exp})' if exp else 'no experiment'} |")
    return "\n".join(rows)


def first_table(nbs: Path = NBS) -> str:
    "The markdown of the home page's first table: per method chapter and regime, the mechanism's effect and the method against its tuned baseline, from `results/`."
    from dml_book.findings import first_screen, first_screen_markdown   # pandas and scipy, no torch
    chs = method_chapters(chapters(nbs)[0])
    return first_screen_markdown(first_screen(BOOK_ORDER(nbs), nbs.parent/"results"), {c.methods[0]: c.page for c in chs})


def every_line(nbs: Path = NBS) -> str:
    "The markdown of the findings page's table of every line: per method chapter, each study's verdict with its notes (`verdict_cell`), linked to its experiment."
    from dml_book.findings import verdict_cell
    rows = ["| method | every line: Recall@1 points over the baseline (95% interval), with its notes |", "| --- | --- |"]
    for c in method_chapters(chapters(nbs)[0]):
        name = c.methods[0]
        rows.append(f"| [{esc(c.title.partition(': ')[0])}]({c.page}) | {esc(verdict_cell(name, nbs.parent/'results', _experiment(nbs, name)))} |")
    return "\n".join(rows)


def _with_cells(path: Path, cells: dict) -> str:
    "The text of the notebook at `path` with each generated markdown cell (id -> its text) as given."
    text = path.read_text()
    nb = json.loads(text)
    have = {c.get("id"): c for c in nb["cells"]}
    changed = False
    for id, body in cells.items():
        if id not in have: raise NavigationError(f"nbs/{path.name} has no markdown cell with id {id!r} to hold its generated table")
        lines = body.splitlines(keepends=True)
        if "".join(have[id]["source"]) != body: have[id]["source"] = lines; changed = True
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n" if changed else text   # as nbdev-clean writes notebooks


def _index_with_table(nbs: Path) -> str:
    "The text of nbs/index.ipynb with its first table and methods table as the chapters and `results/` give them."
    return _with_cells(nbs/"index.ipynb", {FIRST_ID: first_table(nbs), TABLE_ID: methods_table(nbs)})


def forest_png(index: str) -> bytes | None:
    "The forest plot the home page saved (the PNG output of its cell `first-screen-figure`), or None before one is saved."
    import base64
    cell = next((c for c in json.loads(index)["cells"] if c.get("id") == FIGURE_ID), None)
    png = next((o["data"]["image/png"] for o in (cell or {}).get("outputs", []) if "image/png" in o.get("data", {})), None)
    return base64.b64decode("".join(png) if isinstance(png, list) else png) if png else None


LINK = re.compile(r"\]\((?![a-z]+:|#|/)([^)\s#]+\.html)(#[^)\s]*)?\)")   # a markdown link to a page of the book


def pages(nbs: Path = NBS) -> dict[str, str]:
    "{page: its notebook} for every page of the book (`methods.ala.html` -> `20_methods.ala.ipynb`), the home page's included."
    chs, exps = chapters(nbs)
    pairs = [("index.html", "index.ipynb"), *((Chapter(f, "", "", None, []).page, f) for f in front(nbs)), *((c.page, c.path) for c in chs + exps)]
    seen = {}
    for page, nb in pairs:
        if page in seen: raise NavigationError(f"nbs/{nb} and nbs/{seen[page]} both become the page {page}: rename one of them")
        seen[page] = nb
    return seen

def readme(nbs: Path = NBS, index: str | None = None) -> str:
    "README.md: the home page (`index`: its text; default: as the chapters give it) as markdown, its notebook links relative to the repository's root."
    import nbformat
    from nbconvert import MarkdownExporter
    index = index or _index_with_table(nbs)
    nb = nbformat.reads(index, as_version=4)
    for i, c in enumerate(nb.cells):   # the forest plot: its saved figure, not the code that draws it
        if c.get("id") == FIGURE_ID:
            shown = (f"![Every line of the table above with its 95% interval]({nbs.name}/{FIGURE.as_posix()})" if forest_png(index)
                     else "The forest plot of these lines is on the [home page](index.html) once its outputs are saved (`make readme`).")
            nb.cells[i] = nbformat.v4.new_markdown_cell(shown, id=FIGURE_ID)
    body, _ = MarkdownExporter().from_notebook_node(nb)
    return notebook_links(body, nbs)


def notebook_links(markdown: str, nbs: Path = NBS) -> str:
    "`markdown` (of the repository's root) with each link to a page of the book made a link to its notebook."
    book = pages(nbs)
    return LINK.sub(lambda m: f"]({nbs.name}/{book[m.group(1)]}{m.group(2) or ''})" if m.group(1) in book else m.group(0), markdown)


def generated(nbs: Path = NBS) -> dict[Path, str | bytes]:
    "{file: the text (or bytes) the chapters give it} for the sidebar, the home page, the findings page's every line, README.md and its forest plot."
    index = _index_with_table(nbs)
    out = {nbs/"sidebar.yml": sidebar(nbs), nbs/"index.ipynb": index, nbs.parent/"README.md": readme(nbs, index)}
    if (nbs/"what_we_found.ipynb").exists(): out[nbs/"what_we_found.ipynb"] = _with_cells(nbs/"what_we_found.ipynb", {LINES_ID: every_line(nbs)})
    if (png := forest_png(index)) is not None: out[nbs/FIGURE] = png
    return out


def _differs(p: Path, content: str | bytes) -> bool:
    return not p.exists() or (p.read_bytes() if isinstance(content, bytes) else p.read_text()) != content


def stale(nbs: Path = NBS) -> list[Path]:
    "The generated files whose committed text differs from what the chapters give."
    return [p for p, text in generated(nbs).items() if _differs(p, text)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nbs", default=str(NBS), help="the notebooks' folder (default: nbs/ of this checkout)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated file is stale")
    args = ap.parse_args(argv)
    nbs = Path(args.nbs).resolve()
    try: files = generated(nbs)
    except NavigationError as e: sys.exit(f"navigation: error: {e}")
    old = [p for p, t in files.items() if _differs(p, t)]
    if args.check:
        if old: sys.exit(f"navigation: stale: {', '.join(str(p.relative_to(nbs.parent)) for p in old)}; run `make readme`")
        return
    for p in old:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(files[p]) if isinstance(files[p], bytes) else p.write_text(files[p])
    print(f"navigation: {', '.join(str(p.relative_to(nbs.parent)) for p in old) or 'nothing'} rewritten")


if __name__ == "__main__": main()
