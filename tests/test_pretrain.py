"""The pretraining set (glyphs_pretrain) is disjoint from the study's glyphs-XL; a pretrained small CNN loads through
`build_model` and the trainer exactly, wrong files fail in one line; a tiny pretraining run learns; the zero-shot
metrics are the trainer's own evaluation."""
import json, math, shutil
from dataclasses import asdict, replace
from pathlib import Path
from unittest import mock
import numpy as np, pytest, torch
import dml_book.data.glyph_pretrain as gpre
import dml_book.data.glyph_products as gp
from dml_book.data.builtin import cache_dir
from dml_book.data.glyph_products import GlyphProducts, code_points
from dml_book.data.glyph_pretrain import GlyphPretrain, check_disjoint
from dml_book.models import SmallCNN, build_model
from dml_book.pretrain import PretrainConfig, backbone_path, pretrain, pretrained_backbone, pretrain_record, zero_shot
from dml_book.registry import DATASETS
from dml_book.study_design import STUDY_SETTINGS


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    "A fresh cache folder holding only the list of candidate code points (scanned once into the user's cache)."
    root = tmp_path_factory.mktemp("pretrain")
    code_points()
    for f in cache_dir().glob("glyphs_xl-cps-*.npz"): shutil.copy(f, root)
    return root


def blank(cp, cov, seed, size, strength, lo, hi): return np.zeros((lo, size, size), np.uint8)


def test_no_code_point_of_the_study_glyphs_xl_is_a_pretraining_class(tmp_path, cache):
    "The datasets themselves (images blank: the classes do not depend on them) report disjoint code points."
    for f in cache.glob("glyphs_xl-cps-*.npz"): shutil.copy(f, tmp_path)
    kw = STUDY_SETTINGS["dataset_kwargs"]
    assert STUDY_SETTINGS["dataset"] == "glyphs_xl" and "n_classes" not in kw   # the default 2,000 classes
    with mock.patch.multiple(gp, render_class=blank, font_coverage=dict), mock.patch.multiple(gpre, render_class=blank, _coverage=dict):
        xl = {s: set(GlyphProducts(tmp_path, s, **kw).code_points.tolist()) for s in ("train", "test")}
        ours = GlyphPretrain(tmp_path, "train", strength=kw["strength"])
    cps = code_points(cache).tolist()
    assert len(xl["train"]) == len(xl["test"]) == 1000 and xl["train"] | xl["test"] == set(cps[:2000])
    assert not (xl["train"] | xl["test"]) & set(ours.code_points.tolist())
    assert len(ours.class_names) == len(cps) - 2000 == len(set(ours.code_points.tolist())) > 4000   # several thousand
    assert DATASETS.get("glyphs_pretrain") is GlyphPretrain


def test_a_glyphs_xl_reaching_into_the_pretraining_classes_is_refused():
    with pytest.raises(ValueError, match=r"^glyphs_xl with n_classes=2001 shares 1 code points with glyphs_pretrain \(skip=2000\)"):
        check_disjoint(2001)
    check_disjoint(2000); check_disjoint(3000, skip=3000)
    with pytest.raises(ValueError, match="n_classes=2600 shares 600 code points"):   # before any image is rendered
        zero_shot(None, {"strength": 0.5, "n_classes": 2600}, root="/nonexistent")


def test_pretraining_split_holds_out_images_of_the_same_classes(cache):
    tr, te = (GlyphPretrain(cache, s, n_classes=12, images=3, held_out=2) for s in ("train", "test"))
    assert tr.class_names == te.class_names and len(tr) == 36 and len(te) == 24
    assert np.array_equal(np.bincount(te.labels), [2]*12)
    assert not any((a == b).all() for a in tr.images[:3] for b in te.images[:2])   # different images of class 0
    with pytest.raises(ValueError, match="held_out=0: glyphs_pretrain has no test split"):
        GlyphPretrain(cache, "test", n_classes=12, held_out=0)


def _saved(tmp_path, width=32, in_channels=1):
    torch.manual_seed(1)
    bb = SmallCNN(in_channels, width)
    with torch.no_grad():
        for m in bb.modules():
            if isinstance(m, torch.nn.BatchNorm2d): m.running_mean.uniform_(-0.5, 0.5); m.running_var.uniform_(0.5, 2)
    path = tmp_path/f"bb{width}-{in_channels}.pth"; torch.save(bb.state_dict(), path)
    return bb.eval(), path


def test_a_saved_backbone_loads_with_identical_features(tmp_path, one_thread):
    bb, path = _saved(tmp_path)
    x = torch.rand(5, 1, 32, 32)
    model = build_model("smallcnn", 128, weights_path=path, head="identity", normalize=False).eval()
    with torch.no_grad(): assert torch.equal(model(x), bb(x))
    linear = build_model("smallcnn", 16, weights_path=path)   # the head is new; the backbone the file's
    assert all(torch.equal(v, bb.state_dict()[k]) for k, v in linear.backbone.state_dict().items())


def test_the_trainer_fine_tunes_from_the_file_and_freezes_its_batchnorm(tmp_path, one_thread):
    from dml_book.train import Trainer, TrainConfig
    bb, path = _saved(tmp_path)
    cfg = TrainConfig(dataset="digits", embedding_dim=8, batch_size=20, m_per_class=4, epochs=1, max_steps_per_epoch=2,
                      weights_path=str(path), freeze_bn=True, out=str(tmp_path/"run"), device="cpu")
    t = Trainer(cfg)
    assert all(torch.equal(v, bb.state_dict()[k]) for k, v in t.model.backbone.state_dict().items() if "num_batches" not in k)
    t.fit()
    after = t.model.backbone.state_dict()
    assert torch.equal(after["0.1.running_mean"], bb.state_dict()["0.1.running_mean"])   # frozen: statistics as pretrained
    assert torch.equal(after["0.1.weight"], bb.state_dict()["0.1.weight"])
    assert not torch.equal(after["0.0.weight"], bb.state_dict()["0.0.weight"])           # while the convolutions train


def test_a_wrong_weights_file_fails_in_one_line(tmp_path):
    _, narrow = _saved(tmp_path, width=16); _, rgb = _saved(tmp_path, in_channels=3)
    (tmp_path/"junk.pth").write_text("not a state dict")
    torch.save({"x": torch.zeros(1)}, tmp_path/"other.pth")
    cases = {narrow: "0.0.weight has shape (16, 1, 3, 3), the model's (32, 1, 3, 3)",
             rgb: "0.0.weight has shape (32, 3, 3, 3), the model's (32, 1, 3, 3)",
             tmp_path/"junk.pth": "is not a saved state dict",
             tmp_path/"other.pth": "does not fit smallcnn: it lacks 24 of the model's keys",
             tmp_path/"none.pth": "does not exist"}
    for path, msg in cases.items():
        with pytest.raises((ValueError, FileNotFoundError)) as e: build_model("smallcnn", 8, weights_path=path)
        assert msg in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_tiny_pretraining_run_learns_and_is_cached(cache, one_thread):
    cfg = PretrainConfig(n_classes=16, images=4, held_out=1, epochs=8, batch_size=16, log_every=4)
    bb, rec = pretrain(cfg, cache)
    loss = [c["loss"] for c in rec["curve"]]
    assert abs(loss[0] - math.log(16)) < 0.5 and loss[-1] < 0.75 * loss[0]     # from a uniform guess, down
    assert rec["epochs"][-1]["train_acc"] > 3 / 16 and len(rec["epochs"]) == 8
    with mock.patch("dml_book.pretrain.pretrain", return_value=(bb, rec)) as train:
        path = pretrained_backbone(cfg, cache); again = pretrained_backbone(cfg, cache)
    assert path == again and train.call_count == 1 and pretrain_record(path)["curve"] == rec["curve"]
    assert pretrained_backbone(replace(cfg, seed=1), cache) != path                  # another setting, another file
    assert path.stat().st_size < 2**20                                                # small enough to commit


def test_zero_shot_is_the_trainers_evaluation_before_any_step(tmp_path, cache, one_thread):
    "An identity head on the backbone, the study's glyphs-XL (small): the same metrics as `Trainer.evaluate`."
    from dml_book.train import Trainer, TrainConfig
    _, path = _saved(tmp_path)
    kw = {"strength": 0.5, "n_classes": 40}
    ours = zero_shot(path, kw, root=cache)
    t = Trainer(TrainConfig(dataset="glyphs_xl", data_root=str(cache), dataset_kwargs=kw, head="identity", embedding_dim=128,
                            weights_path=str(path), out=str(tmp_path/"run"), device="cpu"))
    theirs = t.evaluate()
    assert set(ours) == set(theirs) and all(ours[k] == pytest.approx(theirs[k], abs=1e-6) for k in ("R@1", "R@2", "R@8", "MAP@R"))
    assert 0 < ours["R@1"] < 1 and zero_shot(None, kw, root=cache)["R@1"] != ours["R@1"]


def test_the_stored_backbone_loads_and_its_record_says_what_it_is():
    "results/pretrain/seed0: the committed state dict fits the study's model; its record is the default setting's."
    from pathlib import Path
    import json
    from dataclasses import asdict
    store = Path(__file__).resolve().parents[1]/"results"/"pretrain"/"seed0"
    if not (store/"smallcnn.pth").exists(): pytest.skip("no stored backbone")
    rec = json.loads((store/"record.json").read_text())
    assert rec["config"] == asdict(PretrainConfig()) and rec["weights"] == backbone_path().name
    model = build_model("smallcnn", 128, weights_path=store/"smallcnn.pth", head="identity")
    assert model(torch.rand(2, 1, 32, 32)).shape == (2, 128)
    assert rec["zero_shot"]["R@1"] > rec["zero_shot_random"]["R@1"] and (store/"smallcnn.pth").stat().st_size < 2**20


def test_the_pretrain_command_caches_prints_and_refuses_bad_settings_in_one_line(cache, tmp_path, capsys, one_thread):
    "`dml-book pretrain`: the cached file's path, a copy the trainer can check, the zero-shot R@1 as `zero_shot` gives it; errors in one line."
    from dml_book.cli import main
    from dml_book.pretrain import backbone_record
    tiny = ["pretrain", "--cache", str(cache), "--n-classes", "6", "--images", "3", "--held-out", "1", "--epochs", "2",
            "--batch-size", "6", "--seed", "3", "--no-progress"]
    small = {"strength": 0.5, "n_classes": 20}
    assert main([*tiny, "--out", str(tmp_path/"kept"/"bb.pth"), "--zero-shot", "--xl-kwargs", json.dumps(small)]) == 0
    out = capsys.readouterr().out.splitlines()
    path = Path(out[0])
    assert path == backbone_path(PretrainConfig(n_classes=6, images=3, held_out=1, epochs=2, batch_size=6, seed=3), cache)
    rec = pretrain_record(path)
    assert rec["classes"] == 6 and len(rec["epochs"]) == 2 and backbone_record(tmp_path/"kept"/"bb.pth") == rec
    assert float(out[2].split()[2]) == pytest.approx(zero_shot(path, small, root=cache)["R@1"], abs=1e-4)
    with mock.patch("dml_book.pretrain.pretrain", side_effect=AssertionError("trained again")):
        assert main(tiny) == 0 and capsys.readouterr().out.strip() == str(path)   # found in the cache
    for argv, msg in [(["--batch-size", "0"], "--batch-size 0: expected a positive integer"),
                      (["--optimizer", "lamb"], "unknown optimizer 'lamb'; choose from: adam, sgd"),
                      (["--n-classes", "1"], "n_classes must be between 2 and"),
                      (["--skip", "1500", "--zero-shot"], "glyphs_xl with n_classes=2000 shares 500 code points with glyphs_pretrain (skip=1500)"),
                      (["--out", str(tmp_path/"kept")], "kept: the output must end in .pth or .pt"),
                      (["--out", str(tmp_path/"kept"/"bb.pth"/"x.pth")], "bb.pth is a file, not a folder; choose another --out")]:
        assert main([*tiny, *argv]) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_the_trainer_refuses_a_glyphs_xl_that_shares_classes_with_the_backbones_pretraining(tmp_path):
    "Its record beside the weights (the cache's) or in their folder (a stored copy) names what the pretraining skipped."
    from dml_book.registry import ConfigError
    from dml_book.train import Trainer, TrainConfig
    _, path = _saved(tmp_path)
    cfg = TrainConfig(dataset="glyphs_xl", data_root=str(tmp_path/"no-data"), dataset_kwargs={"strength": 0.5, "n_classes": 2400},
                      weights_path=str(path), out=str(tmp_path/"run"), device="cpu")
    path.with_suffix(".json").write_text(json.dumps({"config": asdict(PretrainConfig())}))   # skip=2000
    with pytest.raises(ConfigError, match=r"^weights_path .* was pretrained on classes of this run's data: glyphs_xl with "
                                          r"n_classes=2400 shares 400 code points with glyphs_pretrain \(skip=2000\)"):
        Trainer(cfg)   # before any image is rendered: data_root does not exist
    assert not (tmp_path/"no-data").exists()
    path.with_suffix(".json").unlink()
    (tmp_path/"record.json").write_text(json.dumps({"config": asdict(replace(PretrainConfig(), skip=2400))}))
    from dml_book.config import check_config
    check_config(cfg)                                                               # skipped every class this run uses
    (tmp_path/"record.json").write_text(json.dumps({"config": asdict(replace(PretrainConfig(), skip=2300))}))
    with pytest.raises(ConfigError, match="n_classes=2400 shares 100 code points"): check_config(cfg)
    store = Path(__file__).resolve().parents[1]/"results"/"pretrain"/"seed0"/"smallcnn.pth"
    if store.exists():   # the stored backbone, as the pretrained studies use it: the study's glyphs-XL passes, a larger one not
        check_config(replace(cfg, weights_path=str(store), dataset_kwargs=STUDY_SETTINGS["dataset_kwargs"]))
        with pytest.raises(ConfigError, match="n_classes=2001 shares 1 code points"):
            check_config(replace(cfg, weights_path=str(store), dataset_kwargs={"n_classes": 2001}))
