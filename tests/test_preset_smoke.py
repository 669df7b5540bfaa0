"""Every paper preset of every method trains one step end to end on the CPU, through `dml-book train`'s own entry point
(`dml_book.cli.main`), on a replica of its dataset's archive layout, without pretrained weights, as a user would type

    dml-book train --method M --preset P --dataset D --data-root REPLICA --no-pretrained --epochs 1 \
                   --max-steps-per-epoch 1 --device cpu

so that a crash a CPU finds in seconds is not met an hour into a GPU run. The presets are read from the registry: one
added later is covered without touching this file. A second, instant test passes every preset, exactly as the paper
gives it, through the validation boundary (`check_config`).

What runs is the preset's own path: its backbone (ResNet-50 with its last stride, GoogLeNet, the small CNN) built in
full from random weights, its image pipeline at its own size and crop (the replicas' tiny JPEGs are resized to
224/227 or 256 x 128 as photos are), its loss, miner, learning-rate groups and schedule, frozen BatchNorm, sampler
structure and method, the evaluation before and after the step, checkpoint, log and metrics.json (whose config the
test compares with the preset). ResNet-50 costs about 0.1 s of one CPU core per 224 x 224 image forward, so these
numbers, and only these, are overridden:

- the batch: the fewest classes the preset's sampler structure takes, its images per class kept. Class-balanced
  batches: 2 classes x `m_per_class`; HDML's triplet batches: one (anchor, positive, negative) triple; ALA's
  episodes: 2 classes x `m_per_class` in the training and in the validation subset (`n_train = n_val = 2 m`); DMML's
  tasks: 2 classes x (`n_support` + `n_query`) (`n_classes=2`), one task per epoch. The papers' 112-192 images would
  take a minute a step.
- PADS: `update_every=1`, so that the one step includes a policy step and with it the reward's evaluation on the
  held-out split (otherwise first reached at step 30).
- SOP's Recall@k levels (1, 10, 100, 1000) -> (1, 2, 4, 8), in the evaluation and in PADS's reward state: Recall@1000
  needs a gallery of 1000 images.
- the built-in glyphs (DCML's `glyphs*` presets, ALA's `paper`): 16 x 16 pixels, one image per font
  (`--dataset-kwargs`), a quarter of the pixels and half the images of the default, which each evaluation embeds.
- `--epochs 1 --max-steps-per-epoch 1`, as the command above.

A preset naming no dataset runs on `TrainConfig`'s default, the glyphs, when it names no backbone either (ALA's
`paper`: method settings only), else on CUB-200-2011, the first dataset of its paper (ALA's and HDML's GoogLeNet
presets). All runs share one Python process (torch and torchvision are imported once) and two sets of replicas.

The test command runs every preset. One preset per distinct path is unmarked (the quick loop, `-m "not slow"`): a
preset is `slow` when every setting in it that is not a number (the path method x dataset x backbone; the loss, miner,
transform, each method argument ...) already appears in a cheaper or earlier preset of the same method, so that it
differs from those only in numbers or combines settings they already ran (DCML's loss variants on ResNet-50, run on
the glyphs first; HDML's N-pair ablations, run with the triplet loss first; alpha = 0). A slow preset on image files
runs at 64 x 64 pixels (`--image-size 64`, a sixteenth of the ResNet-50's work): what it adds is its loss or method
setting, and its image pipeline at the preset's own size already ran in the preset that claimed its path.
"""
import json
import pytest
import dml_book.methods  # noqa: F401  (fills METHODS)
from dml_book.registry import METHODS
from dml_book.train import preset_config
from dml_book.data.replicas import write_cub, write_cars, write_sop, write_market, write_duke, write_veri


def _dataset(preset: dict) -> str:
    "A preset's dataset; one naming none: `TrainConfig`'s default (glyphs) for the small CNN, else CUB-200-2011."
    return preset.get("dataset") or ("glyphs" if preset.get("backbone", "smallcnn") == "smallcnn" else "cub200")

TRAIN, TRAIN_IDS, REID_CAMS = tuple(range(1, 6)), tuple(range(100, 104)), dict(n_cams=5, per_cam=1)

def write_replicas(root, per_class: int = 3, test_classes: int = 3):
    "The six archives in `root`: 5 training classes (4 identities), test splits of 9 images or a re-id gallery of 10 (CMC@10)."
    write_cub(root, classes=TRAIN + tuple(range(101, 101 + test_classes)), per_class=per_class)
    write_cars(root, classes=TRAIN + tuple(range(99, 99 + test_classes)), per_class=per_class)
    write_sop(root, n_train=30, n_test=3, per_class=3)      # PADS holds out 10% of the classes: 3 x 3 images
    write_market(root, train_ids=TRAIN_IDS, test_ids=(1, 3), **REID_CAMS, distractors=0)
    write_duke(root, train_ids=TRAIN_IDS, test_ids=(2, 6), **REID_CAMS)
    write_veri(root, train_ids=TRAIN_IDS, test_ids=(3, 6), **REID_CAMS)

# PADS's reward split holds out 15% of each training class of CUB and Cars: with 10 images per class, 2 (10 in all, more
# than Recall@8 needs, each with a match); its runs read replicas of 10 images per class, the others of 3.
REPLICA_SIZES = {"small": dict(per_class=3, test_classes=3), "pads": dict(per_class=10, test_classes=2)}
GLYPHS = {"per_font": 1, "size": 16}   # the built-in glyphs at a quarter of the pixels and half the images
COST = {"smallcnn": 0, "resnet18": 1, "googlenet": 1, "resnet50": 2}   # cheaper presets claim the shared settings first


def _shape(v):
    "A preset value with its numbers dropped: what decides the code path."
    if isinstance(v, bool) or v is None or isinstance(v, str): return v
    if isinstance(v, (int, float)): return "#"
    if isinstance(v, dict): return tuple(sorted((k, _shape(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)): return tuple(_shape(x) for x in v)
    return type(v).__name__


def _settings(method: str, preset: dict) -> set:
    "What is not a number in a preset: its path (method, dataset, backbone) and each other field or method argument."
    path = {(method, "path", _dataset(preset), preset.get("backbone", "smallcnn"))}
    kwargs = {(method, "method_kwargs", k, _shape(v)) for k, v in preset.get("method_kwargs", {}).items()}
    return path | kwargs | {(method, k, _shape(v)) for k, v in preset.items() if k not in ("dataset", "backbone", "method_kwargs")}


def _slow() -> set:
    "The (method, preset) pairs all of whose settings already appear in a cheaper or earlier preset of the method."
    presets = [(m, n, p) for m in METHODS.names() for n, p in METHODS.get(m).presets.items()]
    seen, slow = set(), set()
    for m, n, p in sorted(presets, key=lambda mnp: COST.get(mnp[2].get("backbone", "smallcnn"), 3)):   # stable: written order within a cost
        new = _settings(m, p) - seen
        if not new: slow.add((m, n))
        seen |= new
    return slow

SLOW = _slow()
SLOW_SIDE = 64   # the side a slow preset's images are cropped to: its pipeline at the preset's own size ran in the preset that claimed it

def _cases():
    "Every (method, preset); `slow` when all its settings already appear in a cheaper or earlier preset of the method."
    return [pytest.param(m, n, id=f"{m}-{n}", marks=[pytest.mark.slow] if (m, n) in SLOW else [])
            for m in METHODS.names() for n in METHODS.get(m).presets]


SIZES = ("n_train", "n_val", "n_classes", "tasks_per_epoch", "update_every", "recall_ks")   # method arguments overridden

def smallest_run(method: str, preset: str) -> list[str]:
    "The overriding flags of the module docstring: the fewest classes per batch the preset's sampler takes, and so on."
    cfg = preset_config(method, preset)
    kw, args = dict(cfg.method_kwargs), []
    if method == "ala": kw.update(n_train=2 * cfg.m_per_class, n_val=2 * cfg.m_per_class)
    elif method == "dmml":
        kw.update(n_classes=2, tasks_per_epoch=1)
        args += ["--batch-size", str(2 * (kw.get("n_support", 5) + kw.get("n_query", 1)))]
    elif method == "hdml" and kw.get("triplet_batches") and cfg.loss == "triplet": args += ["--batch-size", "3"]
    else: args += ["--batch-size", str(2 * cfg.m_per_class)]
    if method == "pads": kw["update_every"] = 1
    if max(cfg.ks) > 8:
        args += ["--ks", "1", "2", "4", "8"]
        if "recall_ks" in kw: kw["recall_ks"] = [1, 2, 4, 8]
    if kw != cfg.method_kwargs: args += ["--method-kwargs", json.dumps(kw)]
    if _dataset(METHODS.get(method).presets[preset]) == "glyphs": args += ["--dataset-kwargs", json.dumps(GLYPHS)]
    elif (method, preset) in SLOW and cfg.backbone != "smallcnn": args += ["--image-size", str(SLOW_SIDE)]
    return args


def _argv(method: str, preset: str, data_root, out) -> list[str]:
    return ["train", "--method", method, "--preset", preset, "--dataset", _dataset(METHODS.get(method).presets[preset]),
            "--data-root", str(data_root), "--no-pretrained", "--epochs", "1", "--max-steps-per-epoch", "1",
            "--device", "cpu", "--num-workers", "0", "--no-umap", "--no-progress", "--out", str(out),
            "--allow-collapse",   # one step on a replica: whether the embedding spreads is not this test's question
            *smallest_run(method, preset)]


def _as_json(v): return json.loads(json.dumps(v))   # tuples as lists, as metrics.json holds them


@pytest.fixture(scope="module")
def replica_roots(tmp_path_factory) -> dict:
    roots = {name: tmp_path_factory.mktemp(f"replicas_{name}") for name in REPLICA_SIZES}
    for name, root in roots.items(): write_replicas(root, **REPLICA_SIZES[name])
    return roots


@pytest.mark.parametrize("method,preset", [pytest.param(m, n, id=f"{m}-{n}") for m in METHODS.names() for n in METHODS.get(m).presets])
def test_preset_passes_the_validation_boundary(method, preset, tmp_path):
    "Every preset, exactly as the paper gives it (no override but the weights), passes `check_config` (milliseconds each)."
    from dml_book.config import check_config
    check_config(preset_config(method, preset, pretrained=False, data_root=str(tmp_path), device="cpu"))


@pytest.mark.parametrize("method,preset", _cases())
def test_preset_trains_one_step_on_the_cpu(method, preset, replica_roots, tmp_path, one_thread):
    from dml_book.cli import main
    out, own = tmp_path/"run", METHODS.get(method).presets[preset]
    argv = _argv(method, preset, replica_roots["pads" if method == "pads" else "small"], out)
    assert main(argv) == 0
    cfg = json.loads((out/"metrics.json").read_text())["config"]
    flags = {a[2:].removeprefix("no-").replace("-", "_") for a in argv if a.startswith("--")} - {"method", "preset", "dataset"}
    assert {k: cfg[k] for k in own if k not in flags} == {k: _as_json(v) for k, v in own.items() if k not in flags}
    same = lambda kw: {k: _as_json(v) for k, v in kw.items() if k not in SIZES}   # method arguments but the sizes
    assert same(cfg["method_kwargs"]) == same(own.get("method_kwargs", {}))
    log = [json.loads(line) for line in (out/"log.jsonl").read_text().splitlines()]
    steps = [r for r in log if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1]                                              # exactly one training step
    assert [r["epoch"] for r in log if r["kind"] == "epoch"] == [0, 1]                    # evaluated before and after it
    if method == "pads": assert "val_R@1" in steps[0]                                     # the policy step's reward split
    final = json.loads((out/"metrics.json").read_text())["final"]
    assert final and all(0 <= v <= 1 for k, v in final.items() if k.startswith(("R@", "CMC@", "mAP")))
