"""Saved outputs: the cells tagged `results` keep, in the committed notebooks, the outputs of a fresh execution; every
other cell stays clean. So a chapter's results and every experiment page read on a repository viewer, without a build.

A tagged cell computes what it shows from `results/` (or a test fixture), never from a run made on the spot, so a fresh
execution gives the same numbers; a base chapter's figure may be drawn from a seeded run on the spot, since a figure is
compared as a figure (its pixels vary with the library versions), and its table from fixed data. `make readme` writes them (after a study or a change to a results section):

    python tools/saved_outputs.py --write    # copy the tagged cells' outputs from the executed book (_preview) into nbs/
    python tools/saved_outputs.py --check    # the committed outputs equal a fresh execution's (tests/test_saved_outputs.py)

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
    "Tagged cells take the fresh execution's outputs, every other cell loses its outputs; returns the notebooks changed."
    changed = []
    for nb in notebooks():
        raw = nb.read_text(); d = json.loads(raw)
        fresh = executed_outputs(nb, preview)
        for c in d["cells"]:
            if c["cell_type"] != "code": continue
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
            elif kept != new:
                diff = next((f"saved {a!r:.300} | fresh {b!r:.300}" for a, b in zip(kept, new) if a != b), f"{len(kept)} outputs saved, {len(new)} fresh")
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
