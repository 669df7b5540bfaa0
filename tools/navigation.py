"""The book's navigation, generated from the chapters themselves (`make readme` runs this, then writes README.md).

Every notebook opens with `# Title` and `> one-line summary` (STYLE.md); from those and the file names this writes

1. `nbs/sidebar.yml`: the home page, the front pages (notebooks without a number: `what_we_found.ipynb`, what we found),
   the base chapters (numbered below 20), the method chapters (20 and above), then the experiments (the generic ones,
   then one per method), each section in file-name order;
2. the methods table of `nbs/index.ipynb` (the markdown cell with id `methods-table`): one row per chapter that
   registers a method with `@METHODS.register(...)`, its title and summary, linked to its page, and the verdict of
   its stored studies (`dml_book.findings.verdict_cell`, computed from `results/`), linked to its experiment;
3. `README.md`: the home page as markdown (nbconvert), its links to pages of the book made links to their notebooks
   (`methods.ala.html` -> `nbs/20_methods.ala.ipynb`), so that they resolve on the repository viewer.

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
TABLE_ID = "methods-table"   # the id of the index's generated markdown cell
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


VERDICT = "what we found: Recall@1 points over the baseline (95% interval)"   # the heading of the verdict column

def methods_table(nbs: Path = NBS) -> str:
    "The markdown of the home page's methods table: one row per method chapter, from its title and summary, and its verdict from `results/`."
    from dml_book.findings import verdict_cell   # pandas and scipy, no torch
    esc = lambda s: s.replace("|", "\\|")
    rows = [f"| chapter | method | in one line | {VERDICT} |", "| --- | --- | --- | --- |"]
    for c in method_chapters(chapters(nbs)[0]):
        short, _, long = c.title.partition(": ")
        name = c.methods[0]
        exp = f"experiments/{name}.html" if (nbs/"experiments"/f"{name}.ipynb").exists() else None
        rows.append(f"| [{esc(short)}]({c.page}) | {esc(long)} | {esc(c.summary)} | {esc(verdict_cell(name, nbs.parent/'results', exp))} |")
    return "\n".join(rows)


def _index_with_table(nbs: Path) -> str:
    "The text of nbs/index.ipynb with its methods table as the chapters give it."
    text = (nbs/"index.ipynb").read_text()
    nb = json.loads(text)
    cell = next((c for c in nb["cells"] if c.get("id") == TABLE_ID), None)
    if cell is None: raise NavigationError(f"nbs/index.ipynb has no markdown cell with id {TABLE_ID!r} to hold the methods table")
    table = methods_table(nbs).splitlines(keepends=True)
    if "".join(cell["source"]) == "".join(table): return text
    cell["source"] = table
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"   # as nbdev-clean writes notebooks


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
    body, _ = MarkdownExporter().from_notebook_node(nbformat.reads(index or _index_with_table(nbs), as_version=4))
    return notebook_links(body, nbs)


def notebook_links(markdown: str, nbs: Path = NBS) -> str:
    "`markdown` (of the repository's root) with each link to a page of the book made a link to its notebook."
    book = pages(nbs)
    return LINK.sub(lambda m: f"]({nbs.name}/{book[m.group(1)]}{m.group(2) or ''})" if m.group(1) in book else m.group(0), markdown)


def generated(nbs: Path = NBS) -> dict[Path, str]:
    "{file: the text the chapters give it} for the sidebar, the home page and README.md."
    index = _index_with_table(nbs)
    return {nbs/"sidebar.yml": sidebar(nbs), nbs/"index.ipynb": index, nbs.parent/"README.md": readme(nbs, index)}


def stale(nbs: Path = NBS) -> list[Path]:
    "The generated files whose committed text differs from what the chapters give."
    return [p for p, text in generated(nbs).items() if not p.exists() or p.read_text() != text]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nbs", default=str(NBS), help="the notebooks' folder (default: nbs/ of this checkout)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated file is stale")
    args = ap.parse_args(argv)
    nbs = Path(args.nbs).resolve()
    try: files = generated(nbs)
    except NavigationError as e: sys.exit(f"navigation: error: {e}")
    old = [p for p, t in files.items() if not p.exists() or p.read_text() != t]
    if args.check:
        if old: sys.exit(f"navigation: stale: {', '.join(str(p.relative_to(nbs.parent)) for p in old)}; run `make readme`")
        return
    for p in old: p.write_text(files[p])
    print(f"navigation: {', '.join(str(p.relative_to(nbs.parent)) for p in old) or 'nothing'} rewritten")


if __name__ == "__main__": main()
