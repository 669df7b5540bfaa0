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
}
# A few numbers read off the papers' tables: (paper, table, row, dataset, metric) -> value.
SPOT = {
    ("hdml", "Table 1", "HDML (N-pair)", "cub200", "R@1"): 53.7,
    ("hdml", "Table 2", "Triplet", "cars196", "NMI"): 52.9,
    ("hdml", "Table 3", "DAML (N-pair)", "sop", "R@100"): 92.3,
}

@pytest.mark.parametrize("paper", sorted(ROWS))
def test_sources_values_and_monotone_recall(paper):
    df = read_published(PUB/f"{paper}.csv")
    assert df.source.str.contains(r"Table \d").all() and (df.source.str.contains("Table") & df.table.notna()).all()
    assert df.value.between(0, 100).all()
    rk = df[df.metric.str.match(r"R@\d+$")].assign(k=lambda d: d.metric.str[2:].astype(int))
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
