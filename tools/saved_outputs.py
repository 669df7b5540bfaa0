"""Saved outputs: the cells tagged `results` keep, in the committed notebooks, the outputs of a fresh execution; every
other cell stays clean. So a chapter's results and every experiment page read on a repository viewer, without a build.

A tagged cell computes what it shows from `results/` (or a test fixture), never from a run made on the spot, so a fresh
execution gives the same reading: numbers within a tolerance (a float64 residual may move its last bits on another
CPU; see `same_text`), text as it is; a base chapter's figure may be drawn from a seeded run on the spot, since a figure is
compared as a figure (its pixels vary with the library versions), and its table from fixed data. `make readme` writes them (after a study or a change to a results section):

    python tools/saved_outputs.py --write    # copy the tagged cells' outputs from the executed book (_preview) into nbs/
    python tools/saved_outputs.py --check    # the committed outputs read as a fresh execution's (tests/test_saved_outputs.py)

The executed book is the one `tools/preview.py` builds (chapters by `nbdev-test --save`, experiments under papermill),
which `make test` builds anyway; `--write` and `--check` build it first when it is stale.
"""
from __future__ import annotations
import argparse, json, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/"nbs"
PREVIEW = ROOT/"_preview"
TAG = "results"
METHOD_CHAPTERS = ("20_methods.ala", "21_methods.hdml", "22_methods.dcml", "23_methods.pads", "24_methods.dmml")
# base chapters whose figures or tables a reader needs on a repository viewer: data, samplers, losses, metrics, training, figures
BASE_CHAPTERS = ("01_data.builtin", "02_samplers", "04_losses.base", "06_metrics", "08_train", "09_viz")


def notebooks() -> list[Path]:
    "Every notebook of the book: the chapters, the front pages and the experiments."
    return sorted(p for p in [*NBS.glob("*.ipynb"), *(NBS/"experiments").glob("*.ipynb")] if not p.name.startswith("_"))


def executed_path(nb: Path, preview: Path = PREVIEW) -> Path:
    "Where the preview keeps the executed copy of `nb`: `executed/` for chapters, `runs/<name>/` for experiments."
    rel = nb.relative_to(NBS)
    return preview/"runs"/nb.stem/nb.name if rel.parts[0] == "experiments" else preview/"executed"/rel


def is_tagged(cell: dict) -> bool:
    return cell["cell_type"] == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def _text(v) -> str:
    return "".join(v) if isinstance(v, list) else str(v)


_VOLATILE = [(re.compile(r" at 0x[0-9a-f]+"), " at 0x…"),            # object addresses in a repr
             (re.compile(r"T_[0-9a-f]{5}(_)"), r"T_…\1"),             # a pandas Styler's random table id
             (re.compile(r"(?<![\w.])/[^\s'\"]*?/(?=(?:results|nbs|tests)/)"), "…/"),   # the clone's absolute path
             (re.compile(r"[ \t]+$", re.M), "")]

def comparable(outputs: list) -> list[tuple]:
    "What a reader sees in a cell's outputs, comparable between two executions: texts (normalised) and which figures."
    merged = []   # consecutive prints to one stream are one text, however the kernel happened to flush them
    for o in outputs:
        if o["output_type"] == "stream" and merged and merged[-1]["output_type"] == "stream" and merged[-1]["name"] == o["name"]:
            merged[-1] = {**merged[-1], "text": _text(merged[-1]["text"]) + _text(o["text"])}
        else: merged.append(o)
    out = []
    for o in merged:
        kind = o["output_type"]
        if kind == "stream": items = [(o["name"], _text(o["text"]))]
        elif kind == "error": items = [("error", f"{o['ename']}: {o['evalue']}")]
        else: items = [(m, "<figure>" if m.startswith("image/") else _text(v)) for m, v in sorted(o.get("data", {}).items())]
        for m, t in items:
            for pat, rep in _VOLATILE: t = pat.sub(rep, t)
            out.append((m, t.rstrip("\n")))
    return out


# What a reader reads as the same number. A fresh execution on another CPU (other vector units, another BLAS kernel,
# another summation order) moves the last bits of a float64 computed on the spot; a printed residual of 1e-16 reads the
# same as one of 2e-16. So numbers in a text compare within a tolerance, and everything between them exactly (up to
# runs of spaces, which a table pads to its widest entry). The default, a relative 1e-9, lets a number printed to 16
# digits move its last ones and nothing a reader could see in a number printed to 9 digits or fewer; a cell that prints
# residuals (relative differences at rounding level, which have no relative precision of their own) states the bound
# it asserts as a tag, `atol=1e-12`, and its numbers then also compare within that absolute difference.
RTOL = 1e-9
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|\b(?:nan|inf)\b")
_SPACES = re.compile(r"[ \t]+")


def tolerance(cell: dict) -> dict:
    "The tolerance a cell states with tags `atol=X` and `rtol=X` (defaults: atol 0, rtol `RTOL`)."
    tol = {"atol": 0.0, "rtol": RTOL}
    for tag in cell.get("metadata", {}).get("tags", []):
        key, _, value = tag.partition("=")
        if key in tol:
            try: tol[key] = float(value)
            except ValueError: raise SystemExit(f"saved_outputs: tag {tag!r} states no number (write it as {key}=1e-12)") from None
            if not tol[key] >= 0: raise SystemExit(f"saved_outputs: tag {tag!r} must state a tolerance >= 0")
    return tol


def _close(a: str, b: str, atol: float, rtol: float) -> bool:
    x, y = float(a), float(b)
    if x == y or (x != x and y != y): return True
    return abs(x - y) <= max(atol, rtol*max(abs(x), abs(y)))


def same_text(kept: str, new: str, atol: float = 0.0, rtol: float = RTOL) -> bool:
    "Whether two texts read the same: equal between their numbers (runs of spaces as one), each number close to its peer."
    if kept == new: return True
    nums_k, nums_n = _NUMBER.findall(kept), _NUMBER.findall(new)
    words_k, words_n = [_SPACES.sub(" ", w) for w in _NUMBER.split(kept)], [_SPACES.sub(" ", w) for w in _NUMBER.split(new)]
    return (len(nums_k) == len(nums_n) and words_k == words_n
            and all(_close(a, b, atol, rtol) for a, b in zip(nums_k, nums_n)))


def same_outputs(kept: list[tuple], new: list[tuple], atol: float = 0.0, rtol: float = RTOL) -> bool:
    "Whether two `comparable` outputs read the same: the same kinds in the same order, each text by `same_text`."
    return len(kept) == len(new) and all(mk == mn and same_text(tk, tn, atol, rtol) for (mk, tk), (mn, tn) in zip(kept, new))


def _cells_by_id(nb: dict) -> dict:
    return {c.get("id"): c for c in nb["cells"]}


def executed_outputs(nb: Path, preview: Path = PREVIEW) -> dict:
    "Cell id -> the outputs the fresh execution gave each tagged cell of `nb`."
    saved = json.loads(nb.read_text())
    tagged = [c for c in saved["cells"] if is_tagged(c)]
    if not tagged: return {}
    path = executed_path(nb, preview)
    if not path.exists(): raise SystemExit(f"saved_outputs: no executed copy of {nb.relative_to(ROOT)} at {path}: run tools/preview.py")
    fresh = _cells_by_id(json.loads(path.read_text()))
    out = {}
    for c in tagged:
        match = fresh.get(c.get("id"))
        if match is None or _text(match["source"]) != _text(c["source"]):
            raise SystemExit(f"saved_outputs: {path} is not an execution of {nb.relative_to(ROOT)} (cell {c.get('id')}): rebuild the preview")
        out[c["id"]] = match.get("outputs", [])
    return out


def write(preview: Path = PREVIEW) -> list[Path]:
    "Tagged cells take the fresh execution's outputs (unless they read the same as the saved ones), every other cell loses its outputs; returns the notebooks changed."
    changed = []
    for nb in notebooks():
        raw = nb.read_text(); d = json.loads(raw)
        fresh = executed_outputs(nb, preview)
        for c in d["cells"]:
            if c["cell_type"] != "code": continue
            if is_tagged(c) and same_outputs(comparable(c.get("outputs", [])), comparable(fresh[c["id"]]), **tolerance(c)):
                c["execution_count"] = None; continue   # the same reading: keep the saved bits, no churn from another CPU
            c["outputs"] = [_clean_output(o) for o in fresh[c["id"]]] if is_tagged(c) else []
            c["execution_count"] = None
        new = json.dumps(d, indent=1, ensure_ascii=False) + "\n"
        if new != raw: nb.write_text(new); changed.append(nb)
    for nb in changed: subprocess.run([str(Path(sys.executable).parent/"nbdev-clean"), "--fname", str(nb)], check=True, cwd=ROOT)
    return changed


def _clean_output(o: dict) -> dict:
    o = {k: v for k, v in o.items() if k != "execution_count"} | ({"execution_count": None} if o["output_type"] == "execute_result" else {})
    o["metadata"] = {}
    return o


def problems(preview: Path = PREVIEW) -> list[str]:
    "Each place where the committed notebooks differ from what `write` would store: the check the tests make."
    found = []
    for nb in notebooks():
        d = json.loads(nb.read_text()); rel = nb.relative_to(ROOT)
        for c in d["cells"]:
            if c["cell_type"] == "code" and c.get("outputs") and not is_tagged(c):
                found.append(f"{rel}: cell {c.get('id')} keeps outputs but is not tagged '{TAG}' (clear them or tag the cell)")
        fresh = executed_outputs(nb, preview)
        for c in d["cells"]:
            if not is_tagged(c): continue
            kept, new = comparable(c.get("outputs", [])), comparable(fresh[c["id"]])
            if not new: found.append(f"{rel}: tagged cell {c['id']} shows nothing when executed")
            elif any(m == "error" for m, _ in new): found.append(f"{rel}: tagged cell {c['id']} fails: {new}")
            elif not same_outputs(kept, new, **(tol := tolerance(c))):
                diff = next((f"saved {a!r:.300} | fresh {b!r:.300}" for a, b in zip(kept, new) if not (a[0] == b[0] and same_text(a[1], b[1], **tol))),
                            f"{len(kept)} outputs saved, {len(new)} fresh")
                found.append(f"{rel}: cell {c['id']}'s saved outputs differ from a fresh execution: {diff}")
    return found


def build_preview(preview: Path = PREVIEW):
    subprocess.run([sys.executable, str(ROOT/"tools"/"preview.py"), "--if-stale", "--out", str(preview)], check=True, cwd=ROOT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="store the fresh outputs of the tagged cells in nbs/")
    g.add_argument("--check", action="store_true", help="exit 1 when a saved output differs from a fresh execution")
    ap.add_argument("--preview", default=str(PREVIEW), help="the executed book (default: _preview)")
    ap.add_argument("--no-build", action="store_true", help="use the executed book as it is, even when stale")
    args = ap.parse_args(argv)
    preview = Path(args.preview).resolve()
    if not args.no_build: build_preview(preview)
    if args.write:
        changed = write(preview)
        print(f"saved_outputs: {len(changed)} notebooks changed" + "".join(f"\n  {p.relative_to(ROOT)}" for p in changed))
    found = problems(preview)
    for p in found: print(p)
    sys.exit(1 if found else 0)


if __name__ == "__main__": main()
