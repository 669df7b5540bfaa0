"""The README's "coming from pytorch-metric-learning" table: each dml_book loss or miner names its PML class, and the
defaults that differ are exactly those the two signatures give (parameters both take, with unequal defaults)."""
import inspect, re
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
pml_losses = pytest.importorskip("pytorch_metric_learning.losses")
from pytorch_metric_learning import miners as pml_miners
from dml_book.registry import LOSSES, MINERS
import dml_book.losses, dml_book.miners  # noqa: F401  (fill the registries)


def rows():
    readme = (ROOT/"README.md").read_text()
    section = readme.split("## Coming from pytorch-metric-learning", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in l.strip("|").split("|")] for l in section.splitlines() if l.startswith("| `")]


def defaults(cls) -> dict:
    return {k: p.default for k, p in inspect.signature(cls).parameters.items() if p.default is not inspect.Parameter.empty}


def test_every_loss_and_miner_is_a_row():
    assert sorted(r[0].strip("`") for r in rows()) == sorted(LOSSES.names() + MINERS.names())


def test_the_differing_defaults_are_the_signatures():
    for name, pml, said in rows():
        ours = (LOSSES if name.strip("`") in LOSSES.names() else MINERS).get(name.strip("`"))
        if pml == "no counterpart": continue
        theirs = getattr(pml_losses, pml.split("`")[1], None) or getattr(pml_miners, pml.split("`")[1])
        a, b = defaults(ours), defaults(theirs)
        differ = [f"{k} {a[k]} (PML {b[k]})" for k in a if k in b and a[k] != b[k]]
        assert said == (", ".join(differ) or "none"), (name, said, differ)
