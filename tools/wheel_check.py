"""The release's wheel check (.github/workflows/release.yml): an installed `dml_book`, run outside the clone, reports
the same findings as the clone's `results/`. Nothing in it is typed in: the expected findings are computed, with the
installed package, from the clone's stored studies, so the check follows every study added or decided again.

    cd /tmp && /path/to/venv/bin/python /path/to/clone/tools/wheel_check.py /path/to/clone/results

Exit 0 with the table and a summary line; exit 1 with one line per difference (tests/test_release.py runs it too).
"""
from __future__ import annotations
import argparse, sys
from pathlib import Path


def problems(shipped, # `findings()` of the installed package (its `_results` summaries)
             clone, # `findings(root=<clone>/results)`: what the stored studies give
            ) -> list[str]:
    "Each difference between the two frames of findings, one line each; empty when the wheel reports the clone's findings."
    key = lambda f: (f["method"], f["regime"], f["settings"]) + ((f["versus"],) if f.get("versus", "baseline") != "baseline" else ())
    got, want = ({key(f): f for f in frame.to_dict("records")} for frame in (shipped, clone))
    if not want: return ["the clone's results/ give no finding: nothing to check the wheel against"]
    out = [f"the wheel has no finding for {' / '.join(k)}" for k in want if k not in got]
    out += [f"the wheel has a finding the clone has not: {' / '.join(k)}" for k in got if k not in want]
    for k in want.keys() & got.keys():
        diff = {c: (got[k].get(c), v) for c, v in want[k].items() if got[k].get(c) != v}
        if diff: out.append(f"{' / '.join(k)}: " + ", ".join(f"{c} is {a!r} in the wheel, {b!r} in the clone" for c, (a, b) in diff.items()))
    return sorted(out)


def infeasible_problems(root=None, # the results store (None: the installed package's)
                        clone=None, # the clone's results/
                       ) -> list[str]:
    "Each search that kept no setting at work (`infeasible`, from its infeasible.json) the clone has and the wheel lacks, or says otherwise."
    from dml_book.findings import infeasible, REGIMES
    methods = sorted(p.parent.name for p in Path(clone).glob("*/study.json"))
    out = []
    for m in methods:
        for r in REGIMES:
            want, got = infeasible(m, r, clone), infeasible(m, r, root)
            if want != got: out.append(f"{m} / {r}: the infeasible search's line is {got and got['text']!r} in the wheel, {want and want['text']!r} in the clone")
    return out


def summary(frame) -> str:
    "What the findings say, counted from them: 'N findings of M methods: a better, b worse, c undecided'."
    counts = frame.decided.value_counts()
    groups = frame.groupby(["regime", "settings"], sort=False).size().items()
    return (f"{len(frame)} findings of {frame.method.nunique()} methods (" + ", ".join(f"{r}, {s} settings: {n}" for (r, s), n in groups) +
            "); " + ", ".join(f"{counts.get(d, 0)} {d}" for d in ("better", "worse", "undecided")))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="the clone's results/ folder: the stored studies the wheel's summaries come from")
    args = ap.parse_args(argv)
    clone = Path(args.results).resolve()
    import dml_book
    from dml_book.findings import findings
    from dml_book.results import results_dir
    where = Path(dml_book.__file__).resolve().parent
    if where.is_relative_to(clone.parent): sys.exit(f"wheel_check: dml_book is imported from the clone ({where}), not from an install")
    if results_dir().resolve() != where/"_results": sys.exit(f"wheel_check: findings are read from {results_dir()}, not from the wheel's {where/'_results'}")
    shipped, expected = findings(), findings(root=clone)
    print(shipped.to_string())
    found = problems(shipped, expected) + infeasible_problems(None, clone)
    for p in found: print(f"wheel_check: {p}")
    if found: sys.exit(1)
    print(f"wheel_check: the installed dml_book ({where}) reports the clone's {summary(shipped)}")


if __name__ == "__main__": main()
