"After training: dml-book evaluate/embed/index/search/list, load_run's preprocessing, the faiss Index, CLI ergonomics."
import contextlib, io, json, os, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
import torch
from PIL import Image

from dml_book.cli import main, parser
from dml_book.data import Digits
from dml_book.data.transforms import retrieval_transform
from dml_book.index import Index
from dml_book.inference import Preprocess, embed, evaluate_run, load_run, preprocessing_spec
from dml_book.train import TrainConfig, Trainer

GLYPHS = dict(dataset="glyphs", dataset_kwargs={"size": 16, "per_font": 1}, embedding_dim=16, batch_size=32,
              m_per_class=4, max_steps_per_epoch=3, ks=(1, 2))


def run_cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): code = main(list(map(str, argv)))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    "A one-epoch run on 16-pixel glyphs, and the trainer that made it."
    d = tmp_path_factory.mktemp("run")
    trainer = Trainer(TrainConfig(**GLYPHS, epochs=1, out=str(d/"run")))
    trainer.fit()
    return d/"run", trainer


@pytest.fixture(scope="module")
def pngs(run, tmp_path_factory):
    "The first 40 test glyphs as image files of other sizes and modes (RGB, L, RGBA, P; PNG and JPEG), in subfolders."
    _, trainer = run
    d = tmp_path_factory.mktemp("pngs")
    ds = trainer.test_ds
    for i in range(40):
        img = Image.fromarray(ds.images[i]).resize((24 + i % 3 * 10, 30))
        mode, ext = [("RGB", "png"), ("L", "png"), ("RGBA", "png"), ("P", "png"), ("RGB", "jpg")][i % 5]
        (d/f"part{i % 2}").mkdir(exist_ok=True)
        img.convert(mode).save(d/f"part{i % 2}"/f"{i:02d}.{ext}")
    return d


def test_evaluate_json_equals_metrics_json_final(run):
    "The done-when check, through the installed command's entry point in a fresh process."
    run_dir, _ = run
    r = subprocess.run([sys.executable, "-m", "dml_book.cli", "evaluate", str(run_dir), "--json"],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    got, final = json.loads(r.stdout), json.loads((run_dir/"metrics.json").read_text())["final"]
    assert {k: got[k] for k in final} == final
    assert (got["checkpoint"], got["epochs_trained"], got["epochs"], got["finished"]) == ("checkpoint.pt", 1, 1, True)


def test_evaluate_table_and_other_dataset(run):
    run_dir, _ = run
    code, out, _ = run_cli("evaluate", run_dir, "--checkpoint", "last")
    final = json.loads((run_dir/"metrics.json").read_text())["final"]
    assert code == 0 and [l.split()[0] for l in out.splitlines()] == list(final)
    other = evaluate_run(run_dir, dataset_kwargs={"size": 16, "per_font": 2})   # twice the test images
    assert set(other) == set(final) and other != final


def test_best_checkpoint_reproduces_the_selected_epoch(tmp_path):
    "With a validation split, 'best' is the epoch it selected: its test metrics are metrics.json's selected.test."
    Trainer(TrainConfig(**GLYPHS, epochs=2, val_fraction=0.3, out=str(tmp_path/"run"))).fit()
    saved = json.loads((tmp_path/"run"/"metrics.json").read_text())
    assert (tmp_path/"run"/"best.pt").exists()
    assert evaluate_run(tmp_path/"run", "best") == saved["selected"]["test"]
    assert evaluate_run(tmp_path/"run", "last") == saved["final"]


def test_index_a_folder_and_find_each_image_first(run, pngs, tmp_path):
    run_dir, _ = run
    code, out, err = run_cli("index", run_dir, pngs, "--out", tmp_path/"idx")
    assert code == 0, err
    files = sorted(pngs.rglob("*.*"))
    assert len(Index.load(tmp_path/"idx")) == 40
    queries = [files[3], files[17], files[30]]
    code, out, err = run_cli("search", tmp_path/"idx", *queries, "-k", 7, "--json", "--gallery-figure", tmp_path/"g.png")
    assert code == 0, err
    named = json.loads(out)
    assert [r["query"] for r in named] == [str(q.resolve()) for q in queries]   # each result list names its query
    res = [r["neighbours"] for r in named]
    assert [len(r) for r in res] == [7, 7, 7]
    assert [r[0]["path"] for r in res] == [str(q.resolve()) for q in queries]
    assert all(r[0]["distance"] < 1e-3 for r in res)
    assert all(r[i]["distance"] <= r[i + 1]["distance"] for r in res for i in range(6))
    assert (tmp_path/"g.png").stat().st_size > 0
    code, out, _ = run_cli("search", tmp_path/"idx", queries[0], "-k", 2)   # the plain listing
    assert code == 0 and out.splitlines()[1].split()[-1] == str(queries[0].resolve())


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_index_from_the_command_line(run, pngs, tmp_path, kind):
    run_dir, _ = run
    assert run_cli("index", run_dir, pngs, "--out", tmp_path/"idx", "--approximate", kind, "--nlist", 4)[0] == 0
    idx = Index.load(tmp_path/"idx")
    assert idx.kind == kind and len(idx) == 40
    q = sorted(pngs.rglob("*.*"))[5]
    code, out, _ = run_cli("search", tmp_path/"idx", q, "-k", 3, "--json")
    assert code == 0 and json.loads(out)[0]["neighbours"][0]["path"] == str(q.resolve())


def test_search_errors_are_one_line(run, pngs, tmp_path):
    code, _, err = run_cli("search", tmp_path/"none", pngs)
    assert code == 2 and "not an index folder" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit): parser().parse_args(["search", "x", "q.png", "-k", "0"])
    code, _, err = run_cli("evaluate", tmp_path/"none")
    assert code == 2 and "does not exist" in err
    (tmp_path/"bad.png").write_bytes(b"not an image")
    code, _, err = run_cli("embed", run[0], tmp_path/"bad.png", "--out", tmp_path/"e.npz")
    assert code == 2 and "cannot read image" in err and "bad.png" in err


def test_embed_matches_the_trainers_test_embeddings(run, tmp_path):
    "Glyphs written as 16 x 16 L-mode PNGs embed exactly as the trainer embedded the test split."
    run_dir, trainer = run
    for i in range(20): Image.fromarray(trainer.test_ds.images[i]).save(tmp_path/f"{i:02d}.png")
    emb, _ = trainer.embed_dataset(trainer.test_ds)
    assert run_cli("embed", run_dir, tmp_path, "--out", tmp_path/"e.npz")[0] == 0
    with np.load(tmp_path/"e.npz") as z:
        assert [Path(p).name for p in z["paths"]] == [f"{i:02d}.png" for i in range(20)]
        np.testing.assert_allclose(z["embeddings"], emb[:20].numpy(), atol=1e-5)
    assert run_cli("embed", run_dir, tmp_path/"03.png", tmp_path/"04.png", "--out", tmp_path/"e.npy")[0] == 0
    np.testing.assert_allclose(np.load(tmp_path/"e.npy"), emb[3:5].numpy(), atol=1e-5)
    assert (tmp_path/"e.paths.txt").read_text().splitlines() == [str((tmp_path/f"0{i}.png").resolve()) for i in (3, 4)]


def test_preprocessing_handles_any_mode_and_size(run, pngs):
    run_dir, _ = run
    spec = json.loads((run_dir/"preprocessing.json").read_text())
    assert spec == preprocessing_spec(TrainConfig(**GLYPHS)) and spec["mode"] == "L" and spec["resize"] == [16, 16]
    pre = Preprocess(spec)
    for f in sorted(pngs.rglob("*.*")):
        x = pre(f)
        assert x.shape == (1, 16, 16) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    p = Image.new("P", (10, 7)); p.info["transparency"] = 0
    assert pre(p).shape == (1, 16, 16)


def test_rgb_preprocessing_is_the_datasets_own_pipeline(tmp_path):
    "A benchmark dataset's spec rebuilds exactly its evaluation transform (resize, centre crop, ImageNet statistics)."
    spec = preprocessing_spec(TrainConfig(dataset="cub200"))
    rng = np.random.default_rng(0)
    for mode, size in [("RGB", (300, 200)), ("L", (120, 260)), ("RGBA", (257, 257)), ("P", (90, 400))]:
        img = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).convert(mode)
        img.save(tmp_path/"x.png")
        want = retrieval_transform(False, 224)(Image.open(tmp_path/"x.png").convert("RGB"))
        assert torch.equal(Preprocess(spec)(tmp_path/"x.png"), want)


def test_load_run_without_a_recorded_spec_derives_the_same(run, tmp_path):
    run_dir, trainer = run
    copy = tmp_path/"run"; copy.mkdir()
    for f in ("checkpoint.pt", "metrics.json"): (copy/f).write_bytes((run_dir/f).read_bytes())
    model, transform, cfg = load_run(copy)
    assert transform.spec == json.loads((run_dir/"preprocessing.json").read_text()) and cfg.embedding_dim == 16
    x = torch.stack([trainer.test_ds[i][0] for i in range(4)])
    np.testing.assert_allclose(embed(model, list(x)), trainer.model.eval()(x).detach().numpy(), atol=1e-5)


def test_train_digits_runs_with_the_defaults(tmp_path):
    "No batch flags: the digits' own batch (20 images, 4 per class) fills from its 5 training classes."
    code, out, err = run_cli("train", "--dataset", "digits", "--epochs", 1, "--max-steps-per-epoch", 2, "--no-umap",
                             "--no-progress", "--out", tmp_path/"run")
    assert code == 0, err
    cfg = json.loads((tmp_path/"run"/"metrics.json").read_text())["config"]
    assert (cfg["batch_size"], cfg["m_per_class"]) == (20, 4)
    code, _, err = run_cli("train", "--dataset", "digits", "--batch-size", 64, "--epochs", 1, "--out", tmp_path/"bad")
    assert code == 2 and "--batch-size" in err and "--m-per-class" in err and "at most 5" in err


def test_help_names_meanings_choices_and_real_defaults():
    sub = parser()._subparsers._group_actions[0].choices
    h = " ".join(sub["train"].format_help().split("options:")[1].split())
    for flag, names in [("--dataset", "cars196, csv, cub200, digits"), ("--loss", "angular, contrastive"),
                        ("--miner", "batchhard, distance_weighted"), ("--method", "ala, baseline, dcml"),
                        ("--backbone", "smallcnn, googlenet"), ("--preset", "hdml: paper-triplet")]:
        assert f"{flag} " in h and names in h.split(flag + " ", 1)[1][:600], flag
    assert "--embedding-dim EMBEDDING_DIM size of the embedding (default: 64)" in h
    assert "--progress, --no-progress show progress bars (default: True on a terminal)" in h
    assert "--umap, --no-umap save a UMAP figure of the final test embedding (default: True)" in h
    for cmd in ("evaluate", "embed", "index", "search", "list"): assert cmd in sub


def test_list_prints_the_registries():
    code, out, _ = run_cli("list")
    assert code == 0
    for header in ("datasets:", "losses:", "miners:", "methods:", "presets:", "backbones:", "transforms:"): assert header in out
    code, out, _ = run_cli("list", "losses")
    names = [l.split()[0] for l in out.splitlines()[1:]]
    from dml_book.registry import LOSSES
    assert code == 0 and names == LOSSES.names() and "Triplet margin loss" in out


def test_a_moved_run_serves_without_its_data(tmp_path, monkeypatch):
    "Done when: a run folder copied elsewhere, its dataset deleted, embed/index/search work (from another directory)."
    import shutil
    monkeypatch.chdir(tmp_path)
    trainer = Trainer(TrainConfig(**GLYPHS, epochs=1, data_root="data", out="run"))   # a relative data root
    trainer.fit()
    assert json.loads(Path("run/metrics.json").read_text())["config"]["data_root"] == str(tmp_path/"data")
    imgs = tmp_path/"imgs"; imgs.mkdir()
    for i in range(12): Image.fromarray(trainer.test_ds.images[i]).save(imgs/f"{i:02d}.png")
    emb, _ = trainer.embed_dataset(trainer.test_ds)
    moved = tmp_path/"elsewhere"/"run"
    shutil.copytree("run", moved); shutil.rmtree("run"); shutil.rmtree("data")
    (tmp_path/"cwd").mkdir(); monkeypatch.chdir(tmp_path/"cwd")
    assert run_cli("embed", moved, imgs, "--out", "e.npz")[0] == 0
    with np.load("e.npz") as z: np.testing.assert_allclose(z["embeddings"], emb[:12].numpy(), atol=1e-5)
    assert run_cli("index", moved, imgs, "--out", "ix")[0] == 0
    code, out, err = run_cli("search", "ix", imgs/"05.png", "-k", "3", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["query"] == json.loads(out)[0]["neighbours"][0]["path"] == str((imgs/"05.png").resolve())
    assert not (tmp_path/"data").exists() and not (tmp_path/"cwd"/"data").exists()   # nothing was read or rebuilt
    model, _, _ = load_run(moved)
    assert model.trainer.cfg.dataset == "_run" and not model.trainer.cfg.pretrained


def test_a_run_of_an_unregistered_dataset_embeds_in_a_fresh_process(tmp_path):
    "A dataset class registered by a user's own script is not needed to serve its run (was: unknown dataset 'mydigits')."
    train = ("from dml_book.registry import DATASETS\nfrom dml_book.data import Digits\nfrom dml_book.train import train\n"
             "DATASETS.register('mydigits')(type('MyDigits', (Digits,), {}))\n"
             f"train(dataset='mydigits', epochs=1, max_steps_per_epoch=2, batch_size=20, m_per_class=4, out={str(tmp_path/'run')!r})\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", train], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    Image.fromarray(Digits(split="test").images[0]).save(tmp_path/"a.png")
    r = subprocess.run([sys.executable, "-m", "dml_book.cli", "embed", str(tmp_path/"run"), str(tmp_path/"a.png"),
                        "--out", str(tmp_path/"e.npy")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path/"e.npy").shape == (1, 64)
