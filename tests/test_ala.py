"ALA (Zheng et al., CVPR 2020): meta-gradient, Algorithm 1's final step, checkpoints, and a short run on built-in data."
import copy
from types import SimpleNamespace

import pytest
from dml_book.checkpoint import read_checkpoint
import torch
import torch.nn as nn

from dml_book.distances import all_triplets
from dml_book.losses import ContrastiveLoss, MarginLoss, TripletLoss
from dml_book.methods.ala import (ALA, Assessor, assessment_stats, hardness_ratio, meta_objective, meta_surrogate, rule_weights,
                                   tuple_embeddings, tuple_hardness, weighted_sum)
from dml_book.models import EmbeddingNet
from dml_book.registry import METHODS
from dml_book.train import Trainer, precision_view


def _meta_grad_check(head, dtype=torch.float64, seed=0, lrs=0.5):
    "Directional derivative of eq. (11) along random directions in phi: autograd against central differences."
    g = torch.Generator().manual_seed(seed)
    ass = Assessor(9 if head.out_features == 3 else 3 * head.out_features, hidden_size=5).to(dtype)
    x, y = torch.randn(8, head.in_features, generator=g, dtype=dtype), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    xv, yv = torch.randn(6, head.in_features, generator=g, dtype=dtype), torch.tensor([4, 4, 5, 5, 6, 6])
    loss_fn, params = TripletLoss(margin=0.5), dict(head.named_parameters())
    state = tuple(torch.randn(2, 1, 5, generator=g, dtype=dtype) for _ in range(2))   # a carried LSTM state

    def L_val():
        emb = head(x); t = all_triplets(y)
        return meta_objective(ass, state, tuple_embeddings(emb, t), emb, y, t, head, params, lrs, xv, yv, loss_fn)

    grads = torch.autograd.grad(L_val(), list(ass.parameters()))
    assert sum(float(gr.abs().sum()) for gr in grads) > 0
    for _ in range(3):
        v = [torch.randn(p.shape, generator=g, dtype=dtype) for p in ass.parameters()]
        def at(eps):
            with torch.no_grad():
                for p, d in zip(ass.parameters(), v): p.add_(eps * d)
                out = None
            out = L_val().item()
            with torch.no_grad():
                for p, d in zip(ass.parameters(), v): p.sub_(eps * d)
            return out
        fd = (at(1e-6) - at(-1e-6)) / 2e-6
        analytic = sum(float((gr * d).sum()) for gr, d in zip(grads, v))
        assert analytic == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_meta_gradient_matches_finite_differences():
    torch.manual_seed(0)
    _meta_grad_check(nn.Linear(4, 3).double())
    _meta_grad_check(nn.Linear(5, 3).double(), seed=1, lrs=[0.3, 0.7])   # per-parameter alpha


def _episode(n_train=8, n_val=4, dim=16, seed=0):
    "An episode like EpisodeSampler's: n_train images of classes 0-1, then n_val of classes 2-3."
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_train + n_val, 1, 4, 4, generator=g)
    y = torch.cat([torch.arange(2).repeat_interleave(n_train // 2), 2 + torch.arange(2).repeat_interleave(n_val // 2)])
    return x, y


def _trainer(backbone=None, loss_fn=None, miner=None, seed=0):
    torch.manual_seed(seed)
    backbone = backbone or nn.Sequential(nn.Flatten(), nn.Linear(16, 10), nn.ReLU())
    model = EmbeddingNet(backbone, 10, 4)
    cfg = SimpleNamespace(lr_backbone=1e-3, lr_head=1e-2, m_per_class=2, seed=0, optimizer="auto")
    return precision_view(SimpleNamespace(cfg=cfg, device=torch.device("cpu"), model=model, loss_fn=loss_fn or TripletLoss(margin=0.5),
                           miner=miner, optimizer=None, train_ds=None))


def _optimizer(model, cfg):
    "What the trainer builds for ALA: SGD (its optimizer_name), one group per part."
    return torch.optim.SGD([{"params": model.backbone.parameters(), "lr": cfg.lr_backbone},
                            {"params": model.head.parameters(), "lr": cfg.lr_head}], lr=cfg.lr_head)


def _setup(tr, **kw):
    method = ALA(n_train=8, n_val=4, meta_steps=2, max_tuples=20, hidden_size=8, **kw)
    method.setup(tr)
    tr.method, tr.optimizer = method, _optimizer(tr.model, tr.cfg)
    return method


LOSSES = {"triplet": lambda: TripletLoss(margin=0.5), "contrastive": lambda: ContrastiveLoss(), "margin": lambda: MarginLoss()}


@pytest.mark.parametrize("step,loss", [("head", "triplet"), ("all", "triplet"), ("head", "contrastive"), ("head", "margin")])
def test_iteration_is_one_plain_step_with_the_updated_assessor(step, loss):
    tr = _trainer(loss_fn=LOSSES[loss]())
    method = _setup(tr, step=step)
    assert method.arity == (2 if loss == "contrastive" else 3)
    x, y = _episode()
    # two warm-up iterations so that the LSTM state, Adam moments and the generator are not at their initial values
    for s in (1, 2): Trainer.training_step(tr, *_episode(seed=s))
    model0, opt_state0, loss0 = copy.deepcopy(tr.model), copy.deepcopy(tr.optimizer.state_dict()), copy.deepcopy(tr.loss_fn)
    state0, gen0 = method.state, method.generator.get_state()
    assessor0 = copy.deepcopy(method.assessor)
    param_ids = [id(p) for p in tr.model.parameters()]

    out = Trainer.training_step(tr, x, y)

    # the manual computation: same tuples (replayed generator), the *updated* assessor, one step of a copy of the optimiser
    replay = ALA(n_train=8, n_val=4, max_tuples=20); replay.arity = method.arity; replay.generator.set_state(gen0)
    emb = model0(x[:8])
    t = replay._tuples(tr, emb, y[:8])
    with torch.no_grad(): w, _ = method.assessor(tuple_embeddings(emb, t), state0)
    opt = _optimizer(model0, tr.cfg); opt.load_state_dict(opt_state0)
    opt.zero_grad(); weighted_sum(loss0, emb, y[:8], t, w).backward(); opt.step()
    for (name, p), p0 in zip(tr.model.named_parameters(), model0.parameters()):
        torch.testing.assert_close(p, p0, rtol=1e-6, atol=1e-7, msg=name)
    assert out["tuples"] == len(w) and out["weight_mean"] == pytest.approx(w.mean().item(), rel=1e-6)
    if method.arity == 3:   # Fig. 4's AWH of the weights that took the step, on these tuples
        r = hardness_ratio(emb, t)
        assert out["awh"] == pytest.approx((w / w.mean() * r).mean().item(), rel=1e-5)
        assert out["awh_baseline"] == pytest.approx(r.mean().item(), rel=1e-6)
    # the assessor moved (K meta-steps happened) and no stepped copy is kept anywhere
    assert any(not torch.equal(a, b) for a, b in zip(method.assessor.parameters(), assessor0.parameters()))
    assert [id(p) for p in tr.model.parameters()] == param_ids
    assert {k.split(".")[0] for k in method.state_dict()} == {"assessor", "_extra_state"}
    assert sum(p.numel() for p in method.parameters()) == sum(p.numel() for p in method.assessor.parameters())
    held = [v for v in vars(method).values() if isinstance(v, dict) and any(torch.is_tensor(t) and t.requires_grad for t in v.values())]
    assert held == []
    assert all(not s.requires_grad for s in method.state)


@pytest.mark.parametrize("step", ["head", "all"])
def test_batchnorm_statistics_see_only_the_real_forward(step):
    "Neither the look-ahead nor the validation subset moves the running statistics (with step='head' they once did)."
    bb = nn.Sequential(nn.Flatten(), nn.Linear(16, 10), nn.BatchNorm1d(10), nn.ReLU())
    tr = _trainer(backbone=bb)
    method = _setup(tr, step=step)
    x, y = _episode()
    ref = copy.deepcopy(tr.model.backbone)
    ref(x[:8])                                      # the one forward of the original metric on the training subset
    Trainer.training_step(tr, x, y)
    torch.testing.assert_close(tr.model.backbone[2].running_mean, ref[2].running_mean)
    torch.testing.assert_close(tr.model.backbone[2].running_var, ref[2].running_var)


def test_resumed_run_equals_uninterrupted():
    def fresh():
        tr = _trainer(); return tr, _setup(tr)
    tr, m = fresh()
    for s in range(3): Trainer.training_step(tr, *_episode(seed=s))
    tr2, m2 = fresh()
    Trainer.training_step(tr2, *_episode(seed=0))
    ckpt = copy.deepcopy({"model": tr2.model.state_dict(), "opt": tr2.optimizer.state_dict(), "method": m2.state_dict()})
    tr3, m3 = fresh()                               # a new process: everything rebuilt, then loaded
    tr3.model.load_state_dict(ckpt["model"]); tr3.optimizer.load_state_dict(ckpt["opt"]); m3.load_state_dict(ckpt["method"])
    assert m3.state is not None and torch.equal(m3.state[0], m2.state[0])
    for s in (1, 2): Trainer.training_step(tr3, *_episode(seed=s))
    for p, q in zip(tr.model.parameters(), tr3.model.parameters()): torch.testing.assert_close(p, q, rtol=0, atol=0)
    for p, q in zip(m.assessor.parameters(), m3.assessor.parameters()): torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown step 'backbone'; choose from: head, all"): ALA(step="backbone")
    with pytest.raises(ValueError, match="meta_steps must be an integer >= 1"): ALA(meta_steps=0)
    tr = _trainer(); method = _setup(tr)
    with pytest.raises(ValueError, match="n_train \\+ n_val = 12 images"): Trainer.training_step(tr, *(t[:10] for t in _episode()))


def test_registered_with_paper_presets():
    assert METHODS.get("ala") is ALA
    p = ALA.presets["paper"]
    assert (p["lr_backbone"], p["lr_head"], p["method_kwargs"]["assessor_lr"]) == (1e-4, 1e-3, 4e-4)
    assert {ALA.presets[f"paper-{l}"]["loss"] for l in ("contrastive", "triplet", "margin")} == {"contrastive", "triplet", "margin"}


@pytest.mark.slow
def test_two_epochs_on_glyphs_improve_recall(tmp_path, one_thread):
    import json
    import numpy as np
    from dml_book.train import LabelledSubset, Trainer, TrainConfig
    cfg = TrainConfig(method="ala", dataset="glyphs", epochs=2, max_steps_per_epoch=6, m_per_class=5, lr_backbone=1e-3,
                      lr_head=1e-3, method_kwargs=dict(n_train=40, n_val=20, max_tuples=128), out=str(tmp_path), seed=0)
    tr = Trainer(cfg)
    labels = tr.test_ds.labels                      # a quarter of the test split (8 images of each of its 105 classes)
    tr.test_ds = LabelledSubset(tr.test_ds, np.concatenate([np.flatnonzero(labels == c)[:8] for c in np.unique(labels)]))
    tr.fit()
    summary = json.loads((tmp_path/"metrics.json").read_text())
    untrained, final = summary["untrained"]["R@1"], summary["final"]["R@1"]   # same seed: epoch 0 is the untrained network
    assert final > untrained + 0.02, (untrained, final)
    steps = [json.loads(l) for l in (tmp_path/"log.jsonl").read_text().splitlines() if '"kind": "step"' in l]
    assert len(steps) == 12 and all(0 < s["weight_mean"] < 1 and s["tuples"] == 128 for s in steps)


def test_presets_make_train_configs():
    from dml_book.train import preset_config
    cfg = preset_config("ala", "paper-margin")
    assert (cfg.method, cfg.loss, cfg.backbone, cfg.lr_backbone, cfg.lr_head) == ("ala", "margin", "googlenet", 1e-4, 1e-3)
    assert ALA(**cfg.method_kwargs).assessor_lr == 4e-4


def test_trainer_resume_equals_uninterrupted(tmp_path, one_thread):
    "Through the real Trainer and checkpoint.pt: 2 epochs straight == 1 epoch, a new process, then epoch 2."
    from dml_book.train import Trainer, TrainConfig
    kw = dict(method="ala", dataset="digits", max_steps_per_epoch=3, m_per_class=10, seed=0,
              method_kwargs=dict(n_train=30, n_val=20, max_tuples=64))
    Trainer(TrainConfig(epochs=2, out=str(tmp_path/"straight"), **kw)).fit()
    Trainer(TrainConfig(epochs=1, out=str(tmp_path/"resumed"), **kw)).fit()
    Trainer(TrainConfig(epochs=2, out=str(tmp_path/"resumed"), **kw)).fit()
    a, b = (read_checkpoint(tmp_path/d/"checkpoint.pt") for d in ("straight", "resumed"))
    for part in ("model", "method"):
        for k in a[part]:
            if k.endswith("_extra_state"): continue
            torch.testing.assert_close(a[part][k], b[part][k], rtol=0, atol=0, msg=f"{part}.{k}")
    ea, eb = a["method"]["_extra_state"], b["method"]["_extra_state"]
    torch.testing.assert_close(ea["state"], eb["state"], rtol=0, atol=0)
    assert torch.equal(ea["generator"], eb["generator"])


def _weights_on(method, tuples):
    with torch.no_grad(): return method.assessor(tuples, method.state)[0]


@pytest.mark.parametrize("lr_head,loss", [(1e-2, TripletLoss(margin=0.5)), (1e-3, TripletLoss(margin=0.2, squared=True))])
def test_the_meta_gradient_is_far_above_adams_eps(lr_head, loss):
    """With gradients far above eps, Adam's first step moves every parameter by its full learning rate; with the
    vanishing meta-gradient (1e-12, below eps = 1e-8) it moved them by a ten-thousandth of it. At the chapter's scale
    and at the paper-triplet preset's (lr 1e-3 for the head, eq. 4's squared distances)."""
    tr = _trainer(loss_fn=loss); tr.cfg.lr_head = lr_head
    method = ALA(n_train=8, n_val=4, meta_steps=1, max_tuples=20, hidden_size=8); method.setup(tr)
    tr.method, tr.optimizer = method, _optimizer(tr.model, tr.cfg)
    before = [p.detach().clone() for p in method.assessor.parameters()]
    Trainer.training_step(tr, *_episode(seed=3))
    moved = torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(method.assessor.parameters(), before)])
    assert moved.median() > 0.5 * method.assessor_lr, moved.median()
    grads = torch.cat([st["exp_avg_sq"].sqrt().flatten() / 0.0316 for st in method.assessor_opt.state.values()])  # |g| of step 1
    assert grads.median() > 1e3 * method.assessor_opt.param_groups[0]["eps"]


def test_the_baseline_takes_the_same_episode_and_tuples_unweighted():
    "assess=False: the same tuples as ALA (same generator), every weight 1, one plain step on their sum."
    tr = _trainer(); method = _setup(tr, assess=False)
    x, y = _episode()
    model0, gen0 = copy.deepcopy(tr.model), method.generator.get_state()
    out = Trainer.training_step(tr, x, y)
    replay = ALA(n_train=8, n_val=4, max_tuples=20); replay.arity = 3; replay.generator.set_state(gen0)
    emb = model0(x[:8]); t = replay._tuples(tr, emb, y[:8])
    opt = _optimizer(model0, tr.cfg); opt.zero_grad(); weighted_sum(TripletLoss(margin=0.5), emb, y[:8], t).backward(); opt.step()
    for p, p0 in zip(tr.model.parameters(), model0.parameters()): torch.testing.assert_close(p, p0, rtol=1e-5, atol=1e-6)
    assert out["tuples"] == len(t[0]) and "val_loss" not in out
    # the same diagnostics as ALA's, of weights that are all 1: no spread, the unweighted AWH, a ratio of 1
    r = hardness_ratio(emb, t)
    assert (out["weight_mean"], out["weight_std"], out["weight_hardness_corr"], out["awh_ratio"]) == (1.0, 0.0, 0.0, 1.0)
    assert out["awh"] == pytest.approx(r.mean().item(), rel=1e-6) and out["awh_baseline"] == pytest.approx(out["awh"], rel=1e-12)


def test_adam_is_refused_and_the_paper_presets_follow_the_paper():
    tr = _trainer(); tr.cfg.optimizer = "adam"
    with pytest.raises(ValueError, match="use sgd"): _setup(tr)
    from dml_book.train import preset_config
    cfg = preset_config("ala", "paper-triplet")
    assert cfg.loss_kwargs == {"squared": True}                            # eq. (4): squared distances
    assert (cfg.lr_backbone, cfg.lr_head, cfg.method_kwargs["assessor_lr"]) == (1e-4, 1e-3, 4e-4)   # Sec. 3.4
    assert (cfg.embedding_dim, cfg.backbone, cfg.transform, cfg.optimizer) == (512, "googlenet", "retrieval227", "sgd")
    assert (cfg.method_kwargs["n_train"], cfg.method_kwargs["n_val"], cfg.method_kwargs["meta_steps"]) == (100, 20, 3)


def _spread_problem(D, n_train, n_val, loss, m=5, feat=32, seed=0):
    "A deterministic episode of Gaussian classes and an embedding network on its features; the trainer ALA sees."
    g = torch.Generator().manual_seed(seed); torch.manual_seed(seed)
    n_cls = (n_train + n_val) // m
    y = torch.arange(n_cls).repeat_interleave(m)
    x = torch.randn(n_cls, feat, generator=g)[y] + 0.8 * torch.randn(len(y), feat, generator=g)
    model = EmbeddingNet(nn.Sequential(nn.Linear(feat, feat), nn.ReLU()), feat, D)
    cfg = SimpleNamespace(lr_backbone=1e-4, lr_head=1e-3, m_per_class=m, seed=0, optimizer="auto")
    tr = precision_view(SimpleNamespace(cfg=cfg, device=torch.device("cpu"), model=model, loss_fn=loss, miner=None, optimizer=None, train_ds=None))
    return tr, x, y


SETTINGS = {   # (embedding dim, method settings, loss): the chapter's built-in run and the paper-* presets' (Sec. 3.4)
    "chapter": (64, dict(n_train=40, n_val=20, max_tuples=256), TripletLoss()),
    **{f"paper-{l}": (512, ALA.presets[f"paper-{l}"]["method_kwargs"], LOSSES[l]() if l != "triplet" else TripletLoss(squared=True))
       for l in ("triplet", "contrastive", "margin")}}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_k_assessor_steps_spread_the_weights(setting):
    """Adam moves each assessor parameter by about beta per step, and the sigmoid's slope is 1/4 at its centre: the K
    meta-steps of one iteration must change the weights of the iteration's tuples with a spread (std across tuples) of
    at least 4 K beta, a logit spread of about 16 K beta, many parameters moving in concert. With PyTorch's LSTM scale
    on unit-norm embeddings (input_scale=1, the chapter's former assessor) the spread was 1.1-1.6 K beta."""
    D, mk, loss = SETTINGS[setting]
    tr, x, y = _spread_problem(D, mk["n_train"], mk["n_val"], loss)
    method = ALA(**{**mk, "seed": 0}); method.setup(tr)
    tr.method, tr.optimizer = method, _optimizer(tr.model, tr.cfg)
    replay = ALA(**mk); replay.arity = method.arity; replay.generator.set_state(method.generator.get_state())
    emb = tr.model(x[:mk["n_train"]])
    tuples = tuple_embeddings(emb, replay._tuples(tr, emb, y[:mk["n_train"]]))
    state = method.state                             # the same tuples and carried state before and after
    with torch.no_grad(): before = method.assessor(tuples, state)[0]
    method.custom_step(tr, x, y)                      # K meta-steps (eq. 12), then eq. (13)
    with torch.no_grad(): after = method.assessor(tuples, state)[0]
    K, beta = method.meta_steps, method.assessor_lr
    assert (after - before).std() > 4 * K * beta, ((after - before).std(), 4 * K * beta)
    assert after.std() > before.std()


def test_awh_on_a_hand_computed_batch():
    """Sec. 4.4: AWH = mean of w_i d(a,p)/d(a,n), with the weights normalised to mean 1 as the step uses them.
    Three triplets with anchor (0,0): ratios 5/10, 1/4, 5/4; weights 0.2, 0.4, 0.6 -> 0.5, 1, 1.5."""
    emb = torch.tensor([[0., 0], [3, 4], [0, 10], [1, 0], [0, 4]])
    t = (torch.tensor([0, 0, 0]), torch.tensor([1, 3, 1]), torch.tensor([2, 4, 4]))
    torch.testing.assert_close(hardness_ratio(emb, t), torch.tensor([0.5, 0.25, 1.25]))
    st = assessment_stats(torch.tensor([0.2, 0.4, 0.6]), tuple_hardness(emb, t), hardness_ratio(emb, t))
    assert st["awh"] == pytest.approx((0.5 * 0.5 + 1 * 0.25 + 1.5 * 1.25) / 3)
    assert st["awh_baseline"] == pytest.approx(2 / 3) and st["awh_ratio"] == pytest.approx(2.375 / 2)
    assert st["weight_mean"] == pytest.approx(0.4) and st["weight_std"] == pytest.approx(0.2)   # unbiased std of 0.2, 0.4, 0.6
    h = [-5., -3., 1.]                              # d(a,p) - d(a,n)
    wc, hc = [-0.2, 0, 0.2], [x + 7 / 3 for x in h]
    corr = sum(a * b for a, b in zip(wc, hc)) / (sum(a * a for a in wc) * sum(b * b for b in hc)) ** 0.5
    assert st["weight_hardness_corr"] == pytest.approx(corr)
    # weights favouring the easy triplet lower AWH below the unweighted value
    assert assessment_stats(torch.tensor([0.6, 0.4, 0.2]), tuple_hardness(emb, t), hardness_ratio(emb, t))["awh_ratio"] < 1
    with pytest.raises(ValueError, match="defined on triplets"): hardness_ratio(emb, (t[0], t[1], t[0], t[2]))


@pytest.mark.parametrize("loss", ["triplet", "contrastive", "margin"])
def test_first_order_meta_gradient_equals_differentiating_through_the_step(loss):
    "meta_surrogate (first-order passes, forward mode) against meta_objective (a backward through eq. 10), every parameter stepped."
    torch.manual_seed(0)
    dt = torch.float64
    net = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 4)).to(dt)
    loss_fn = {"triplet": TripletLoss(margin=0.5), "contrastive": ContrastiveLoss(), "margin": MarginLoss()}[loss]
    x, y = torch.randn(8, 1, 5, 5, dtype=dt), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    xv, yv = torch.randn(6, 1, 5, 5, dtype=dt), torch.tensor([4, 4, 5, 5, 6, 6])
    params, bufs = dict(net.named_parameters()), {k: b.clone() for k, b in net.named_buffers()}
    emb = torch.nn.functional.normalize(torch.func.functional_call(net, {**params, **{k: b.clone() for k, b in bufs.items()}}, (x,)), dim=1)
    t = loss_fn.compute(emb, y, None).indices_tuple
    ass = Assessor(tuple_embeddings(emb, t).shape[1], hidden_size=5).to(dt)
    state = tuple(torch.randn(2, 1, 5, dtype=dt) for _ in range(2))
    rates = [0.3, 0.1, 0.5, 0.2, 0.4, 0.6]
    class Normed(nn.Module):   # the embedding network as the trainer has it: normalised output
        def __init__(self): super().__init__(); self.net = net
        def forward(self, inp): return torch.nn.functional.normalize(self.net(inp), dim=1)
    mod = Normed(); P = {f"net.{k}": v for k, v in params.items()}; B = {f"net.{k}": v for k, v in bufs.items()}
    ref = meta_objective(ass, state, tuple_embeddings(emb, t), emb, y, t, mod, P, rates, xv, yv, loss_fn, None, B, 0.01)
    val, sur = meta_surrogate(ass, state, tuple_embeddings(emb, t), emb, y, t, mod, P, rates, x, xv, yv, loss_fn, None, B, 0.01)
    assert val.item() == pytest.approx(ref.item(), rel=1e-12)
    g_ref, g_sur = (torch.autograd.grad(v, list(ass.parameters())) for v in (ref, sur))
    assert sum(float(g.abs().sum()) for g in g_ref) > 0
    for a, b in zip(g_ref, g_sur): torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("step", ["head", "all"])
def test_the_meta_gradient_survives_bf16_autocast(step):
    "The study may run the forward in bf16: the assessor's meta-gradient stays that of fp32 (the look-ahead itself runs in fp32)."
    bb = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 10), nn.ReLU())
    grads = {}
    for precision in ("fp32", "bf16"):
        tr = _trainer(backbone=copy.deepcopy(bb)); precision_view(tr, precision)
        method = ALA(n_train=8, n_val=4, meta_steps=1, max_tuples=20, hidden_size=8, step=step); method.setup(tr)
        tr.method, tr.optimizer = method, _optimizer(tr.model, tr.cfg)
        Trainer.training_step(tr, *_episode())
        grads[precision] = torch.cat([st["exp_avg"].flatten() / 0.1 for st in method.assessor_opt.state.values()])   # g of step 1
    a, b = grads["fp32"], grads["bf16"]
    cos = torch.nn.functional.cosine_similarity(a, b, dim=0)
    assert cos > 0.995, cos


def _recording(method):
    "Record the tuples `method` draws at each iteration."
    seen, draw = [], method._tuples
    method._tuples = lambda tr, emb, y: seen.append(draw(tr, emb, y)) or seen[-1]
    return seen


@pytest.mark.parametrize("rule", ["hardness", "semihard"])
def test_the_ceiling_uses_the_baselines_episodes_and_tuples(rule):
    "assess=False with a rule: the same episodes and tuples as the baseline at every iteration; only the weights differ."
    import numpy as np
    runs = {}
    for name, kw in {"baseline": dict(assess=False), "ceiling": dict(assess=False, rule=rule)}.items():
        tr = _trainer(seed=0); tr.train_ds = SimpleNamespace(labels=np.repeat(np.arange(12), 4))
        method = _setup(tr, **kw); seen = _recording(method)
        episodes = list(method.batch_sampler(tr))
        outs = [Trainer.training_step(tr, *_episode(seed=s)) for s in range(3)]
        runs[name] = dict(episodes=episodes, tuples=seen, outs=outs, weights=method.last["weights"], tr=tr)
    b, c = runs["baseline"], runs["ceiling"]
    assert b["episodes"] == c["episodes"] and len(b["episodes"]) > 0
    assert len(b["tuples"]) == len(c["tuples"]) == 3
    for tb, tc in zip(b["tuples"], c["tuples"]):
        for xb, xc in zip(tb, tc): assert torch.equal(xb, xc)
    assert torch.equal(b["weights"], torch.ones(len(b["weights"]))) and not torch.equal(c["weights"], b["weights"])
    assert all(o["awh_ratio"] == 1.0 for o in b["outs"])
    if rule == "hardness": assert all(o["awh_ratio"] > 1 for o in c["outs"])    # the rule favours the harder triplets
    else: assert set(c["weights"].tolist()) == {0.0, 1.0}                       # semi-hard ones selected, the rest dropped


def test_the_ceilings_step_is_the_rule_weighted_step():
    tr = _trainer(); method = _setup(tr, assess=False, rule="hardness", rule_temperature=0.05)
    x, y = _episode()
    model0, gen0 = copy.deepcopy(tr.model), method.generator.get_state()
    Trainer.training_step(tr, x, y)
    replay = ALA(n_train=8, n_val=4, max_tuples=20); replay.arity = 3; replay.generator.set_state(gen0)
    emb = model0(x[:8]); t = replay._tuples(tr, emb, y[:8])
    w = torch.sigmoid((tuple_hardness(emb, t) - tuple_hardness(emb, t).mean()) / 0.05)
    opt = _optimizer(model0, tr.cfg); opt.zero_grad(); weighted_sum(TripletLoss(margin=0.5), emb, y[:8], t, w).backward(); opt.step()
    for p, p0 in zip(tr.model.parameters(), model0.parameters()): torch.testing.assert_close(p, p0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(method.last["weights"], w.detach())


def test_rule_weights_and_their_settings():
    h, l = torch.tensor([-0.5, -0.1, 0.05, -0.3]), torch.tensor([0.0, 0.1, 0.25, 0.0])
    assert torch.equal(rule_weights("semihard", h, l), torch.tensor([0., 1, 0, 0]))
    assert torch.equal(rule_weights("semihard", h, torch.zeros(4)), torch.ones(4))
    assert torch.equal(rule_weights("hardness", h, l).argsort(), h.argsort())
    with pytest.raises(ValueError, match="set assess=False"): ALA(rule="hardness")
    with pytest.raises(ValueError, match="unknown rule 'easy'"): ALA(assess=False, rule="easy")
    with pytest.raises(ValueError, match="rule_temperature must be > 0"): ALA(assess=False, rule="hardness", rule_temperature=0)
    with pytest.raises(ValueError, match="episodes_per_epoch must be an integer >= 1"): ALA(episodes_per_epoch=0)
    tr = _trainer(loss_fn=ContrastiveLoss())
    with pytest.raises(ValueError, match="selects triplets; this loss forms pairs"): _setup(tr, assess=False, rule="semihard")


def test_episodes_per_epoch_keeps_the_epoch_with_a_larger_validation_subset():
    import numpy as np
    tr = _trainer(); tr.train_ds = SimpleNamespace(labels=np.repeat(np.arange(40), 4)); tr.cfg.m_per_class = 2
    default = ALA(n_train=8, n_val=4).batch_sampler(tr)
    big = ALA(n_train=8, n_val=24, episodes_per_epoch=len(default)).batch_sampler(tr)
    assert len(default) == 160 // 12 and len(big) == len(default) and len(ALA(n_train=8, n_val=24).batch_sampler(tr)) == 160 // 32
    assert all(len(e) == 32 for e in big)


def test_end_epoch_logs_the_epochs_means():
    tr = _trainer(); method = _setup(tr)
    outs = [Trainer.training_step(tr, *_episode(seed=s)) for s in range(3)]
    rec = method.end_epoch(tr, 1)
    for k in ("weight_mean", "weight_std", "weight_hardness_corr", "awh", "awh_baseline", "awh_ratio"):
        assert rec[k] == pytest.approx(sum(o[k] for o in outs) / 3, rel=1e-9), k
    assert method._stats == [] and method.end_epoch(tr, 2) == {}   # the next epoch starts from no iterations


def _tiny_log(tmp_path, awh=True):
    import json
    from dml_book.study import read_log
    recs = [dict(epoch=0, step=0, kind="epoch")]
    for e in (1, 2):
        for i in range(1, 4):
            extra = dict(awh=0.5 + 0.1 * e, awh_baseline=0.5, awh_ratio=1 + 0.2 * e) if awh else {}
            recs.append(dict(epoch=e, step=3 * (e - 1) + i, kind="step", loss=1.0, weight_mean=0.5, weight_std=0.01 * e, **extra))
        recs.append(dict(epoch=e, step=3 * e, kind="epoch", weight_hardness_corr=0.1 * e))
    (tmp_path/"log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return read_log(tmp_path/"log.jsonl")


@pytest.mark.parametrize("awh", [True, False])
def test_fig4_from_a_log_with_and_without_awh(tmp_path, awh):
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from dml_book.methods.ala import plot_weight_analysis
    fig = plot_weight_analysis(_tiny_log(tmp_path, awh)[0])
    a, b, c, d = fig.axes
    assert len(a.lines) == 2 and list(a.lines[0].get_ydata()) == [0.01] * 3 + [0.02] * 3
    if awh: assert len(c.lines) == 4 and list(d.lines[0].get_ydata()) == [1.2] * 3 + [1.4] * 3
    else: assert len(c.lines) == 0 and "not logged" in c.texts[0].get_text()
    plt.close(fig)


def _store(root, arms):
    "A results store results/ala/<arm>/seed<k>/metrics.json: arm -> (per-seed R@1, per-seed epoch values)."
    import json
    for arm, (r1, epochs) in arms.items():
        for seed, (r, recs) in enumerate(zip(r1, epochs)):
            d = root/"ala"/arm/f"seed{seed}"; d.mkdir(parents=True)
            cfg = dict(method="ala", dataset="glyphs_xl", loss="triplet", seed=seed)
            eps = [dict(epoch=0, step=0, kind="epoch")] + [dict(epoch=e, step=e, kind="epoch", **v) for e, v in enumerate(recs, 1)]
            (d/"metrics.json").write_text(json.dumps(dict(config=cfg, environment={}, final={"R@1": r}, epochs=eps)))


def test_the_conclusion_from_a_stored_study(tmp_path):
    from dml_book.methods.ala import ala_conclusion, late_means
    ratios = [[1.0, 1.0, 1.3, 1.5], [1.0, 1.0, 1.2, 1.4], [1.0, 1.0, 1.25, 1.45]]   # second half: epochs 3, 4
    _store(tmp_path, {"baseline": ([0.60, 0.62, 0.61], [[{"awh_ratio": 1.0}] * 4] * 3),
                      "ala": ([0.61, 0.63, 0.615], [[{"awh_ratio": x} for x in r] for r in ratios]),
                      "ceiling": ([0.58, 0.66, 0.60], [[{"weight_hardness_corr": 0.0}] * 4] * 3)})
    import numpy as np
    np.testing.assert_allclose(late_means(tmp_path/"ala"/"ala", "awh_ratio"), [1.4, 1.3, 1.35])
    s = ala_conclusion(tmp_path)
    assert s.startswith("ALA favours harder tuples: over the second half of training its weighted hardness is 1.350 times")
    assert "(AWH ratio, 3 seeds, 95% interval 1.226 to 1.474)" in s   # 1.35 +- t(0.975, 2) * 0.05 / sqrt(3)
    assert "On glyphs-XL, ALA changes R@1 by +0.8" in s
    assert "The fixed hardness rule shows no preference" in s and "averages +0.00 (these runs predate AWH" in s
    assert ala_conclusion(tmp_path/"nothing") is None


def test_the_conclusion_of_the_stored_study_recomputes_its_numbers():
    "On the study stored in results/ (if any): the correlation it quotes is the seeds' second-half mean of metrics.json."
    import json
    from pathlib import Path
    from dml_book.methods.ala import ala_conclusion
    root = Path(__file__).resolve().parents[1]/"results"
    if not (root/"ala"/"ala").is_dir(): pytest.skip("no stored ALA study")
    s = ala_conclusion(root)
    key = "awh_ratio" if "AWH ratio" in s.split(". ")[0] else "weight_hardness_corr"
    per_seed = []
    for f in sorted((root/"ala"/"ala").glob("seed*/metrics.json")):
        recs = [(r["epoch"], r[key]) for r in json.loads(f.read_text())["epochs"] if r.get(key) is not None]
        half = max(e for e, _ in recs) / 2
        per_seed.append(sum(v for e, v in recs if e > half) / len([v for e, v in recs if e > half]))
    m = sum(per_seed) / len(per_seed)
    assert (f"{m:.3f} times" if key == "awh_ratio" else f"averages {m:+.2f}") in s and f"{len(per_seed)} seeds" in s
