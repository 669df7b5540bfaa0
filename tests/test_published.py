"Published-figures CSVs: each row cites its table, values are percentages, R@k is monotone, row counts match the papers."
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
}

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
