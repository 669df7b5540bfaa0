"""Every preset of every method, pinned: backbone, embedding size, image transform, batch structure, learning rate per
group, schedule, optimiser, epochs, loss and the key method arguments. Each value carries the paper's section or
table (papers in shared/papers/), or says where it comes from when the paper is silent (the official code) or where
the preset departs (the reason). The chapters' protocol tables give the same values side by side."""
import pytest

import dml_book.methods  # noqa: F401  (fills METHODS)
from dml_book.data.core import ImageFileDataset
from dml_book.registry import DATASETS, METHODS
from dml_book.train import TrainConfig, preset_config

CONSTANT = dict(lr_schedule="constant")


def _resolved(method: str, name: str) -> dict:
    "The preset as a run sees it: a TrainConfig's fields, the optimiser `auto` resolves to, the image pipeline."
    cfg = preset_config(method, name)
    out = dict(vars(cfg))
    out["optimizer"] = cfg.optimizer if cfg.optimizer != "auto" else getattr(METHODS.get(method), "optimizer_name", "adam")
    if cfg.transform is None:
        ds = DATASETS.get(cfg.dataset)
        out["transform"] = ds.transform_preset if issubclass(ds, ImageFileDataset) else None
    return out


def check(method: str, name: str, /, **expected):
    "Each expected key equals the preset's value; for dict values, each of their keys does (others are free)."
    got = _resolved(method, name)
    for k, v in expected.items():
        if isinstance(v, dict) and k.endswith("_kwargs"):
            for kk, vv in v.items():
                assert got[k].get(kk, "<missing>") == vv, f"{method}/{name}: {k}[{kk!r}] = {got[k].get(kk, '<missing>')!r}, want {vv!r}"
        else:
            assert got[k] == v, f"{method}/{name}: {k} = {got[k]!r}, want {v!r}"


# ---------------------------------------------------------------------------------------------------- ALA (CVPR 2020)
ALA_PAPER = dict(
    lr_backbone=1e-4, lr_head=1e-3,                  # Sec. 3.4: 1e-4 for the CNN, 1e-3 for the last FC layer
    optimizer="sgd",                                 # Sec. 3.3 / eqs. (10), (13): plain gradient steps
    weight_decay=0.0,                                # not stated in the paper (no official code): none
    method_kwargs=dict(assessor_lr=4e-4,             # Sec. 3.4: 4e-4 for the assessor
                       n_train=100, n_val=20,        # Sec. 3.4: episodes of 100 training + 20 validation samples
                       meta_steps=3),                # Sec. 3.4: the assessor updated 3 times per iteration
    **CONSTANT)                                      # no schedule stated: constant
ALA_NETWORK = dict(backbone="googlenet", pretrained=True,   # Sec. 3.4: ImageNet-pretrained GoogLeNet + one FC layer
                   embedding_dim=512,                       # Sec. 3.4: 512
                   transform="retrieval227")                # Sec. 3.4: 256 x 256, random 227 x 227 crops, mirror


def test_ala_presets():
    assert set(METHODS.get("ala").presets) == {"paper", "paper-contrastive", "paper-triplet", "paper-margin"}
    check("ala", "paper", **ALA_PAPER)
    check("ala", "paper-contrastive", loss="contrastive", **ALA_NETWORK, **ALA_PAPER)   # Tables 6-8: contrastive
    check("ala", "paper-triplet", loss="triplet", loss_kwargs=dict(squared=True),      # eq. (4): squared distances
          **ALA_NETWORK, **ALA_PAPER)
    check("ala", "paper-margin", loss="margin", **ALA_NETWORK, **ALA_PAPER)            # Tables 6-8: margin


# --------------------------------------------------------------------------------------------------- HDML (CVPR 2019)
HDML_PAPER = dict(
    method="hdml", backbone="googlenet", pretrained=True,   # Sec. 4.2: GoogLeNet with ImageNet weights, FC projector
    embedding_dim=512,                                       # Sec. 4.2: 512 for all three datasets
    transform="retrieval227",                                # Sec. 4.2: 256 x 256, random 227 x 227 crops, mirror
    normalize=False,                                         # official code: the projector's output is not L2-normalised
    lr_backbone=1e-4, lr_head=1e-3,                          # Sec. 4.2: 1e-4 for the CNN, x10 for the FC layers
    optimizer="adam",                                        # not in the paper; official lib/nn_Ops.py: Adam
    weight_decay=5e-3,                                       # not in the paper; official FLAGS.py (Cars196): 5e-3
    epochs=120,                                              # not in the paper; official 8000 iterations ~ 120 epochs
    lr_schedule="multistep", lr_gamma=0.5,                   # not in the paper; official: halved at iterations 5632, 6848
    lr_milestones=(84, 103), lr_step_per="epoch")            # ... = 70% and 86% of training: epochs 84 and 103 of 120
HDML_FACTORS = dict(beta=1e4, gen_lambda=0.5,                # Sec. 4.2: beta = 1e4, lambda = 0.5 (official FLAGS.py l. 39, 44)
                    lr_gen=1e-3, lr_softmax=1e-3,            # Sec. 4.2: the FC layers at 10 x 1e-4 (official gen: 1e-2)
                    window=64,                               # official lib/nn_Ops.py l. 196: J_avg over blocks of 64 steps
                    j_m="official",                          # official main_triplet.py l. 70, 112, 182: J_avg of w (J + weight decay)
                    softmax_factor=1e4,                      # official FLAGS.py l. 38 (Softmax_factor), main_triplet.py l. 120
                    recon_weight=0.5)                        # official main_triplet.py l. 118: (1 - _lambda) J_recon
HDML_LOSS = {
    "triplet": dict(loss="triplet", batch_size=120,                                     # Sec. 4.2: batches of 120
                    loss_kwargs=dict(margin=1.0, squared=True, reduction="sum",         # official Loss_ops.py l. 164-168: margin 1,
                                     normalize=False),                                  # squared, summed, on the raw embeddings
                    method_kwargs=dict(HDML_FACTORS, pulling_factor=7.0,                # Sec. 4.2: alpha = 7 (triplet; official 90)
                                       triplet_batches=True)),                          # official: 40 triplets a batch
    "npair": dict(loss="npair", batch_size=128, m_per_class=2,                          # Sec. 4.2: 128; pairs per class
                  loss_kwargs=dict(l2_reg=3e-3 / 4, normalize=False),                   # official loss_l2_reg 3e-3 x 1/4, raw z
                  method_kwargs=dict(HDML_FACTORS, pulling_factor=90.0)),               # Sec. 4.2: alpha = 90 (N-pair)
}
HDML_ABLATIONS = {"no-softmax": dict(softmax=False),      # Table 4 / Fig. 5: without J_soft
                  "no-recon": dict(recon=False),          # without J_recon
                  "alpha0": dict(pulling_factor=0.0),     # alpha = 0: no hardness-aware augmentation
                  "baseline": dict(synthesize=False)}     # the baseline rows: the same tuples, no synthesis


# The study's arms on the built-in glyphs: the official schedule and loss on the library's normalised embeddings.
HDML_GLYPHS = dict(loss="triplet",
                   loss_kwargs=dict(margin=1.0, squared=True, reduction="sum"),   # official Loss_ops.py l. 164-168
                   method_kwargs=dict(j_m="official", window=64,                  # official main_triplet.py l. 182, nn_Ops.py l. 196
                                      pulling_factor=90.0))                       # official FLAGS.py l. 41
HDML_GLYPHS_ARMS = {"": {}, "-baseline": dict(synthesize=False),                 # Sec. 4.3: the same tuples without synthesis
                    "-no-softmax": dict(softmax=False),                          # Sec. 4.3, Figs. 4-5: without J_soft
                    "-alpha7": dict(pulling_factor=7.0),                         # Sec. 4.2: the paper's alpha for the triplet loss
                    "-alpha30": dict(pulling_factor=30.0)}                       # between 7 and 90 (Figs. 6-7 vary alpha)


def test_hdml_presets():
    names = {f"paper-{l}" for l in HDML_LOSS} | {f"paper-{l}-{a}" for l in HDML_LOSS for a in HDML_ABLATIONS}
    assert set(METHODS.get("hdml").presets) == names | {f"glyphs{a}" for a in HDML_GLYPHS_ARMS}
    for arm, flip in HDML_GLYPHS_ARMS.items():
        check("hdml", f"glyphs{arm}", method="hdml", backbone="smallcnn", normalize=True,
              **(HDML_GLYPHS | dict(method_kwargs=HDML_GLYPHS["method_kwargs"] | flip)))
        assert preset_config("hdml", f"glyphs{arm}").method_kwargs == HDML_GLYPHS["method_kwargs"] | flip
    for loss, kw in HDML_LOSS.items():
        check("hdml", f"paper-{loss}", **HDML_PAPER, **kw)
        for abl, flip in HDML_ABLATIONS.items():
            check("hdml", f"paper-{loss}-{abl}", **HDML_PAPER, **(kw | dict(method_kwargs=kw["method_kwargs"] | flip)))


# --------------------------------------------------------------------------------------------------- DCML (CVPR 2021)
DCML_PAPER = dict(
    method="dcml", backbone="resnet50", pretrained=True,     # Sec. 4.2: ImageNet-pretrained ResNet-50
    embedding_dim=512,                                       # Sec. 4.2: 4 x 128 concatenated at test
    transform="randomresized224",                            # Sec. 4.2: 256 x 256, random resized 224 crops, flips
    batch_size=112,                                          # Sec. 4.2: 112 (official command: 100)
    lr_backbone=1e-6, lr_head=1e-6,                          # Sec. 4.2: Adam, 1e-6 for CNN, learners, compositors
    optimizer="adam",                                        # Sec. 4.2
    m_per_class=2, weight_decay=4e-4, epochs=300,            # not in the paper: the official command / parameters.py
    freeze_bn=True,                                          # not in the paper: official --arch resnet50_frozen_normalize
    lr_schedule="multistep", lr_milestones=(55,), lr_gamma=0.2,   # not in the paper: official --tau 55 --gamma 0.2
    method_kwargs=dict(n_learners=4, learner_dim=128,        # Sec. 4.2: 4 learners of 128 dimensions
                       n_compositors=8,                      # Sec. 4.2: 8 compositors
                       lambda_m=1.0, lambda_r=0.05))         # Sec. 4.2: lambda_m = 1.0, lambda_r = 0.05
DCML_KS = {"cub200": (1, 2, 4, 8), "cars196": (1, 2, 4, 8),   # Tables 3-4: R@1, 2, 4, 8
           "sop": (1, 10, 100, 1000)}                        # Table 5: R@1, 10, 100 (+ the usual R@1000)
DCML_VARIANTS = {   # the loss/sampler row pairs of Tables 3-5
    "": dict(loss="margin", miner="distance_weighted",                                   # DCML-MDW (Wu et al.'s margin)
             loss_kwargs=dict(margin=0.2, beta=1.2,                                      # Wu et al. / official defaults
                              learn_beta=True, per_class=True, beta_lr=5e-4),            # official: a beta per class, 5e-4
             miner_kwargs=dict(cutoff=0.5, nonzero_loss_cutoff=1.4)),                    # Wu et al.'s cut-offs
    "-tr": dict(loss="triplet", miner="random", loss_kwargs=dict(margin=0.2)),           # Triplet-R
    "-tsh": dict(loss="triplet", miner="semihard", loss_kwargs=dict(margin=0.2)),        # Triplet-SH
    "-pn": dict(loss="proxynca", miner=None),                                            # ProxyNCA
}
DCML_BUILTIN = dict(dataset="glyphs", backbone="smallcnn", pretrained=False,   # not a paper setting: the built-in data
                    embedding_dim=64, batch_size=64, m_per_class=4, epochs=5, **CONSTANT,
                    method_kwargs=dict(n_learners=4, n_compositors=8))          # the paper's counts on a small net
DCML_ABLATIONS = {"no-compositor": dict(use_compositor=False), "no-rein": dict(use_rein=False),   # Table 1
                  "no-jt": dict(jt_trains_compositor=False), "no-discriminative": dict(use_discriminative=False),
                  "fc-compositor": dict(fc_compositor=True), "relu-weighting": dict(compositor_weighting="relu"),  # Table 2
                  "no-tanh": dict(use_sign=False),
                  "no-subtasks": dict(use_subtasks=False),                      # not a row of the paper
                  "subtask-mean": dict(lambda_m=1 / 8),                          # not a row: lambda_m = 1/M, M = 8
                  "normalised-learners": dict(normalize_learners=True)}          # neither paper nor official code


def test_dcml_presets():
    paper = {f"{ds}{v}" for ds in DCML_KS for v in DCML_VARIANTS}
    builtin = {f"glyphs{v}" for v in DCML_VARIANTS}
    assert set(METHODS.get("dcml").presets) == paper | builtin | {f"glyphs-{a}" for a in DCML_ABLATIONS}
    for ds, ks in DCML_KS.items():
        for v, kw in DCML_VARIANTS.items():
            check("dcml", f"{ds}{v}", dataset=ds, ks=ks, **DCML_PAPER, **kw)
    for v, kw in DCML_VARIANTS.items():   # the same losses and samplers, with Wu et al.'s fixed beta
        fixed = dict(margin=0.2, beta=1.2) if v == "" else kw.get("loss_kwargs", {})
        check("dcml", f"glyphs{v}", **DCML_BUILTIN, **(kw | dict(loss_kwargs=fixed)))
    for name, flip in DCML_ABLATIONS.items():
        check("dcml", f"glyphs-{name}", **(DCML_BUILTIN | dict(method_kwargs=DCML_BUILTIN["method_kwargs"] | flip)), loss="margin",
              miner="distance_weighted", loss_kwargs=dict(margin=0.2, beta=1.2))


def test_dcml_builtin_presets_keep_a_fixed_beta():
    "The per-class learned beta is the paper scale's (official code); the built-in presets keep Wu et al.'s fixed 1.2."
    for name in ("glyphs", "glyphs-no-rein"):
        assert not preset_config("dcml", name).loss_kwargs.get("per_class", False)


# --------------------------------------------------------------------------------------------------- PADS (CVPR 2020)
PADS_PAPER = dict(
    method="pads", backbone="resnet50", pretrained=True,     # Sec. 5: ResNet-50 (Wu et al.'s protocol), ImageNet weights
    embedding_dim=128,                                       # Table 1: Dim 128
    transform="retrieval224",                                # Sec. 5: 256 x 256, random 224 x 224 crops, flips
    lr_backbone=1e-5, lr_head=1e-5,                          # Sec. 5: initial learning rates 1e-5
    optimizer="adam",                                        # supplementary (Inception-BN runs): Adam; official: Adam
    batch_size=112, weight_decay=4e-4,                       # not in the paper: official main.py defaults
    freeze_bn=True,                                          # not in the paper: official netlib.py (statistics frozen)
    lr_schedule="multistep", lr_gamma=0.3,                   # Sec. 5.3 "a fixed scheduling"; the official runs' tau/gamma
    loss="margin")                                           # Table 1: Margin + PADS
PADS_RUNS = {   # (beta: Sec. 5's 0.6 / 1.2; the rest: SAMPLE_RUNS.sh, except the reward split, Sec. 5: 15%)
    "cub200": dict(beta=0.6, beta_lr=1e-3, m=2, epochs=300, at=150, M=30, by_class=False, ks=(1, 2, 4, 8)),
    "cars196": dict(beta=0.6, beta_lr=5e-4, m=4, epochs=300, at=140, M=30, by_class=False, ks=(1, 2, 4, 8)),
    "sop": dict(beta=1.2, beta_lr=1e-3, m=2, epochs=120, at=80, M=60, by_class=True, ks=(1, 10, 100, 1000)),
}


def test_pads_presets():
    assert set(METHODS.get("pads").presets) == set(PADS_RUNS)
    for ds, r in PADS_RUNS.items():
        check("pads", ds, dataset=ds, **PADS_PAPER, m_per_class=r["m"], epochs=r["epochs"], lr_milestones=(r["at"],),
              ks=r["ks"],                                                  # Table 1's ks (+ R@8 / R@1000, official k_vals)
              loss_kwargs=dict(margin=0.2,                                 # Sec. 5: gamma = 0.2
                               beta=r["beta"], learn_beta=True, per_class=True, beta_lr=r["beta_lr"]),
              method_kwargs=dict(update_every=r["M"],                      # Sec. 5: M in [30, 150]; official 30 / 60
                                 val_fraction=0.15,                        # Sec. 5: 15% of the training images
                                 val_by_class=r["by_class"],               # SOP: whole classes (see the chapter)
                                 init="uniform_low",                       # Sec. 4.2: leaning to small distances; official
                                 recall_ks=r["ks"]))                      # self-regularisation off: the method's default,
    assert not METHODS.get("pads")(**preset_config("pads", "cub200").method_kwargs).self_regularization   # as in SAMPLE_RUNS.sh


def test_pads_preset_method_kwargs_are_the_defaults_for_the_bins():
    "The bins are not in the preset: they are the method's defaults, which must stay the paper's K = 30 on [0.1, 1.4]."
    import inspect
    sig = inspect.signature(METHODS.get("pads").__init__).parameters
    assert (sig["n_bins"].default, sig["lambda_min"].default, sig["lambda_max"].default) == (30, 0.1, 1.4)


# --------------------------------------------------------------------------------------------------- DMML (ICCV 2019)
DMML_PAPER = dict(
    method="dmml",
    backbone="resnet50", pretrained=True,                    # Sec. 4.1 / 4.2: ImageNet-pretrained ResNet-50
    head="identity", embedding_dim=2048,                     # official code: the pooled 2048-d feature, no layer on top
    last_stride=1,                                           # Sec. 4.1: last spatial down-sampling removed
    lr_backbone=2e-4, lr_head=2e-4,                          # Sec. 3.2: base learning rate 0.0002
    optimizer="adam", weight_decay=1e-4,                     # Sec. 3.2: Adam, L2 weight decay 0.0001
    epochs=1200,                                             # not in the paper: official demo.sh --num_epochs 1200
    batch_size=32 * 6,                                       # an episode: 32 identities x (5 support + 1 query)
    lr_schedule="half_exp", lr_final_fraction=0.005,          # Sec. 3.2: constant, then exponential to 0.005 x (the run's)
    method_kwargs=dict(n_classes=32, n_support=5,            # Sec. 3.2: M = 32, n_s = 5
                       n_query=1,                            # not in the paper: official --num_query 1
                       distance="hard",                      # Sec. 3.1, eq. (10): hard mining distance (official default)
                       margin=0.4, variant="negative",       # Sec. 3.2: tau = 0.4 in the negative-margin eq. (7)
                       scale=1.0,                            # Sec. 3.2: squared Euclidean distance, unscaled
                       flip_test=True))                      # official eval.py: flipped test images summed
DMML_DATA = {"market1501": ("reid256x128", 751),             # Sec. 4.1: 256 x 128, flips, random erasing; 751 ids
             "dukemtmc": ("reid256x128", 702),               # Sec. 4.1: 702 training identities
             "veri776": ("vehicle224", 576)}                 # Sec. 4.2: 224 x 224, flips; 576 training vehicles


def test_dmml_presets():
    assert set(METHODS.get("dmml").presets) == set(DMML_DATA)
    for ds, (transform, ids) in DMML_DATA.items():
        check("dmml", ds, dataset=ds, transform=transform, **DMML_PAPER)
        assert preset_config("dmml", ds).method_kwargs["tasks_per_epoch"] == ids * 6 // (32 * 6)   # one pass over ids


# ------------------------------------------------------------------------------------------------------------- all
@pytest.mark.parametrize("method", ["ala", "hdml", "dcml", "pads", "dmml"])
def test_every_preset_is_a_valid_config(method):
    "Every preset builds a TrainConfig whose method arguments construct the method (a bad key fails here, not on a GPU)."
    cls = METHODS.get(method)
    for name in cls.presets:
        cfg = preset_config(method, name)
        assert isinstance(cfg, TrainConfig)
        cls(**cfg.method_kwargs)


def test_check_catches_a_changed_value():
    "The pinning helper fails on a changed value, a changed nested value and a missing nested key."
    with pytest.raises(AssertionError, match="lr_backbone"): check("pads", "cub200", lr_backbone=1e-4)
    with pytest.raises(AssertionError, match="beta"): check("pads", "cub200", loss_kwargs=dict(beta=1.2))
    with pytest.raises(AssertionError, match="<missing>"): check("ala", "paper", method_kwargs=dict(no_such_key=1))


def test_a_run_never_edits_a_preset():
    "A run's config owns copies of the preset's dicts: editing them (as the command line's merges do) leaves the preset as pinned."
    import copy
    from dml_book.registry import METHODS
    from dml_book.train import preset_config
    before = copy.deepcopy(METHODS.get("dmml").presets["market1501"])
    cfg = preset_config("dmml", "market1501")
    cfg.method_kwargs["n_classes"] = 2; cfg.loss_kwargs["x"] = 1
    assert METHODS.get("dmml").presets["market1501"] == before
