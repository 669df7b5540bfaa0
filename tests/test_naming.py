"""One naming scheme for presets and experiment variants: lowercase words joined by hyphens (a word may end in a decimal
number, e.g. `dmml-tau0.2`). Presets read `<dataset>[-<loss>][-<ablation>]`, with `paper` in place of the dataset when the
preset names none (`cub200-tr`, `glyphs-no-rein`, `paper-triplet-no-softmax`); experiment variants read
`<method or baseline>[-<ablation>]` (`ala-random`, `dcml-no-jt`, `dmml-m16`)."""
import json, re
from pathlib import Path
import pytest, yaml
from dml_book.registry import METHODS
import dml_book.methods  # fills METHODS
from dml_book.results import notebook_parameters

ROOT = Path(__file__).resolve().parents[1]
WORD = r"[a-z0-9]+(?:\.[0-9]+)?"
NAME = re.compile(rf"{WORD}(?:-{WORD})*")


def follows(name: str) -> bool: return NAME.fullmatch(name) is not None


def test_the_scheme_rejects_the_old_spellings():
    assert all(map(follows, ["paper", "cub200-tr", "paper-triplet-no-softmax", "glyphs-no-rein", "dmml-tau0.2", "ala-meta-steps1"]))
    assert not any(map(follows, ["paper_triplet", "dmml-no_margin", "dmml-M16", "Cub200", "cub200--tr", "-tr", "tau0.x", ""]))


@pytest.mark.parametrize("method", [m for m in METHODS.names() if METHODS.get(m).presets])
def test_preset_names_follow_the_scheme(method):
    bad = [p for p in METHODS.get(method).presets if not follows(p)]
    assert not bad, f"{method}: preset names {bad} are not lowercase words joined by hyphens"


def _protocol_names(path: Path) -> list[str]:
    "The variant names an experiment notebook declares: its `variants` default and the keys of its `protocol` and sweeps."
    names = list(notebook_parameters(path)["variants"]["default"])
    for cell in json.loads(path.read_text())["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or "protocol = {" not in src: continue
        names += re.findall(r'"([^"{}]+)":', src)                                     # literal keys
        names += [re.sub(r"\{[^}]*\}", "1", k) for k in re.findall(r'f"([^"]+)":', src)]   # f-string keys, with a number
    return names


EXPERIMENTS = [p for p in sorted((ROOT/"nbs"/"experiments").glob("*.ipynb")) if p.stem not in ("train_eval", "pretrain")]   # pretrain: one backbone, no variants

@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_experiment_variant_names_follow_the_scheme(path):
    names = _protocol_names(path)
    assert len(names) > 2, f"{path.name}: found no protocol"   # the parser still finds the variants
    bad = [n for n in names if not follows(n)]
    assert not bad, f"{path.name}: variant names {bad} are not lowercase words joined by hyphens"


@pytest.mark.parametrize("path", sorted((ROOT/"params").glob("*.yaml")), ids=lambda p: p.stem)
def test_parameter_files_name_variants_in_the_scheme(path):
    bad = [n for n in yaml.safe_load(path.read_text()).get("variants", []) if not follows(n)]
    assert not bad, f"{path.name}: variants {bad} are not lowercase words joined by hyphens"
