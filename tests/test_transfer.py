"Transfer between benchmarks: per method its papers'-settings line on glyphs-XL and on icons, the share that agree, the rank correlation with a bootstrap over seeds."
import json
from pathlib import Path
import numpy as np
from scipy import stats
from dml_book.findings import transfer, rank_transfer, transfer_markdown, agrees, paired_points, STUDY_FOLDERS, BENCHMARKS, NOT_RUN

BASE = [0.50, 0.52, 0.49, 0.51]
EFFECTS = {"glyphs-XL": {"ala": [1, 2, 1.5, 2.5], "dcml": [-3, -4, -2, -3], "dmml": [3, -2, 1, -1], "hdml": [6, 5, 7, 6], "pads": [2, 3, 2, 3]},
           "icons": {"ala": [-3, 3, 2, -2], "dcml": [-5, -6, -4, -5], "dmml": [2, 3, 2.5, 3.5], "hdml": [4, 5, 4, 5, 6]}}   # HDML: a fifth seed on icons


def write_study(root: Path, folder: str, method: str, r1: dict):
    "A stored papers'-settings study: arm -> final test Recall@1 per seed, its design naming `method` the main arm."
    (root/folder).mkdir(parents=True, exist_ok=True)
    (root/folder/"study.json").write_text(json.dumps(dict(name=folder, baseline="baseline", main=[method], primary=dict(metric="R@1", stage="final"),
                                                          arms={a: dict(label=a, differs={}) for a in r1})))
    for arm, values in r1.items():
        for s, v in enumerate(values):
            p = root/folder/arm/f"seed{s}"; p.mkdir(parents=True)
            (p/"metrics.json").write_text(json.dumps(dict(config=dict(method=method if arm != "baseline" else "baseline", dataset="glyphs_xl", loss="triplet",
                                                                      seed=s, epochs=2, method_kwargs={}), environment={}, final={"R@1": v},
                                                          epochs=[dict(epoch=2, **{"R@1": v})], mechanism=None)))
            (p/"run.json").write_text(json.dumps(dict(device="cpu", gpu=None, cpu_seconds=1.0, wall_seconds=1.0, threads=1)))


def pair_of_stores(root: Path) -> Path:
    for b, effects in EFFECTS.items():
        for m, e in effects.items():
            base = BASE + [0.50] * (len(e) - len(BASE))
            write_study(root, STUDY_FOLDERS[BENCHMARKS[b]].format(method=m), m, {"baseline": base, m: [x + d / 100 for x, d in zip(base, e)]})
    return root


def spearman_by_hand(x, y) -> float:
    "Spearman's rho without ties: 1 - 6 sum d^2 / (n (n^2 - 1)) of the ranks."
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y)); n = len(x)
    return 1 - 6 * float(((rx - ry) ** 2).sum()) / (n * (n * n - 1))


def test_the_table_and_its_agreement(tmp_path):
    t = transfer(root=pair_of_stores(tmp_path))
    assert list(t.method) == ["ala", "dcml", "dmml", "hdml", "pads"]
    assert [None if f is None else f["decided"] for f in t["glyphs-XL"]] == ["better", "worse", "undecided", "better", "better"]
    assert [None if f is None else f["decided"] for f in t["icons"]] == ["undecided", "worse", "better", "better", None]
    assert list(t.agree) == [False, True, False, True, None]
    assert t.sentence[1] == "DCML: worse on glyphs-XL and worse on icons (-5.0 points), so its finding transfers."
    assert t.sentence[0].endswith("so its finding does not transfer.") and t.sentence[4] == f"PADS: icons {NOT_RUN}, so whether its finding transfers is not known."
    h = t.icons[3]   # HDML on icons, by hand: five paired differences, their mean and t-interval
    d = np.array(EFFECTS["icons"]["hdml"], float); half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
    assert np.allclose([h["diff"], h["low"], h["high"]], [d.mean(), d.mean() - half, d.mean() + half], atol=1e-9)
    assert np.allclose(paired_points(h, tmp_path), d, atol=1e-9)
    md = transfer_markdown(t, rank_transfer(t, tmp_path, draws=50)).splitlines()
    assert md[8] == "Lines that agree in sign and label: 2 of 4 (50%)." and md[6] == f"| PADS | {md[6].split(' | ')[1]} | {NOT_RUN} |  |"


def test_agreement_needs_sign_and_label():
    line = lambda diff, decided: dict(diff=diff, decided=decided)
    assert agrees(line(2, "better"), line(0.5, "better")) and not agrees(line(2, "better"), line(0.5, "undecided"))
    assert not agrees(line(0.3, "undecided"), line(-0.3, "undecided"))   # same label, opposite sign


def test_the_rank_correlation_and_its_bootstrap_by_hand(tmp_path):
    t = transfer(root=pair_of_stores(tmp_path))
    c = rank_transfer(t, tmp_path, draws=300, seed=7)
    assert c["methods"] == ["ala", "dcml", "dmml", "hdml"] and c["why"] is None
    g = [np.array(EFFECTS["glyphs-XL"][m], float) for m in c["methods"]]
    i = [np.array(EFFECTS["icons"][m], float) for m in c["methods"]]
    assert np.isclose(c["rho"], spearman_by_hand([x.mean() for x in g], [x.mean() for x in i]), atol=1e-12)
    assert np.isclose(c["rho"], stats.spearmanr([x.mean() for x in g], [x.mean() for x in i]).statistic, atol=1e-12)
    assert np.isclose(c["rho"], 0.8)   # ranks (ALA, DCML, DMML, HDML): 2, 0, 1, 3 against 1, 0, 2, 3
    rng = np.random.default_rng(7)   # the bootstrap by hand: resample each method's paired seeds on each benchmark, rank the means again
    boot = []
    for _ in range(300):
        bg = [rng.choice(x, len(x)).mean() for x in g]; bi = [rng.choice(x, len(x)).mean() for x in i]
        if len(set(np.round(bg, 12))) == 4 and len(set(np.round(bi, 12))) == 4: boot.append(spearman_by_hand(bg, bi))
        else: boot.append(stats.spearmanr(bg, bi).statistic)   # ties: scipy's average ranks
    boot = np.array(boot); boot = boot[~np.isnan(boot)]
    assert c["draws"] == len(boot)
    assert np.allclose([c["low"], c["high"]], np.quantile(boot, [0.025, 0.975]), atol=1e-9)
    assert c == rank_transfer(t, tmp_path, draws=300, seed=7) and c["low"] < c["high"]


def test_fewer_than_three_methods_on_both_give_no_correlation(tmp_path):
    pair_of_stores(tmp_path)
    t = transfer(["ala", "dcml", "pads"], tmp_path)
    c = rank_transfer(t, tmp_path)
    assert c["rho"] is None and c["why"] == "2 method(s) have a stored study on both benchmarks; a rank correlation needs at least 3."
    assert transfer_markdown(t, c).splitlines()[7] == f"No rank correlation: {c['why']}"


def test_not_yet_run_on_the_stored_results():
    t = transfer()
    assert all(f is not None for f in t["glyphs-XL"]) and list(t.icons) == [None] * 5
    md = transfer_markdown(t, rank_transfer(t))
    assert md.count(f"| {NOT_RUN} |") == 5 and "No rank correlation: 0 method(s) have a stored study on both benchmarks" in md
    assert all(s.endswith(f"icons {NOT_RUN}, so whether its finding transfers is not known.") for s in t.sentence)
