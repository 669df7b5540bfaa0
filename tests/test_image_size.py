"""`--image-size` (TrainConfig.image_size) for own images: the dataset's pipeline scaled as a whole, so a CPU run of a
`folder` dataset need not push 224-pixel images; the run records the scaled evaluation pipeline and serves with it."""
import json, os, subprocess, sys
from pathlib import Path
import numpy as np, pytest
from PIL import Image

from dml_book.train import TrainConfig
from dml_book.data.core import build_split, preprocessing_spec
from dml_book.registry import ConfigError

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def tiny_folder(root: Path, classes=6, per_class=3) -> Path:
    "A folder dataset of small colour images of unequal shapes (class c: mean grey level 40 c)."
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root/f"k{c}").mkdir(parents=True)
        for i in range(per_class):
            px = np.clip(rng.normal(40 * c, 10, (30 + 7 * i, 50, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(px).save(root/f"k{c}"/f"{i}.png")
    return root


@pytest.mark.parametrize("decoder", ["pil", "torchvision"])
def test_the_folder_pipeline_is_scaled_to_the_image_size(tmp_path, decoder):
    root = tiny_folder(tmp_path/"imgs")
    cfg = TrainConfig(dataset="folder", data_root=str(root), image_size=32, decoder=decoder)
    for train in (True, False):
        x, _ = build_split(cfg, "train", train)[0]
        assert tuple(x.shape) == (3, 32, 32), (train, x.shape)
    assert tuple(build_split(TrainConfig(dataset="folder", data_root=str(root), decoder=decoder), "train", False)[0][0].shape) == (3, 224, 224)
    spec = preprocessing_spec(cfg)   # what a served run replays: resize 256 * 32 / 224 = 37, centre crop 32
    assert (spec["resize"], spec["center_crop"]) == ([37, 37], [32, 32])


def test_built_in_data_refuse_an_image_size():
    with pytest.raises(ConfigError, match="leave image_size unset"):
        build_split(TrainConfig(dataset="glyphs", dataset_kwargs={"size": 16, "per_font": 1}, image_size=32), "train", False)


def test_train_with_image_size_then_embed_a_file_at_that_size(tmp_path):
    "`dml-book train --dataset folder --image-size 32` trains on 32-pixel crops; `embed` of a 50 x 44 file goes through the same 32-pixel pipeline."
    root = tiny_folder(tmp_path/"imgs")
    run = [sys.executable, "-m", "dml_book.cli"]
    r = subprocess.run([*run, "train", "--dataset", "folder", "--data-root", str(root), "--image-size", "32", "--embedding-dim", "8",
                        "--batch-size", "6", "--m-per-class", "2", "--epochs", "1", "--max-steps-per-epoch", "2", "--val-fraction", "0",
                        "--ks", "1", "--no-umap", "--device", "cpu", "--out", str(tmp_path/"run")],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    saved = json.loads((tmp_path/"run"/"metrics.json").read_text())
    assert saved["config"]["image_size"] == 32
    assert json.loads((tmp_path/"run"/"data.json").read_text())["shape"] == [3, 32, 32]
    pre = json.loads((tmp_path/"run"/"preprocessing.json").read_text())
    assert (pre.get("resize"), pre.get("center_crop")) == ([37, 37], [32, 32]), pre
    r = subprocess.run([*run, "embed", str(tmp_path/"run"), str(root/"k5"/"2.png"), "--out", str(tmp_path/"e.npy")],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path/"e.npy").shape == (1, 8)


def test_a_too_small_image_size_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dml_book.cli", "train", "--dataset", "folder", "--data-root", str(tmp_path),
                        "--image-size", "8", "--out", str(tmp_path/"run")], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "image_size=8 is invalid: expected a whole number of pixels from 16 to 8192, or None" in r.stderr
