"""Every paper preset of every method trains one step end to end on the CPU, from `dml-book train`, on a replica of its
dataset's archive layout, without pretrained weights. The presets are read from the registry, so a preset added later
is covered without touching this file. One preset per distinct path (method x its non-numeric settings: dataset,
backbone, transform, loss, ...) runs in the test command; presets differing from an earlier one only in numbers are `slow`.
Batch sizes, image sizes and crops are the presets' own; the replicas hold enough training classes for every batch
structure, and few test images, so that the one step and the evaluation stay short."""
import pytest
import dml_book.methods  # noqa: F401  (fills METHODS)
from dml_book.registry import METHODS
from dml_book.data.replicas import write_cub, write_cars, write_sop, write_market, write_duke, write_veri

TRAIN = tuple(range(1, 65))   # 64 training classes: ALA's episodes (100 + 20 images) and DMML's 32-class tasks fill
REPLICAS = dict(cub200=lambda r: write_cub(r, classes=TRAIN + (101, 102, 103, 104), per_class=3),
                cars196=lambda r: write_cars(r, classes=TRAIN + (99, 100, 101, 102), per_class=3),
                sop=lambda r: write_sop(r, n_train=64, n_test=4, per_class=3),
                market1501=lambda r: write_market(r, train_ids=tuple(range(100, 164)), test_ids=(1, 3, 4)),
                dukemtmc=lambda r: write_duke(r, train_ids=tuple(range(100, 164)), test_ids=(2, 6)),
                veri776=lambda r: write_veri(r, train_ids=tuple(range(100, 164)), test_ids=(3, 6, 8)))


def _shape(v):
    "A preset value with its numbers dropped: what decides the code path."
    if isinstance(v, bool) or v is None or isinstance(v, str): return v
    if isinstance(v, (int, float)): return "#"
    if isinstance(v, dict): return tuple(sorted((k, _shape(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)): return tuple(_shape(x) for x in v)
    return type(v).__name__


def _cases():
    seen, cases = set(), []
    for method in METHODS.names():
        for name, preset in METHODS.get(method).presets.items():
            path = (method, tuple(sorted((k, _shape(v)) for k, v in preset.items())))
            marks = [pytest.mark.slow] if path in seen else []
            seen.add(path); cases.append(pytest.param(method, name, id=f"{method}-{name}", marks=marks))
    return cases


@pytest.fixture(scope="module")
def replica_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicas")
    for write in REPLICAS.values(): write(root)
    return root


@pytest.mark.parametrize("method,preset", _cases())
def test_preset_trains_one_step_on_the_cpu(method, preset, replica_root, tmp_path, one_thread):
    from dml_book.cli import main
    dataset = METHODS.get(method).presets[preset].get("dataset") or "cub200"   # a preset naming no dataset: the papers' first
    data_root = None if dataset in ("glyphs", "digits") else str(replica_root)
    argv = ["train", "--method", method, "--preset", preset, "--dataset", dataset, "--no-pretrained", "--epochs", "1",
            "--max-steps-per-epoch", "1", "--device", "cpu", "--num-workers", "0", "--no-umap", "--no-progress", "--out", str(tmp_path/"run")]
    if data_root: argv += ["--data-root", data_root]
    assert main(argv) == 0
    assert (tmp_path/"run"/"metrics.json").exists()
