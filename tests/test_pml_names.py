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


def installed_version() -> str:
    from importlib.metadata import version
    return version("pytorch-metric-learning")


def stated_version() -> str:
    "The PML version the README says the cross-checks run against."
    section = " ".join((ROOT/"README.md").read_text().split("## Coming from pytorch-metric-learning", 1)[1].split("\n## ", 1)[0].split())
    m = re.search(r"The cross-checks run against PML (\d+\.\d+\.\d+)", section)
    assert m, "the PML section states no version the cross-checks run against"
    return m.group(1)


def test_the_stated_pml_version_is_the_installed_one():
    "The cross-checks import the installed PML: the README names that version (update both when the pin moves)."
    assert installed_version() == stated_version(), f"installed PML {installed_version()}, the README says {stated_version()}"


def test_the_section_covers_pml_2_and_3():
    section = (ROOT/"README.md").read_text().split("## Coming from pytorch-metric-learning", 1)[1].split("\n## ", 1)[0]
    for said in ("batch_sampler=", "pytorch_metric_learning.evaluation", "CustomKNN", "FaissKNN", "InferenceModel", "3.12", "2.14"):
        assert said in section, said


def test_the_differing_defaults_are_the_signatures():
    column = 2 if installed_version().startswith("2.") else 3   # the installed major version's column is checked
    for row in rows():
        name, pml, said = row[0], row[1], row[column]
        ours = (LOSSES if name.strip("`") in LOSSES.names() else MINERS).get(name.strip("`"))
        if pml == "no counterpart": continue
        theirs = getattr(pml_losses, pml.split("`")[1], None) or getattr(pml_miners, pml.split("`")[1])
        a, b = defaults(ours), defaults(theirs)
        differ = [f"{k} {a[k]} (PML {b[k]})" for k in a if k in b and a[k] != b[k]]
        assert said == (", ".join(differ) or "none") or (column == 3 and not differ and said == "none listed"), (name, said, differ)


def test_the_2x_calls_are_the_installed_pmls():
    "With PML 2.x installed, the section's 2.x sampler call is its signature and its evaluator's k-NN is faiss's by default."
    if not installed_version().startswith("2."): pytest.skip("PML 3.x installed: its calls are the release notes' (no 2.x to check)")
    from pytorch_metric_learning.samplers import MPerClassSampler
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import FaissKNN
    section = (ROOT/"README.md").read_text().split("## Coming from pytorch-metric-learning", 1)[1].split("\n## ", 1)[0]
    assert f"`MPerClassSampler{inspect.signature(MPerClassSampler)}`" in section
    assert isinstance(AccuracyCalculator().knn_func, FaissKNN) and "k-NN by faiss (`FaissKNN`)" in section


def test_the_dev_extra_pins_the_stated_pml_version():
    "A fresh `make install` takes the PML the README names, whatever PyPI has released since: the dev extra pins it."
    pyproject = (ROOT/"pyproject.toml").read_text()
    assert f'"pytorch-metric-learning=={stated_version()}"' in pyproject, "pin pytorch-metric-learning in the dev extra to the README's version"
