"Tests of dml_book.methods.dcml: compositor weights, straight-through sign, J_rein, gradient routing, a short run."
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from dml_book.losses import TripletLoss
from dml_book.methods.dcml import (DCML, Compositor, FCComposer, Learners, compose, concatenate, ensemble_weights,
                                   learner_distances, rein_loss, sign_ste)
from dml_book.models import build_model
from dml_book.registry import METHODS


def _compositor(seed=0, in_features=20, K=4, M=6, use_sign=True):
    torch.manual_seed(seed)
    comp = Compositor(in_features, K, M, use_sign)
    with torch.no_grad():
        comp.weighting_bias.normal_(); comp.signing_bias.normal_()
    return comp


@pytest.mark.parametrize("use_sign", [True, False])
def test_absolute_weights_sum_to_one_per_sample(use_sign):
    comp = _compositor(use_sign=use_sign)
    y = 3 * torch.randn(50, 20)                          # not normalised: must hold for any input
    c = comp(y)
    assert c.shape == (50, 6, 4)
    torch.testing.assert_close(c.abs().sum(-1), torch.ones(50, 6))
    t, s = comp.scores(y)
    torch.testing.assert_close(c.abs(), t)               # |c| = t since |s| = 1
    assert set(s.unique().tolist()) <= {-1.0, 1.0}
    if use_sign: assert (c < 0).any() and (c > 0).any()  # the sign score does flip some weights
    else: assert (c > 0).all()


def test_weights_match_the_equations_one_compositor_at_a_time():
    comp = _compositor(seed=1)
    y = F.normalize(torch.randn(7, 20), dim=-1)
    c = comp(y)
    for m in range(6):
        t = torch.softmax(y @ comp.weighting[m].T + comp.weighting_bias[m], dim=-1)            # eq. 4
        s = torch.sign(torch.tanh(y @ comp.signing[m].T + comp.signing_bias[m]))              # eq. 5
        torch.testing.assert_close(c[:, m], t * s)
    g = F.normalize(torch.randn(7, 4, 5), dim=-1)
    z = compose(c, g)                                                                          # eq. 6
    for b in range(7):
        for m in range(6):
            torch.testing.assert_close(z[b, m], sum(c[b, m, k] * g[b, k] for k in range(4)))


def test_straight_through_sign_passes_tanh_gradient():
    a = torch.linspace(-3, 3, 13).requires_grad_()
    s = sign_ste(a)
    assert s.detach().tolist() == [-1.0] * 6 + [1.0] * 7  # sgn(0) = +1
    w = torch.randn(13)
    (s * w).sum().backward()
    a2 = a.detach().clone().requires_grad_()
    (torch.tanh(a2) * w).sum().backward()
    torch.testing.assert_close(a.grad, a2.grad)
    assert a.grad.abs().min() > 0                          # a true sign would give zero gradient


def test_sign_score_gets_gradient_inside_the_compositor():
    comp = _compositor(seed=2)
    g = F.normalize(torch.randn(9, 4, 5), dim=-1)
    z = compose(comp(F.normalize(torch.randn(9, 20), dim=-1)), g)
    (z ** 2).sum().backward()
    assert comp.signing.grad is not None and comp.signing.grad.abs().sum() > 0


def test_rein_loss_matches_formula():
    c = torch.tensor([[[0.5, -0.3, 0.2], [-0.6, 0.1, 0.3]],
                      [[0.1, 0.1, -0.8], [1 / 3, 1 / 3, 1 / 3]]])
    expected = (-math.log(0.5) - math.log(0.6) - math.log(0.8) - math.log(1 / 3)) / 2
    torch.testing.assert_close(rein_loss(c), torch.tensor(expected))
    comp = _compositor(seed=3)
    c = comp(torch.randn(11, 20))
    loop = sum(-math.log(max(abs(v) for v in c[b, m].tolist())) for b in range(11) for m in range(6)) / 11
    assert rein_loss(c).item() == pytest.approx(loop, rel=1e-5)
    assert rein_loss(torch.full((3, 2, 4), 0.25)).item() == pytest.approx(2 * math.log(4), rel=1e-6)  # uniform: log K each


def _fake_trainer(seed=0, emb=12, **kw):
    torch.manual_seed(seed)
    tr = SimpleNamespace(cfg=SimpleNamespace(embedding_dim=emb, lr_head=1e-3), model=build_model("smallcnn", emb),
                         device="cpu", loss_fn=TripletLoss(), miner=None, gather=lambda e, l: (e, l))
    method = DCML(n_learners=3, n_compositors=4, **kw)
    method.setup(tr)
    x, labels = torch.randn(12, 1, 8, 8), torch.arange(6).repeat_interleave(2)
    return tr, method, x, labels


def test_learners_get_no_gradient_through_the_compositors_input():
    tr, method, x, labels = _fake_trainer(normalize_composites=False)   # eq. 6's raw composites, to compare with compose
    g = tr.model.head.sub_embeddings(tr.model.backbone(x))
    terms = method.losses(tr, g, labels)
    W = tr.model.head.fc.weight
    # J_rein depends on the learners only through the compositors' input: no gradient may reach them
    grads = torch.autograd.grad(terms["rein"], [W, method.compositor.weighting], retain_graph=True, allow_unused=True)
    assert grads[0] is None and grads[1].abs().sum() > 0
    # J_sub reaches the learners only through the sub-embeddings: same gradient as with frozen weights
    g_sub = torch.autograd.grad(terms["sub"], W, retain_graph=True)[0]
    c = method.compositor(g.detach().flatten(1)).detach()
    frozen = sum(tr.loss_fn(compose(c, g)[:, m], labels) for m in range(4))
    torch.testing.assert_close(torch.autograd.grad(frozen, W, retain_graph=True)[0], g_sub)
    # ... and the difference is real: without the detach the gradients would differ
    c_live = method.compositor(g.flatten(1))
    live = sum(tr.loss_fn(compose(c_live, g)[:, m], labels) for m in range(4))
    assert not torch.allclose(torch.autograd.grad(live, W)[0], g_sub)


def test_test_embedding_is_the_concatenation():
    tr, method, x, _ = _fake_trainer()
    tr.model.eval()
    g = tr.model.head.sub_embeddings(tr.model.backbone(x))
    torch.testing.assert_close(tr.model(x), g.flatten(1))
    torch.testing.assert_close(tr.model(x), F.normalize(tr.model.head.fc(tr.model.backbone(x)), dim=-1))   # the K raw outputs, normalised together
    assert tr.model.embedding_dim == 12 and isinstance(tr.model.head, Learners)


@pytest.mark.parametrize("kw,terms", [
    ({}, {"dis", "sub", "rein", "loss"}),
    (dict(use_rein=False), {"dis", "sub", "loss"}),
    (dict(use_subtasks=False), {"dis", "rein", "loss"}),
    (dict(use_discriminative=False), {"sub", "rein", "loss"}),
    (dict(use_compositor=False), {"dis", "sub", "loss"}),
    (dict(fc_compositor=True), {"dis", "sub", "loss"}),
    (dict(use_sign=False), {"dis", "sub", "rein", "loss"}),
])
def test_ablations_switch_off_their_term(kw, terms):
    tr, method, x, labels = _fake_trainer(**kw)
    out = method.losses(tr, tr.model.head.sub_embeddings(tr.model.backbone(x)), labels)
    assert set(out) == terms
    total = out.get("dis", 0) + out.get("sub", 0) + 0.05 * out.get("rein", 0)
    torch.testing.assert_close(out["loss"], torch.as_tensor(total))


def test_no_per_learner_normalisation_by_default():
    "Paper and official code: the learners' raw outputs are concatenated; only y (and each composite) is normalised."
    assert DCML().normalize_learners is False and Learners(8).normalize_each is False
    for name in ("cub200", "cars196", "sop"):
        from dml_book.train import preset_config
        assert not DCML(**preset_config("dcml", name).method_kwargs).normalize_learners
    tr, method, x, labels = _fake_trainer()
    raw = tr.model.head.fc(tr.model.backbone(x)).view(12, 3, 4)            # the official code's sub-embeddings
    g = tr.model.head.sub_embeddings(tr.model.backbone(x))
    scale = raw.flatten(1).norm(dim=1)                                      # one positive number per sample ...
    torch.testing.assert_close(g, raw / scale[:, None, None])               # ... between ours and the raw blocks
    assert (g.norm(dim=-1) - 1).abs().max() > 0.05                          # so no block is a unit vector
    out = method.losses(tr, g, labels)
    c = method.compositor(g.flatten(1).detach())
    want = sum(tr.loss_fn(F.normalize(compose(c, raw)[:, m], dim=-1), labels) for m in range(4))   # raw composites, normalised
    torch.testing.assert_close(out["sub"], want)                            # the subtasks see the official code's directions


def test_normalised_learners_flag_is_the_product_of_spheres():
    tr, method, x, labels = _fake_trainer(normalize_learners=True)
    assert tr.model.head.normalize_each
    g = tr.model.head.sub_embeddings(tr.model.backbone(x))
    torch.testing.assert_close(g.norm(dim=-1), torch.ones(12, 3))           # every sub-embedding a unit vector
    torch.testing.assert_close(tr.model(x), g.flatten(1) / math.sqrt(3))    # y: on a product of 3 spheres, unit norm
    out = method.losses(tr, g, labels)
    torch.testing.assert_close(out["dis"], tr.loss_fn(concatenate(g, True), labels))
    c = method.compositor(concatenate(g, True).detach())
    torch.testing.assert_close(out["sub"], sum(tr.loss_fn(F.normalize(compose(c, g)[:, m], dim=-1), labels) for m in range(4)))
    y_plain = F.normalize(tr.model.head.fc(tr.model.backbone(x)), dim=-1)   # the default's y from the same weights
    assert not torch.allclose(tr.model(x), y_plain, atol=1e-3)              # another test embedding


def test_attribution_arms_flip_one_setting_each():
    "The study's arms: DCML and its attribution arms differ from DCML in one method argument; lambda_m = 1/M."
    arms = DCML.study_arms
    assert set(arms) == {"baseline", "dcml", "dcml-no-subtasks", "dcml-no-tanh", "dcml-subtask-mean", "dcml-normalised-learners"}
    assert arms["baseline"] == dict(method="baseline", loss="triplet") and arms["dcml"] == dict(method="dcml", loss="triplet")
    flips = {a: arms[a]["method_kwargs"] for a in arms if a.startswith("dcml-")}
    assert flips == {"dcml-no-subtasks": {"use_subtasks": False}, "dcml-no-tanh": {"use_sign": False},
                     "dcml-subtask-mean": {"lambda_m": 1 / DCML().n_compositors}, "dcml-normalised-learners": {"normalize_learners": True}}
    tr, method, x, labels = _fake_trainer(lambda_m=1 / 4)                   # M = 4 here: the subtasks' mean
    out = method.losses(tr, tr.model.head.sub_embeddings(tr.model.backbone(x)), labels)
    torch.testing.assert_close(out["loss"], out["dis"] + out["sub"] / 4 + 0.05 * out["rein"])


def test_without_compositors_subtasks_sit_on_learners():
    tr, method, x, labels = _fake_trainer(use_compositor=False)
    g = tr.model.head.sub_embeddings(tr.model.backbone(x))
    z, c = method.composites(g)
    torch.testing.assert_close(z, g[:, [0, 1, 2, 0]])     # composite m = learner m mod K
    assert ensemble_weights(4, 3).sum().item() == 4


def test_fc_composer_reaches_learners():
    tr, method, x, labels = _fake_trainer(fc_compositor=True)
    assert isinstance(method.compositor, FCComposer)
    g = tr.model.head.sub_embeddings(tr.model.backbone(x))
    sub = method.losses(tr, g, labels)["sub"]
    assert torch.autograd.grad(sub, tr.model.head.fc.weight)[0].abs().sum() > 0


def test_pluggable_subtasks_and_bad_input():
    tr, method, x, labels = _fake_trainer(subtasks=["triplet", "contrastive"])
    assert [type(l).__name__ for l in method.subtask_losses] == ["TripletLoss", "ContrastiveLoss"] * 2   # cycled over M = 4
    with pytest.raises(ValueError, match="unknown loss 'nope'"): DCML(subtasks="nope")
    with pytest.raises(ValueError, match="not divisible by n_learners"): _fake_trainer(emb=10)
    with pytest.raises(ValueError, match="both are off"): DCML(use_discriminative=False, use_subtasks=False)
    with pytest.raises(ValueError, match="n_learners"): Learners(8, 0, 4)
    assert METHODS.get("dcml") is DCML


def test_learner_distances_are_rotation_invariant():
    torch.manual_seed(4)
    g = F.normalize(torch.randn(10, 3, 6), dim=-1)
    Q = torch.linalg.qr(torch.randn(6, 6))[0]
    g[:, 2] = g[:, 0] @ Q
    d = learner_distances(g)
    assert d[0, 2] < 1e-5 and d[0, 1] > 0.05 and d[1, 2] > 0.05
    torch.testing.assert_close(d, d.T)


@pytest.mark.slow
def test_two_epoch_run_improves_recall_at_1(tmp_path, one_thread):
    import numpy as np
    from dml_book.train import LabelledSubset, Trainer, preset_config
    cfg = preset_config("dcml", "glyphs", epochs=2, batch_size=32, max_steps_per_epoch=15, out=str(tmp_path))
    tr = Trainer(cfg)
    assert isinstance(tr.model.head, Learners) and tr.model.embedding_dim == 64 and cfg.loss == "margin"
    keep = np.where(tr.test_ds.labels < 30)[0]            # 30 of the 105 test classes: a quicker evaluation
    tr.test_ds = LabelledSubset(tr.test_ds, keep, relabel=True)
    final = tr.fit()
    untrained = tr.history[0]
    assert untrained["epoch"] == 0 and untrained["kind"] == "epoch"
    assert final["R@1"] > untrained["R@1"] + 0.05, (untrained["R@1"], final["R@1"])
    step = next(r for r in tr.history if r["kind"] == "step")
    assert {"dis", "sub", "rein", "loss"} <= set(step)
    assert step["loss"] == pytest.approx(step["dis"] + step["sub"] + 0.05 * step["rein"], rel=1e-5)


def test_resumed_run_equals_uninterrupted(tmp_path, one_thread):
    from dml_book.train import Trainer, preset_config
    kw = dict(dataset="digits", batch_size=20, m_per_class=4, max_steps_per_epoch=4)
    full = Trainer(preset_config("dcml", "glyphs", epochs=2, out=str(tmp_path / "full"), **kw))
    full.fit()
    Trainer(preset_config("dcml", "glyphs", epochs=1, out=str(tmp_path / "cut"), **kw)).fit()
    resumed = Trainer(preset_config("dcml", "glyphs", epochs=2, out=str(tmp_path / "cut"), **kw))
    resumed.fit()
    for a, b in zip(full.method.state_dict().values(), resumed.method.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert full.history[-1]["R@1"] == resumed.history[-1]["R@1"]


def test_presets_are_valid_configs():
    from dml_book.train import TrainConfig, preset_config
    for name in DCML.presets:
        cfg = preset_config("dcml", name)
        assert isinstance(cfg, TrainConfig)
        DCML(**cfg.method_kwargs)                             # every preset's kwargs construct the method
    for ds in ("cub200", "cars196", "sop"):   # Sec. 4.2
        paper = preset_config("dcml", ds)
        assert (paper.dataset, paper.backbone, paper.pretrained) == (ds, "resnet50", True)
        assert (paper.embedding_dim, paper.method_kwargs["learner_dim"], paper.method_kwargs["n_compositors"]) == (512, 128, 8)
        assert (paper.method_kwargs["lambda_m"], paper.method_kwargs["lambda_r"]) == (1.0, 0.05)
        assert (paper.batch_size, paper.lr_backbone, paper.lr_head, paper.transform) == (112, 1e-6, 1e-6, "randomresized224")
        assert (paper.loss, paper.miner) == ("margin", "distance_weighted")          # DCML-MDW
        assert paper.ks == ((1, 10, 100, 1000) if ds == "sop" else (1, 2, 4, 8))     # Tables 3-5
    for v, (loss, miner) in {"tr": ("triplet", "random"), "tsh": ("triplet", "semihard"), "pn": ("proxynca", None)}.items():
        cfg = preset_config("dcml", f"cub200-{v}")                                   # the row pairs of Tables 3-5
        assert (cfg.loss, cfg.miner) == (loss, miner) and cfg.batch_size == 112
    assert {f"glyphs-{a}" for a in DCML.ablations} <= set(DCML.presets)


def test_compositor_learning_rate_group():
    tr, method, _, _ = _fake_trainer(lr_compositor=0.02)
    (group,) = method.param_groups(tr)
    assert group["lr"] == 0.02 and len(group["params"]) == 4


@pytest.mark.parametrize("normalize", [False, True])
def test_subtask_loss_is_the_sum_over_composites(normalize):
    tr, method, x, labels = _fake_trainer(normalize_composites=normalize)
    g = tr.model.head.sub_embeddings(tr.model.backbone(x))
    out = method.losses(tr, g, labels)
    z, _ = method.composites(g)
    if normalize: z = F.normalize(z, dim=-1)
    torch.testing.assert_close(out["sub"], sum(tr.loss_fn(z[:, m], labels) for m in range(4)))   # eq. 8
    torch.testing.assert_close(out["dis"], tr.loss_fn(g.flatten(1), labels))


def test_without_jt_the_subtasks_train_the_learners_but_not_the_compositors():
    "Table 1's 'w/o J_T': J_T still reaches the learners (unchanged), but no longer the compositors."
    tr, full, x, labels = _fake_trainer()
    _, ablated, _, _ = _fake_trainer(jt_trains_compositor=False)
    ablated.load_state_dict(full.state_dict()); tr2 = tr
    g = tr.model.head.sub_embeddings(tr.model.backbone(x))
    W = tr.model.head.fc.weight
    sub_full, sub_ablated = full.losses(tr, g, labels)["sub"], ablated.losses(tr2, g, labels)["sub"]
    torch.testing.assert_close(sub_full, sub_ablated)                                          # same value
    g_full = torch.autograd.grad(sub_full, [W, full.compositor.weighting], retain_graph=True)
    g_abl = torch.autograd.grad(sub_ablated, [W, ablated.compositor.weighting], retain_graph=True, allow_unused=True)
    torch.testing.assert_close(g_abl[0], g_full[0])                                            # learners: as before
    assert g_full[1].abs().sum() > 0 and g_abl[1] is None                                      # compositors: nothing
    rein = ablated.losses(tr2, g, labels)["rein"]
    assert torch.autograd.grad(rein, ablated.compositor.weighting)[0].abs().sum() > 0          # J_rein still trains them
    assert DCML.ablations["no-jt"] == dict(jt_trains_compositor=False)


def test_relu_weighting_is_table_2s_exp_to_relu():
    comp = _compositor()
    relu = Compositor(20, 4, 6, weighting="relu"); relu.load_state_dict(comp.state_dict())
    y = F.normalize(torch.randn(7, 20), dim=-1)
    a = torch.einsum("bi,mki->bmk", y, comp.weighting) + comp.weighting_bias
    want = a.clamp_min(0) / a.clamp_min(0).sum(-1, keepdim=True).clamp_min(1e-12)
    torch.testing.assert_close(relu(y).abs(), want)
    assert (relu(y) == 0).any()                                       # unlike the softmax, a learner can get no weight
    with pytest.raises(ValueError, match="unknown weighting"): Compositor(20, 4, 6, weighting="exp")


def test_margin_loss_and_sampler_on_composites_see_the_same_unit_vectors():
    "The paper's set-up on the composites (margin loss + distance-weighted sampling), with lambda_m = 0.5."
    from dml_book.losses import MarginLoss
    from dml_book.miners import DistanceWeightedMiner
    seen = {"miner": [], "loss": []}
    class Recording(DistanceWeightedMiner):
        def mine(self, e, l): seen["miner"].append(e.clone()); return super().mine(e, l)
    class RecordingLoss(MarginLoss):
        def forward(self, e, l, t=None, weights=None): seen["loss"].append(e.detach().clone()); return super().forward(e, l, t, weights)
    tr, method, x, labels = _fake_trainer(lambda_m=0.5)
    tr.loss_fn, tr.miner = RecordingLoss(), Recording()
    g = tr.model.head.sub_embeddings(tr.model.backbone(x))
    torch.manual_seed(3); out = method.losses(tr, g, labels)
    torch.testing.assert_close(out["loss"], out["dis"] + 0.5 * out["sub"] + 0.05 * out["rein"])
    assert len(seen["miner"]) == len(seen["loss"]) == 1 + 4                       # J_dis, then the 4 composites
    for e_miner, e_loss in zip(seen["miner"][1:], seen["loss"][1:]):
        torch.testing.assert_close(e_miner, e_loss)                               # the same composites ...
        torch.testing.assert_close(e_loss.norm(dim=1), torch.ones(len(e_loss)))   # ... on the unit sphere
    z, _ = method.composites(g)
    torch.manual_seed(3); tr.loss_fn(g.flatten(1), labels, tr.miner(g.flatten(1), labels))
    want = sum(tr.loss_fn(F.normalize(z[:, m], dim=-1), labels, tr.miner(F.normalize(z[:, m], dim=-1), labels)) for m in range(4))
    torch.testing.assert_close(out["sub"], want)


@pytest.mark.parametrize("variant", ["tr", "tsh", "pn"])
def test_loss_variants_of_tables_3_to_5_train(tmp_path, variant, one_thread):
    "DCML-TR, -TSH and -PN take training steps; PN's subtasks have proxies of the composites' size, one set each."
    from dml_book.train import Trainer, preset_config
    cfg = preset_config("dcml", f"glyphs-{variant}", dataset_kwargs={"size": 16, "per_font": 1}, epochs=1,
                        max_steps_per_epoch=2, batch_size=32, out=str(tmp_path))
    tr = Trainer(cfg)
    if variant == "pn":
        proxies = [l.proxies for l in tr.method.subtask_losses]
        assert len(proxies) == 8 and all(p.shape == (len(tr.train_ds.class_names), 16) for p in proxies)
        assert len({p.data_ptr() for p in proxies}) == 8
    tr.fit()
    steps = [r for r in tr.history if r["kind"] == "step"]
    assert len(steps) == 2 and all(math.isfinite(r["loss"]) and math.isfinite(r["sub"]) for r in steps)
