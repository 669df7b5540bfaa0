"""Where earlier words disagree with the records: each commit whose message names a number format (fp32, bf16, fp16)
and that added stored runs or trials (`results/**/metrics.json`) whose `run.precision` is another one. The list is kept in
`nbs/words_vs_records.json`, which the findings page shows; `tests/test_provenance.py` recomputes it from git where the
history is there (a wheel or a shallow clone has none).

    python tools/words_vs_records.py           # write nbs/words_vs_records.json
    python tools/words_vs_records.py --check   # exit 1 when it differs from what git gives
"""
from __future__ import annotations
import argparse, collections, json, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT/"nbs"/"words_vs_records.json"
FORMATS = re.compile(r"\b(fp32|bf16|fp16)\b", re.I)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def added_runs(commit: str) -> list[str]:
    "The metrics.json files (runs and trials) the commit added under results/."
    return [p for p in git("show", "--name-only", "--diff-filter=A", "--format=", commit).splitlines()
            if p.startswith("results/") and p.endswith("/metrics.json")]


def precisions(commit: str, paths: list[str]) -> collections.Counter:
    "How many of `paths`, as the commit stored them, record each `run.precision` ('not recorded' where none)."
    if not paths: return collections.Counter()
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch"], input="".join(f"{commit}:{p}\n" for p in paths).encode(),
                       capture_output=True, check=True)
    out, data = collections.Counter(), r.stdout
    while data:
        header, _, data = data.partition(b"\n")
        size = int(header.split()[2]); body, data = data[:size], data[size + 1:]
        out[(json.loads(body).get("run") or {}).get("precision") or "not recorded"] += 1
    return out


def disagreements() -> list[dict]:
    "Each commit whose message names a number format while runs it added record another, oldest first."
    rows = []
    for line in git("log", "--reverse", "--format=%H %s").splitlines():
        commit, subject = line.split(" ", 1)
        said = sorted({m.lower() for m in FORMATS.findall(subject)})
        if not said: continue
        rec = precisions(commit, added_runs(commit))
        other = {k: n for k, n in rec.items() if k not in said}
        if other: rows.append(dict(commit=commit[:7], says=said, subject=subject[:160], runs_added=sum(rec.values()), recorded=dict(sorted(rec.items()))))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when the stored list is stale")
    args = ap.parse_args(argv)
    text = json.dumps(disagreements(), indent=1, ensure_ascii=False) + "\n"
    if args.check:
        if not OUT.exists() or OUT.read_text() != text: sys.exit(f"words_vs_records: {OUT.relative_to(ROOT)} is stale: run python tools/words_vs_records.py")
        return
    OUT.write_text(text); print(f"words_vs_records: {len(json.loads(text))} commits whose words disagree with their runs' records")


if __name__ == "__main__": main()
