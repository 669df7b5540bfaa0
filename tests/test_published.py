"""Published-figures CSVs: each row cites its table, values are percentages, R@k is monotone, row counts match the papers;
the paper's rows line up with our runs by dataset and role, and a run on built-in data never meets them."""
import re
from pathlib import Path
import pytest
from dml_book.results import read_published

PUB = Path(__file__).resolve().parents[1]/"nbs"/"experiments"/"published"

# Rows per table, counted by hand from the papers in shared/papers (the spec, not a computed result).
ROWS = {
    # HDML (Zheng et al., CVPR 2019): Tables 1 (CUB), 2 (Cars196), 3 (SOP) each list 11 methods.
    "hdml": {"Table 1": 11, "Table 2": 11, "Table 3": 11},
    # DCML (Zheng et al., CVPR 2021): Table 1 ablation 5 rows, Table 2 compositors 4 rows; Tables 3 (CUB) and
    # 4 (Cars196): 17 single + 6 ensemble + 4 baseline/DCML pairs = 31; Table 5 (SOP): 16 + 5 + 3 pairs = 27.
    "dcml": {"Table 1": 5, "Table 2": 4, "Table 3": 31, "Table 4": 31, "Table 5": 27},
    # DMML (Chen et al., ICCV 2019): Tables 1 (Market-1501) 15, 2 (DukeMTMC-reID) 10, 3 (baselines) 8,
    # 4 (ablations) 6, 5 (M / n_s) 6, 6 (VeRi-776) 8 methods.
    "dmml": {"Table 1": 15, "Table 2": 10, "Table 3": 8, "Table 4": 6, "Table 5": 6, "Table 6": 8},
    # ALA (Zheng et al., CVPR 2020): Tables 1-2 four rows each; sampling methods on CUB (3) and Cars196 (4) 9 rows, on
    # SOP (5) 8 (no smart mining); losses with and without ALA (6-8) 4 reference losses + 3 pairs = 10.
    "ala": {"Table 1": 4, "Table 2": 4, "Table 3": 9, "Table 4": 9, "Table 5": 8, "Table 6": 10, "Table 7": 10, "Table 8": 10},
    # PADS (Roth et al., CVPR 2020): Table 1 8 rows; Table 2 9 + 2 + 3 (section headers are not rows); Table 3 2 x 3
    # cells; Table 4 3; Table 5 (a) 4, (b) 4, (c) 3 columns; supplementary Table 6 10 + 2 + 3, Table 7 4 columns,
    # Table 8 7 states x 3 rewards, Table 9 (a) 7 and (b) 4 columns, Table 10 8 rows.
    "pads": {"Table 1": 8, "Table 2": 14, "Table 3": 6, "Table 4": 3, "Table 5a": 4, "Table 5b": 4, "Table 5c": 3,
             "Table 6": 15, "Table 7": 4, "Table 8": 21, "Table 9a": 7, "Table 9b": 4, "Table 10": 8},
}
# A few numbers read off the papers' tables: (paper, table, row, dataset, metric) -> value.
SPOT = {
    ("hdml", "Table 1", "HDML (N-pair)", "cub200", "R@1"): 53.7,
    ("hdml", "Table 2", "Triplet", "cars196", "NMI"): 52.9,
    ("hdml", "Table 3", "DAML (N-pair)", "sop", "R@100"): 92.3,
    ("dcml", "Table 3", "DCML-MDW", "cub200", "R@1"): 68.4,
    ("dcml", "Table 4", "Margin-DW [63]", "cars196", "NMI"): 71.0,
    ("dcml", "Table 5", "Ranked [59]", "sop", "R@10"): 91.3,
    ("dmml", "Table 1", "PCB [49]", "market1501", "mAP"): 77.4,
    ("dmml", "Table 3", "Lifted Struct", "veri776", "CMC@5"): 96.1,
    ("dmml", "Table 4", "DMML w/o hard mining", "market1501", "mAP"): 70.3,
    ("dmml", "Table 5", "DMML (M=32, n_s=7)", "market1501", "CMC@1"): 92.7,
    ("ala", "Table 1", "ALA (random)", "cub200", "F1"): 25.5,
    ("ala", "Table 2", "Triplet (training)", "cub200_train", "R@1"): 65.2,   # the training split: a key of its own
    ("ala", "Table 5", "DVML", "sop", "R@100"): 91.8,
    ("ala", "Table 6", "Clustering", "cub200", "NMI"): 59.2,   # merged cells in the extraction: four rows in one line
    ("ala", "Table 6", "N-pair", "cub200", "F1"): 28.2,        # ... and three F1 values for them (Clustering has none)
    ("ala", "Table 7", "Margin + ALA", "cars196", "R@1"): 80.5,
    ("ala", "Table 8", "Cont + ALA", "sop", "R@10"): 58.5,
    ("pads", "Table 1", "Margin[60] + PADS (Ours)", "sop", "R@100"): 95.4,
    ("pads", "Table 1", "Triplet[49] + semihard (orig)", "cars196", "NMI"): 53.4,
    ("pads", "Table 2", "MIC[45]", "sop", "R@10"): 89.4,
    ("pads", "Table 2", "DREML[62]", "cars196", "NMI"): 76.4,
    ("pads", "Table 3", "fix pi_theta (same init)", "cub200", "R@1"): 65.8,
    ("pads", "Table 5c", "init N(0.5, 0.05)", "cub200", "NMI"): 68.6,
    ("pads", "Table 6", "Ours(Margin[60] + PADS, IBN)", "cars196", "R@4"): 93.0,
    ("pads", "Table 8", "state: Recall, Dist.; reward: R@1 + NMI", "cub200", "NMI"): 69.4,
    ("pads", "Table 9a", "M = inf", "cub200", "R@1"): 61.9,
}
# Cells printed as '-' (not reported) have no row: (paper, table, row, dataset, metric).
ABSENT = [("ala", "Table 3", "Smart mining", "cub200", "F1"), ("ala", "Table 4", "DE-DSP", "cars196", "R@8"),
          ("ala", "Table 6", "Clustering", "cub200", "F1"), ("pads", "Table 2", "HTG[63]", "sop", "R@1"),
          ("pads", "Table 6", "SOFT-TRIPLE[43]", "sop", "R@1")]
ROLES = {"baseline", "method", "ablation", "other"}

@pytest.mark.parametrize("paper", sorted(ROWS))
def test_sources_values_and_monotone_recall(paper):
    df = read_published(PUB/f"{paper}.csv")
    assert df.source.str.contains(r"Table \d").all() and (df.source.str.contains("Table") & df.table.notna()).all()
    assert df.value.between(0, 100).all()
    rk = df[df.metric.str.match(r"(R|CMC)@\d+$")].assign(k=lambda d: d.metric.str.split("@").str[1].astype(int))
    for key, g in rk.groupby(["table", "row", "dataset"]):
        assert g.sort_values("k").value.is_monotonic_increasing, key

@pytest.mark.parametrize("paper", sorted(ROWS))
def test_rows_per_table_match_the_paper(paper):
    df = read_published(PUB/f"{paper}.csv")
    assert df.groupby("table").row.nunique().to_dict() == ROWS[paper]

def test_spot_checks():
    for (paper, table, row, ds, metric), v in SPOT.items():
        df = read_published(PUB/f"{paper}.csv")
        hit = df[(df.table == table) & (df.row == row) & (df.dataset == ds) & (df.metric == metric)]
        assert hit.value.tolist() == [v], (paper, table, row, ds, metric)
    for paper, table, row, ds, metric in ABSENT:
        df = read_published(PUB/f"{paper}.csv")
        assert not ((df.table == table) & (df.row == row) & (df.dataset == ds) & (df.metric == metric)).any()

@pytest.mark.parametrize("paper", sorted(ROWS))
def test_roles_and_one_value_per_cell(paper):
    "Every row has a role; every paper has its own method and baseline rows; a (table, row, dataset, metric) cell is printed once."
    df = read_published(PUB/f"{paper}.csv")
    assert set(df.role) <= ROLES and {"baseline", "method"} <= set(df.role)
    assert not df.duplicated(["table", "row", "dataset", "metric"]).any()
    assert (df.method == df.row).all()


# Like with like: the paper's rows beside our runs (dml_book.results.paper_figures, line_up, published_tables).
def _runs(dataset, variants=("baseline", "ala")):
    import pandas as pd
    return pd.DataFrame([dict(variant=v, method=v, dataset=dataset, loss="triplet", seed=s, stage="selected", epoch=1,
                              metric="R@1", value=.4 + .1 * i + .02 * s, run=f"{v}{s}")
                         for i, v in enumerate(variants) for s in (0, 1)])

def test_paper_rows_line_up_by_dataset_and_role():
    from dml_book.results import line_up, paper_figures, run_dataset, summarize
    ala = read_published(PUB/"ala.csv")
    runs = _runs("cars196")
    lineup = {"baseline": "Triplet", "ala": "Triplet + ALA", "ala-random": "ALA (random)"}
    f = paper_figures(ala, run_dataset(runs), lineup, metrics=("R@1", "NMI"))
    assert set(f.dataset) == {"cars196"} and set(f.table) == {"Table 7"}          # ALA (random): CUB only
    assert sorted(zip(f.variant, f.role, f.metric, f.value)) == [
        ("ala", "method", "NMI", 61.7), ("ala", "method", "R@1", 67.2),
        ("baseline", "baseline", "NMI", 52.9), ("baseline", "baseline", "R@1", 45.1)]
    t = line_up(summarize(runs), ala, "cars196", lineup, metrics=("R@1",))
    assert t[["role", "ours", "paper", "table", "ours R@1", "paper R@1"]].values.tolist() == [
        ["baseline", "baseline", "Triplet", "Table 7", "41.0 ± 1.4", "45.1"], ["method", "ala", "Triplet + ALA", "Table 7", "51.0 ± 1.4", "67.2"]]
    with pytest.raises(ValueError, match="that row is method"): paper_figures(ala, "cub200", {"baseline": "ALA"})
    with pytest.raises(ValueError, match="that row is other"): paper_figures(ala, "cub200", {"ala": "DVML"})
    with pytest.raises(ValueError, match="runs on 2 datasets"): run_dataset(_runs("glyphs").assign(dataset=["glyphs", "cub200"] * 2))

def test_dmml_method_row_comes_from_its_baselines_table():
    "DMML's row is printed in Tables 1 and 3 on Market-1501 with mAP and CMC@1: the one that also prints the baseline wins."
    from dml_book.results import paper_figures
    f = paper_figures(read_published(PUB/"dmml.csv"), "market1501", {"baseline": "Triplet", "dmml": "DMML"}, metrics=("mAP", "CMC@1"))
    assert set(f.table) == {"Table 3"} and f[(f.variant == "dmml") & (f.metric == "mAP")].value.tolist() == [81.0]

@pytest.mark.parametrize("paper", sorted(ROWS))
@pytest.mark.parametrize("dataset", ["glyphs", "digits"])
def test_a_built_in_run_never_meets_the_papers_rows(paper, dataset):
    "Whatever the lineup, a run on built-in data gets no paper row in its table or chart; the paper's tables stay apart."
    import matplotlib; matplotlib.use("Agg")
    from dml_book.results import line_up, paper_figures, published_tables, run_dataset, summarize
    from dml_book.viz import plot_comparison
    pub = read_published(PUB/f"{paper}.csv")
    lineup = {"baseline": pub[pub.role == "baseline"].row.iloc[0], "ala": pub[pub.role == "method"].row.iloc[0]}
    runs = _runs(dataset)
    bars = paper_figures(pub, run_dataset(runs), lineup)
    assert bars.empty and line_up(summarize(runs), pub, dataset, lineup).empty
    fig = plot_comparison(runs, bars.assign(method="paper"), metric="R@1")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["baseline", "ala"]
    tables = published_tables(pub, lineup)
    assert tables and dataset not in tables and set(tables) <= set(pub.dataset)
