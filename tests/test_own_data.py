"""Your own images: `dml-book train --dataset folder|csv --data-root ...` on generated image trees, class-disjoint evaluation,
and the run embedding in a fresh process after the images are gone."""
import json, os, shutil, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
from PIL import Image

from dml_book.data import ImageFolder, ImageCSV
from dml_book.registry import DATASETS

CLASSES = [f"c{i:02d}" for i in range(8)]
BASE = ["--embedding-dim", "8", "--batch-size", "8", "--m-per-class", "2", "--epochs", "1", "--max-steps-per-epoch", "2",
        "--no-umap", "--device", "cpu"]
FAST = [*BASE, "--ks", "1", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def make_tree(root: Path, per_class=4):
    rng = np.random.default_rng(0)
    for c, name in enumerate(CLASSES):
        (root/name).mkdir(parents=True)
        for i in range(per_class):
            px = np.clip(rng.normal(30 * c, 15, (10, 14, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(px).save(root/name/f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def cli(*argv, cwd=None):
    return subprocess.run([sys.executable, "-m", "dml_book.cli", *map(str, argv)], capture_output=True, text=True, env=ENV, cwd=cwd)


def test_registered_and_listed():
    assert {"folder", "csv"} <= set(DATASETS.names())
    r = cli("list", "datasets")
    assert "folder" in r.stdout and "csv" in r.stdout and "_run" not in r.stdout


def test_folder_splits_by_class(tmp_path):
    root = make_tree(tmp_path/"imgs")
    tr, te = ImageFolder(root), ImageFolder(root, "test", test_fraction=0.25)
    assert tr.class_names == CLASSES[:4] and te.class_names == CLASSES[6:]
    assert not set(tr.class_names) & set(ImageFolder(root, "test").class_names)   # class-disjoint


@pytest.mark.parametrize("kind", ["folder", "csv"])
def test_train_on_your_images_then_serve_without_them(tmp_path, kind):
    "Done when: `dml-book train --dataset folder|csv --data-root DIR` trains, and the run embeds in a fresh process."
    root = make_tree(tmp_path/"imgs")
    if kind == "csv":
        files = sorted(root.rglob("*.*"))
        (root/"dataset.csv").write_text("path,label\n" + "".join(f"{f.relative_to(root).as_posix()},{f.parent.name}\n" for f in files))
    r = cli("train", "--dataset", kind, "--data-root", "imgs", *FAST, "--out", tmp_path/"run", cwd=tmp_path)   # relative root
    assert r.returncode == 0, r.stderr
    saved = json.loads((tmp_path/"run"/"metrics.json").read_text())
    assert set(saved["final"]) >= {"R@1", "R@2", "NMI"} and saved["config"]["data_root"] == str(tmp_path/"imgs")
    query = tmp_path/"query.png"; shutil.copy(root/"c07"/"1.png", query)
    shutil.rmtree(root)
    r = cli("embed", tmp_path/"run", query, "--out", tmp_path/"e.npy")
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path/"e.npy").shape == (1, 8)


def test_csv_with_query_and_gallery_flags_evaluates_query_against_gallery(tmp_path):
    root = make_tree(tmp_path/"imgs")
    rows = ["path,label,split,is_query,is_gallery"]
    for f in sorted(root.rglob("*.*")):
        test = f.parent.name >= "c04"
        rows.append(f"{f.relative_to(root).as_posix()},{f.parent.name},{'validation' if test else 'train'},"
                    f"{int(test and f.stem == '0')},{int(test)}")
    (root/"dataset.csv").write_text("\n".join(rows) + "\n")
    r = cli("train", "--dataset", "csv", "--data-root", root/"dataset.csv", *BASE, "--out", tmp_path/"run")
    assert r.returncode == 0, r.stderr
    final = json.loads((tmp_path/"run"/"metrics.json").read_text())["final"]
    assert set(final) == {"mAP", "CMC@1", "CMC@5", "CMC@10"} and 0 < final["mAP"] <= 1
    q = ImageCSV(root, "query"); g = ImageCSV(root, "gallery")
    assert len(q) == 4 and len(g) == 16 and set(q.pids) <= set(g.pids)


def test_bad_tables_and_folders_fail_in_one_line(tmp_path):
    (tmp_path/"t.csv").write_text("path,label,split\na.png,1,train\nb.png,2,holdout\n")
    r = cli("train", "--dataset", "csv", "--data-root", tmp_path/"t.csv", *FAST, "--out", tmp_path/"run")
    assert r.returncode == 2 and "split 'holdout' is not train, test or validation" in r.stderr and len(r.stderr.splitlines()) == 1
    r = cli("train", "--dataset", "folder", "--data-root", tmp_path/"none", *FAST, "--out", tmp_path/"run")
    assert r.returncode == 2 and "expected the folder" in r.stderr and len(r.stderr.splitlines()) == 1
