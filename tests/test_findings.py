"""What we found, computed and never typed: the README's first table and the findings page's every line equal the
stored studies read by hand, the front page "What we found" shows the verdicts (tests/test_saved_outputs.py checks its saved outputs against a fresh execution), and the README's links resolve on a
repository viewer (relative links to files of the repository, none to unbuilt `*.html` pages)."""
import json, re, sys
from pathlib import Path
import numpy as np, pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT/"results"
METHODS = ("ala", "hdml", "dcml", "pads", "dmml")


def _paired(folder: Path, arm: str, base: str = "baseline") -> set:
    seeds = lambda a: {f.parent.name for f in (folder/a).glob("seed*/metrics.json")}
    return seeds(arm) & seeds(base)


def by_hand(folder: Path, arm: str, base: str = "baseline"):
    "Mean, low, high (points) and n of the seed-paired final test R@1 differences `arm - base`, from the metrics.json files."
    r1 = lambda a: {int(f.parent.name[4:]): json.loads(f.read_text())["final"]["R@1"] for f in (folder/a).glob("seed*/metrics.json")}
    a, b = r1(arm), r1(base)
    d = 100 * np.array([a[s] - b[s] for s in sorted(a.keys() & b.keys())])
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return d.mean(), d.mean() - half, d.mean() + half, len(d)


def readme_row(method: str) -> str:
    "The method's row of the findings page's every line (the README's methods table carried it before the first screen)."
    nb = json.loads((ROOT/"nbs"/"what_we_found.ipynb").read_text())
    lines = "".join(next(c["source"] for c in nb["cells"] if c.get("id") == "every-line")).splitlines()
    return next(l for l in lines if l.startswith(f"| [{method.upper()}]("))


CELL = re.compile(r"(from scratch|pretrained)((?:, tuned)?): ([+-]\d+\.\d) \(([+-]\d+\.\d) to ([+-]\d+\.\d)\), (\d+) seeds: (better|worse|undecided)")

@pytest.mark.parametrize("method", METHODS)
def test_readme_verdicts_equal_the_stored_studies(method):
    row = readme_row(method)
    said = {(m[0], m[1]): m[2:] for m in CELL.findall(row)}
    for regime, study in (("from scratch", RESULTS/method), ("pretrained", RESULTS/"pretrained"/method)):
        for settings, folder in (("", study), (", tuned", study/"tuned")):
            main = json.loads((folder/"study.json").read_text())["main"][0] if (folder/"study.json").exists() else None
            if main is None or len(_paired(folder, main)) < 2:   # no study, or one still running: no verdict yet
                assert (regime, settings) not in said, (regime, settings, row); continue
            mean, low, high, n = by_hand(folder, main)
            diff, lo, hi, seeds, decided = said[regime, settings]
            assert [float(diff), float(lo), float(hi)] == pytest.approx([mean, low, high], abs=0.051), (regime, settings, row)
            assert int(seeds) == n and decided == ("better" if low > 0 else "worse" if high < 0 else "undecided")
    assert f"([study](experiments/{method}.html))" in row


MOVED = re.compile(r"(from scratch|pretrained), tuned: (?:(?!<br>).)*? \(tuning moved the baseline ([+-]\d+\.\d), (\w+) ([+-]\d+\.\d)\)")

@pytest.mark.parametrize("method", METHODS)
def test_readme_says_how_far_tuning_moved_each_arm(method):
    "Beside a tuned verdict, each arm's mean final test R@1 (over all its seeds) tuned minus at the papers' settings, by hand."
    moved = {m[0]: m[1:] for m in MOVED.findall(readme_row(method))}
    mean = lambda folder, arm: 100 * np.mean([json.loads(f.read_text())["final"]["R@1"] for f in (folder/arm).glob("seed*/metrics.json")])
    for regime, study in (("from scratch", RESULTS/method), ("pretrained", RESULTS/"pretrained"/method)):
        if not (study/"study.json").exists() or not (study/"tuned"/"study.json").exists() or len(_paired(study/"tuned", method)) < 2:
            assert regime not in moved, (regime, moved); continue   # no papers'-settings study or no tuned verdict: nothing to move from
        base, label, own = moved[regime]
        main = json.loads((study/"study.json").read_text())["main"][0]
        assert label == method.upper() and float(base) == pytest.approx(mean(study/"tuned", "baseline") - mean(study, "baseline"), abs=0.051)
        assert float(own) == pytest.approx(mean(study/"tuned", method) - mean(study, main), abs=0.051), (regime, moved)


def test_readme_links_resolve_on_the_repository_viewer():
    readme = (ROOT/"README.md").read_text()
    links = [l.split("#")[0] for l in re.findall(r"\]\(([^)\s]+)\)", readme) if not re.match(r"[a-z]+:|#", l)]
    assert links and not [l for l in links if l.endswith(".html")], links
    missing = [l for l in links if not (ROOT/l).exists()]
    assert not missing, missing


def _outputs(nb: dict) -> dict:
    "Cell id -> its outputs' text (markdown, plain text, streams) and whether it holds a figure."
    out = {}
    for c in nb["cells"]:
        if c["cell_type"] != "code": continue
        texts = [o.get("data", {}).get("text/markdown") or o.get("text") or "" for o in c.get("outputs", [])]
        out[c["id"]] = ("".join("".join(t) for t in texts), any("image/png" in o.get("data", {}) for o in c.get("outputs", [])))
    return out


def test_findings_page_shows_the_verdicts_figure_and_table():
    "Its outputs are saved (a fresh execution gives the same: tests/test_saved_outputs.py); here, what they must hold."
    kept = _outputs(json.loads((ROOT/"nbs"/"what_we_found.ipynb").read_text()))
    assert kept["findings-figure"][1] and "| [HDML](experiments/hdml.html) | from scratch |" in kept["findings-table"][0]


FIRST = re.compile(r"^\| \[(\w+)\]\(nbs/[^)]+\) \| (from scratch|pretrained) \| ([^|]+) \| ([^|]+) \|$")
NUMBER = re.compile(r"^([+-]\d+\.\d) \(([+-]\d+\.\d) to ([+-]\d+\.\d)\), Holm: (better|worse|undecided)(; earlier than the plans)?$")

@pytest.mark.parametrize("method", METHODS)
def test_readme_first_table_equals_the_stored_studies(method):
    """Each first-screen row, by hand: the mechanism's effect from a certified study's `<method>` and `<method>-off` arms
    ("not yet measured" without one); against the tuned baseline from the certified baseline, else the study tuned with
    its mechanism at work, marked earlier, else its search's infeasible.json; the interval within 0.05 of the hand's."""
    rows = {m[2]: m.groups()[2:] for l in (ROOT/"README.md").read_text().splitlines()[:60] if (m := FIRST.match(l)) and m[1] == method.upper()}
    assert set(rows) == {"from scratch", "pretrained"}, rows
    for regime, study in (("from scratch", RESULTS/method), ("pretrained", RESULTS/"pretrained"/method)):
        effect, against = (c.strip() for c in rows[regime])
        cert = study/"certified"
        if len(_paired(cert, method, f"{method}-off")) >= 2:
            n = NUMBER.match(effect); mean, low, high, _ = by_hand(cert, method, f"{method}-off")
            assert n and [float(x) for x in n.groups()[:3]] == pytest.approx([mean, low, high], abs=0.051), (regime, effect)
        else: assert effect == "not yet measured", (regime, effect)
        folder, earlier = (cert, False) if len(_paired(cert, method)) >= 2 else (study/"tuned-active", True)
        if len(_paired(folder, method)) >= 2:
            n = NUMBER.match(against); mean, low, high, _ = by_hand(folder, method)
            assert n and [float(x) for x in n.groups()[:3]] == pytest.approx([mean, low, high], abs=0.051), (regime, against)
            assert bool(n.group(5)) == earlier, (regime, against)
        elif (study/"tuning"/f"{method}-active"/"infeasible.json").is_file():
            assert against == "no setting kept the mechanism at work; earlier than the plans", (regime, against)
        else: assert against == "not yet measured", (regime, against)


def test_print_findings_shows_its_settings_column():
    "`print(findings())` names each line's settings (pandas would fold that column into '...')."
    sys.path.insert(0, str(ROOT))
    from dml_book.findings import findings
    f = findings(["hdml"], RESULTS)
    shown = str(f)
    assert "settings" in shown.splitlines()[0] and "tuned, mechanism at work" in shown and "..." not in shown


def test_icons_studies_leave_the_glyphs_xl_findings_as_they_were(tmp_path):
    "Studies on icons (results/icons/<method>/) are read as the icons regime; `findings()`, the first screen and Holm's family stay glyphs-XL's."
    import shutil
    sys.path.insert(0, str(ROOT))
    from dml_book.findings import findings, finding, first_screen, ICONS
    from dml_book.study_design import study_spec, describe
    store = tmp_path/"results"
    skip = shutil.ignore_patterns("tuning", "*.pt", "*.pth", "*.db")
    for study in ("hdml", "pretrained/hdml"): shutil.copytree(RESULTS/study, store/study, ignore=skip)   # HDML's every stored line
    before, screen = findings(["hdml"], store), first_screen(["hdml"], store)
    icons = store/"icons"/"hdml"   # the stored glyphs-XL HDML study's runs, as if on icons
    shutil.copytree(RESULTS/"hdml", icons, ignore=shutil.ignore_patterns("tuned*", "tuning", "certified", "*.pt", "*.pth", "*.db"))
    (icons/"study.json").write_text(json.dumps(describe(study_spec("icons/hdml")), default=str))
    after = findings(["hdml"], store)
    assert after.equals(before) and len(after) >= 3 and ICONS not in set(after.regime)
    assert first_screen(["hdml"], store).equals(screen)
    f, g = finding("hdml", ICONS, store), finding("hdml", root=RESULTS)
    assert (f["diff"], f["seeds"], f["decided"]) == (g["diff"], g["seeds"], g["decided"]) and "icons" in f["verdict"] and "glyphs-XL" not in f["verdict"]
