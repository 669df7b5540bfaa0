"HDML (Zheng et al., CVPR 2019): augmentation formula, schedules, gradient routing, ablations, a short run, resume."
import copy, json, math
import numpy as np
import pytest
import torch
from dml_book.losses import NPairLoss
from dml_book.methods.hdml import (HDML, Generator, WindowAverage, decay_penalty, grouped_npair_loss, hardness_aware_augment,
                                   npair_pairs, npair_synthesis, official_j_m, official_triplet_loss, pulling_lambda,
                                   random_triplets, synthesis_weight, triplet_synthesis, violation_share)
from dml_book.config import ConfigError
from dml_book.losses import TripletLoss
from dml_book.train import Trainer, TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py: one thread, restored after each test


def augment_loop(z, z_neg, d_ref, lam):
    "Eq. (4)-(7) one pair at a time."
    out = z_neg.clone()
    for b in range(len(z)):
        d = torch.linalg.norm(z_neg[b] - z[b])
        if d > d_ref[b]: out[b] = z[b] + (lam * d + (1 - lam) * d_ref[b]) * (z_neg[b] - z[b]) / d
    return out


# ---- eq. (4)-(7) ---------------------------------------------------------------------------------------------------
def test_augment_hand_computed():
    z = torch.tensor([[0., 0.], [1., 1.], [0., 0.], [2., 0.]])
    z_neg = torch.tensor([[3., 4.], [1., 3.], [0.5, 0.], [2., -6.]])
    d_ref = torch.tensor([1., 2., 1., 2.])
    out = hardness_aware_augment(z, z_neg, d_ref, 0.5)
    # row 0: d = 5 > 1, new distance 0.5*5 + 0.5*1 = 3 along (0.6, 0.8); row 3: d = 6, new distance 4 along (0, -1)
    torch.testing.assert_close(out[0], torch.tensor([1.8, 2.4]))
    torch.testing.assert_close(out[3], torch.tensor([2., -4.]))
    torch.testing.assert_close(out[1], z_neg[1])          # d = d+ = 2: unchanged
    torch.testing.assert_close(out[2], z_neg[2])          # d = 0.5 < d+ = 1: unchanged
    out = hardness_aware_augment(z, z_neg, d_ref, 0.25)
    torch.testing.assert_close(out[0], torch.tensor([0.6, 0.8]) * (0.25 * 5 + 0.75 * 1))


def test_augment_lambda_limits():
    g = torch.Generator().manual_seed(0)
    z, z_neg = torch.randn(50, 6, generator=g), torch.randn(50, 6, generator=g)
    d = torch.linalg.norm(z_neg - z, dim=1)
    d_ref = d * torch.linspace(0.2, 1.5, 50)             # half the negatives farther than d+, half not
    torch.testing.assert_close(hardness_aware_augment(z, z_neg, d_ref, 1.0), z_neg)   # lam = 1: identity
    far = d > d_ref
    out = hardness_aware_augment(z, z_neg, d_ref, 1e-9)  # lam -> 0: the negative lands at distance d+
    torch.testing.assert_close(torch.linalg.norm(out - z, dim=1)[far], d_ref[far], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[~far], z_neg[~far])
    cos = torch.nn.functional.cosine_similarity(out[far] - z[far], z_neg[far] - z[far])   # same direction
    torch.testing.assert_close(cos, torch.ones_like(cos))
    for lam in (0.0, 0.37, 0.9):
        torch.testing.assert_close(hardness_aware_augment(z, z_neg, d_ref, lam), augment_loop(z, z_neg, d_ref, lam))


def test_augment_bad_input():
    z = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="d_ref must be a"): hardness_aware_augment(z, z, torch.ones(3, 1), 0.5)
    with pytest.raises(ValueError, match="same shape"): hardness_aware_augment(z, torch.zeros(2, 2), torch.ones(3), 0.5)
    with pytest.raises(ValueError, match="lam must lie"): hardness_aware_augment(z, z, torch.ones(3), -0.1)
    with pytest.raises(ValueError, match="non-negative"): hardness_aware_augment(z, z, -torch.ones(3), 0.5)


def test_schedules():
    assert pulling_lambda(float("inf"), 7.) == 1.0 and pulling_lambda(0.5, 0.) == 1.0
    assert math.isclose(pulling_lambda(2.0, 7.), math.exp(-3.5))
    assert math.isclose(synthesis_weight(5e3, 1e4), math.exp(-2.0)) and synthesis_weight(float("inf"), 1e4) == 1.0
    avg = WindowAverage(2)
    assert [avg.update(x) for x in (1., 3., 10., 20.)] == [math.inf, 2., 2., 15.]


# ---- the official schedule: J_m, J_avg, lambda and the pulled negative (main_triplet.py, lib/HDML.py, lib/Loss_ops.py) ----
def official_pull(a, p, n, lam):
    "The official Pulling (lib/HDML.py lines 38-50): a + (n - a) (d_ap + (d_an - d_ap) lam) / d_an, n kept where d_ap >= d_an."
    dp, dn = torch.linalg.norm(a - p, dim=1, keepdim=True), torch.linalg.norm(a - n, dim=1, keepdim=True)
    return torch.where(dp >= dn, n, a + (n - a) * (dp + (dn - dp) * lam) / dn)


def test_official_schedule_hand_computed():
    # one batch of three triplets around the anchor (0, 0): squared distances 1 vs 25 (easy), 49 vs 9 (41), 4 vs 4 (1)
    z = torch.tensor([[0., 0.], [0., 1.], [3., 4.], [0., 7.], [3., 0.], [2., 0.], [0., 2.]])
    t = (torch.tensor([0, 0, 0]), torch.tensor([1, 3, 5]), torch.tensor([2, 4, 6]))
    assert official_triplet_loss(z, t).item() == 42.0                     # Loss_ops.py l. 164-168: margin 1, squared, summed
    assert official_triplet_loss(z, t, margin=0.0).item() == 40.0         # 41 - 1 and 1 - 1
    # weight decay 2 on (2, 2): 2/2 * 8 = 8 (main_triplet.py l. 63-65, l2_loss = |v|^2 / 2); the undecayed group adds nothing
    opt = torch.optim.Adam([dict(params=[torch.nn.Parameter(torch.tensor([2., 2.]))], weight_decay=2.0),
                            dict(params=[torch.nn.Parameter(torch.tensor([5.]))], weight_decay=0.0)])
    assert decay_penalty(opt) == 8.0
    # J_m = w (J + decay) (l. 70, 112): 50 at w = 1, 40 at w = 0.8; window 2 (64 in nn_Ops.py l. 196): J_avg = 45
    avg = WindowAverage(2)
    for w, want in ((1.0, 50.0), (0.8, 40.0)):
        j_m = official_j_m(official_triplet_loss(z, t).item(), decay_penalty(opt), w)
        assert j_m == pytest.approx(want)
        avg.update(j_m)
    assert avg.value == pytest.approx(45.0)
    lam = pulling_lambda(avg.value, 90.0)                                   # FLAGS.py l. 41: alpha = 90
    assert lam == pytest.approx(math.exp(-2.0))
    a, p, n = (z[i] for i in t)
    pulled = hardness_aware_augment(a, n, torch.linalg.norm(a - p, dim=1), lam)
    torch.testing.assert_close(pulled[0], torch.tensor([0.6, 0.8]) * (1 + 4 * math.exp(-2.0)))   # distance 5 -> 1 + 4 lam
    torch.testing.assert_close(pulled[1:], n[1:])                           # d+ = 7 > 3 and d+ = 2 = d: kept
    torch.testing.assert_close(pulled, official_pull(a, p, n, lam))


def test_method_feeds_the_official_j_m(tmp_path):
    "Each step logs J_m = w (official triplet loss of its real triplets + the optimiser's decay penalty); lambda follows its window mean."
    tr = _trainer(tmp_path, method_kwargs=dict(hidden=32, window=2))
    hd, (x, y) = tr.method, next(iter(tr.loader))
    assert (hd.j_m, hd.pulling_factor) == ("official", 90.0)
    j_ms = []
    for _ in range(2):
        state = copy.deepcopy(hd.get_extra_state())
        with torch.no_grad():
            z = tr.model(x)
            hd.set_extra_state(state)                                       # the same triplets as the step below
            real = hd.real_and_synthetic(tr, z, y, 1.0)[0]
        w = synthesis_weight(hd.j_gen_avg.value, hd.beta)
        want = w * (official_triplet_loss(z, real).item() + decay_penalty(tr.optimizer))
        hd.set_extra_state(state)
        logs = tr.training_step(x, y)
        assert logs["j_m"] == pytest.approx(want, rel=1e-5) and logs["lam"] == 1.0
        j_ms.append(logs["j_m"])
    assert decay_penalty(tr.optimizer) > 0 and 0 < j_ms[0]
    logs = tr.training_step(x, y)
    assert logs["lam"] == pytest.approx(math.exp(-90.0 / np.mean(j_ms)), rel=1e-6)
    assert 0 <= logs["viol_real"] <= 1 and 0 <= logs["viol_syn"] <= 1


def test_old_schedule_is_the_loss(tmp_path):
    "j_m='loss' (the chapter's first version): J_avg averages the run's J(T)."
    tr = _trainer(tmp_path, method_kwargs=dict(hidden=32, window=1, j_m="loss", pulling_factor=0.1))
    x, y = next(iter(tr.loader))
    logs = tr.training_step(x, y)
    assert logs["j_m"] == logs["j_real"] and tr.method.j_avg.value == pytest.approx(logs["j_real"])
    with pytest.raises(ConfigError, match="HDML has no j_m 'mean'; choose from: official, loss"): HDML(j_m="mean")


def test_violation_share_matches_the_loss():
    g = torch.Generator().manual_seed(5)
    z, labels = torch.randn(40, 6, generator=g), torch.arange(8).repeat(5)
    t = random_triplets(labels, g)
    for kw in (dict(margin=0.2), dict(margin=1.0, squared=True), dict(margin=1.0, squared=True, normalize=False)):
        per = TripletLoss(reduction="none", **kw)(z, labels, t).losses
        assert 0 < (per > 0).float().mean() < 1
        assert violation_share(TripletLoss(**kw), z, t).item() == pytest.approx((per > 0).float().mean().item())


def test_bf16_objectives_close_to_fp32(tmp_path):
    "Under bf16 autocast the forward is bf16, the losses fp32: the logged values stay within a few per cent of fp32's."
    tr = _trainer(tmp_path, method_kwargs=dict(hidden=32, window=1), loss_kwargs=dict(margin=1.0, squared=True, reduction="sum"))
    hd, (x, y) = tr.method, next(iter(tr.loader))
    tr.training_step(x, y)
    state, out = copy.deepcopy(hd.get_extra_state()), {}
    for precision in ("fp32", "bf16"):
        hd.set_extra_state(state)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            o = hd.objectives(tr, x, y)
        assert all(v.dtype == torch.float32 for k, v in o.items() if k.startswith("j_") and torch.is_tensor(v)), precision
        out[precision] = {k: float(v) for k, v in o.items()}
    for k in ("j_real", "j_syn", "j_recon", "j_soft", "j_gen", "j_m", "d_ap", "d_an", "d_an_syn"):
        assert out["bf16"][k] == pytest.approx(out["fp32"][k], rel=0.05), (k, out["bf16"][k], out["fp32"][k])


def test_synthesis_and_npair_loss():
    z = torch.tensor([[0., 0.], [0., 1.], [4., 0.], [4., 1.]])
    labels = torch.tensor([0, 0, 1, 1])
    z_in, l_in, (a, p, n) = triplet_synthesis(z, labels, (torch.tensor([0]), torch.tensor([1]), torch.tensor([2])), 0.0)
    torch.testing.assert_close(z_in[n], torch.tensor([[1., 0.]]))     # lam = 0: the negative at d+ = 1
    assert l_in.tolist() == [0, 0, 1]
    # grouped N-pair loss equals the library's N-pair loss when every anchor has the same negatives
    g = torch.Generator().manual_seed(3)
    emb, lab = torch.randn(16, 4, generator=g), torch.arange(8).repeat(2)
    pa, pp = npair_pairs(lab)
    i, j = torch.arange(8).repeat_interleave(8), torch.arange(8).repeat(8)
    off = i != j
    for reg in (0., 0.05):
        torch.testing.assert_close(grouped_npair_loss(emb, pa[i[off]], pp[i[off]], pp[j[off]], reg),
                                   NPairLoss(l2_reg=reg, normalize=False)(emb, lab))
    z_in, l_in, (a, p, n) = npair_synthesis(emb, lab, (pa, pp), 0.5)
    assert len(z_in) == 8 + 64 and len(a) == 8 * 7
    torch.testing.assert_close(z_in[p], emb[pp][a])                     # the diagonal keeps the positives


def test_random_triplets_valid():
    labels = torch.tensor([0, 0, 1, 1, 1, 2])
    a, p, n = random_triplets(labels, torch.Generator().manual_seed(0))
    assert a.tolist() == [0, 1, 2, 3, 4]
    assert bool((labels[a] == labels[p]).all() and (a != p).all() and (labels[a] != labels[n]).all())


# ---- the method inside the trainer ----------------------------------------------------------------------------------
def _trainer(tmp_path, **kw):
    base = dict(dataset="glyphs", method="hdml", batch_size=16, m_per_class=4, embedding_dim=16, out=str(tmp_path),
                method_kwargs=dict(hidden=32, window=1))
    return Trainer(TrainConfig(**(base | kw)))


def _flat(grads, params):
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def test_gradient_routing(tmp_path):
    tr = _trainer(tmp_path)
    hd = tr.method
    own = {id(p) for p in hd.parameters()}
    assert not own & {id(p) for g in tr.optimizer.param_groups for p in g["params"]}
    assert {id(p) for g in hd.opt_gen.param_groups for p in g["params"]} == {id(p) for p in hd.generator.parameters()}
    assert {id(p) for g in hd.opt_softmax.param_groups for p in g["params"]} == {id(p) for p in hd.classifier.parameters()}
    for opt in (tr.optimizer, hd.opt_gen, hd.opt_softmax):
        for grp in opt.param_groups: grp["lr"], grp["weight_decay"] = 0.0, 0.0
    x, y = next(iter(tr.loader))
    tr.training_step(x, y)                               # window 1: the schedules are active from the next step
    before = copy.deepcopy(hd.get_extra_state())
    logs = tr.training_step(x, y)
    assert 0 < logs["lam"] < 1 and 0 < logs["weight"] < 1
    hd.set_extra_state(before)
    o = hd.objectives(tr, x, y)
    assert math.isclose(o["j_metric"].item(), logs["j_metric"], rel_tol=1e-5)
    grad = lambda loss, ps: torch.autograd.grad(loss, ps, retain_graph=True, allow_unused=True)
    m_ps, g_ps, s_ps = list(tr.model.parameters()), list(hd.generator.parameters()), list(hd.classifier.parameters())
    w = logs["weight"]
    eq11 = w * _flat(grad(o["j_real"], m_ps), m_ps) + (1 - w) * _flat(grad(o["j_syn"], m_ps), m_ps)
    torch.testing.assert_close(_flat([p.grad for p in m_ps], m_ps), eq11, atol=1e-5, rtol=1e-3)
    # the generator's gradient is J_gen's only, although J_metric does depend on the generator
    torch.testing.assert_close(_flat([p.grad for p in g_ps], g_ps), _flat(grad(o["j_gen"], g_ps), g_ps), atol=1e-5, rtol=1e-4)
    assert _flat(grad(o["j_metric"], g_ps), g_ps).abs().max() > 1e-6
    # the softmax layer learns from real features only, although J_soft depends on it
    torch.testing.assert_close(_flat([p.grad for p in s_ps], s_ps), _flat(grad(o["j_ce"], s_ps), s_ps))
    assert _flat(grad(o["j_soft"], s_ps), s_ps).abs().max() > 1e-6
    assert _flat(grad(o["j_ce"], m_ps), m_ps).abs().max() == 0     # and does not train the backbone


def test_ablations(tmp_path):
    for kw, check in [(dict(recon=False), lambda o, m: math.isclose(o["j_gen"].item(), m.gen_lambda * o["j_soft"].item(), rel_tol=1e-6)),
                      (dict(softmax=False), lambda o, m: math.isclose(o["j_gen"].item(), o["j_recon"].item(), rel_tol=1e-6)),
                      (dict(pulling_factor=0.0), lambda o, m: o["lam"] == 1.0)]:
        tr = _trainer(tmp_path / str(len(kw)) / next(iter(kw)), method_kwargs=dict(hidden=32, window=1) | kw)
        x, y = next(iter(tr.loader))
        tr.training_step(x, y)
        assert check(tr.method.objectives(tr, x, y), tr.method), kw
    with pytest.raises(ValueError, match="at least one of recon and softmax"): HDML(recon=False, softmax=False)
    with pytest.raises(ValueError, match="must be >= 0"): HDML(pulling_factor=-1.)


def test_npair_mode_and_wrong_loss(tmp_path):
    tr = _trainer(tmp_path / "np", loss="npair", m_per_class=2)
    assert tr.method.mode == "npair"
    x, y = next(iter(tr.loader))
    logs = tr.training_step(x, y)
    assert all(math.isfinite(v) for v in logs.values())
    with pytest.raises(ValueError, match="use --loss triplet or --loss npair"): _trainer(tmp_path / "c", loss="contrastive")


@pytest.mark.slow
def test_two_epochs_improve_recall_and_log_trajectory(tmp_path):
    final = train(TrainConfig(dataset="glyphs", method="hdml", epochs=2, batch_size=32, m_per_class=4, method_kwargs=dict(window=8),
                              max_steps_per_epoch=20, eval_every=2, out=str(tmp_path), seed=0))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert final["R@1"] > metrics["untrained"]["R@1"] + 0.05, (metrics["untrained"]["R@1"], final["R@1"])
    steps = [r for r in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines()) if r["kind"] == "step"]
    assert len(steps) == 40
    lam, j_gen, w = ([r[k] for r in steps] for k in ("lam", "j_gen", "weight"))
    assert lam[0] == 1.0 and w[0] == 1.0                       # no averages yet: no augmentation, real tuples only
    assert min(lam) < 0.99 and min(w) < 0.99 and all(0 <= v <= 1 for v in lam + w)
    assert all(math.isfinite(v) for v in j_gen) and min(j_gen[-8:]) < j_gen[0]


@pytest.mark.slow
def test_resume_is_identical(tmp_path):
    kw = dict(dataset="digits", method="hdml", batch_size=20, m_per_class=4, embedding_dim=16, max_steps_per_epoch=6,
              eval_every=1, method_kwargs=dict(hidden=32, window=4), seed=1)
    straight = train(TrainConfig(epochs=2, out=str(tmp_path / "a"), **kw))
    train(TrainConfig(epochs=1, out=str(tmp_path / "b"), **kw))
    resumed = train(TrainConfig(epochs=2, out=str(tmp_path / "b"), **kw))
    assert straight == resumed
    logs = [[json.loads(l) for l in (tmp_path / d / "log.jsonl").read_text().splitlines()] for d in "ab"]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]
    assert strip(logs[0]) == strip(logs[1])


def test_paper_presets_take_a_step(tmp_path):
    "The paper presets (loss reductions, unnormalised head, ablations) run, here on a small CNN and the built-in digits."
    from dml_book.train import preset_config
    for name in ("paper-triplet", "paper-npair", "paper-npair-no-softmax", "paper-triplet-no-recon", "paper-triplet-alpha0",
                 "paper-triplet-baseline"):
        triplets = HDML.presets[name]["method_kwargs"].get("triplet_batches", False)
        batch = 6 if triplets else 5 * HDML.presets[name]["m_per_class"]   # triplet batches: 2 triplets over 4 of 5 classes
        cfg = preset_config("hdml", name, dataset="digits", backbone="smallcnn", pretrained=False, batch_size=batch,
                            transform=None, embedding_dim=64, out=str(tmp_path / name))
        tr = Trainer(cfg)
        assert tr.method.beta == 1e4 and tr.method.pulling_factor == {"triplet": 0. if "alpha0" in name else 7., "npair": 90.}[cfg.loss]
        x, y = next(iter(tr.loader))
        logs = tr.training_step(x, y)
        assert all(math.isfinite(v) for v in logs.values()), name
        if tr.method.softmax and tr.method.recon and tr.method.synthesize:   # main_triplet.py l. 118-122: (1 - 0.5) J_recon + 1e4 * 0.5 J_soft
            assert logs["j_gen"] == pytest.approx(0.5 * logs["j_recon"] + 1e4 * 0.5 * logs["j_soft"], rel=1e-5)
        if triplets: assert tr.method.real_and_synthetic(tr, tr.model(x), y, 1.0)[0][0].tolist() == [0, 3]   # the batch's 2 triplets


def test_triplet_batches_give_the_official_40_triplets_and_the_baseline_shares_them(tmp_path):
    "paper-triplet: a batch of 120 is 40 triplets over 80 classes; J(T) sums over exactly those; the baseline uses the same."
    from dml_book.samplers import TripletBatchSampler
    labels = np.repeat(np.arange(100), 6)
    batch = np.asarray(next(iter(TripletBatchSampler(labels, 40))))
    t = labels[batch].reshape(40, 3)
    assert len(set(t[:, [0, 2]].ravel())) == 80 and (t[:, 0] == t[:, 1]).all()
    from dml_book.train import preset_config
    cfg = preset_config("hdml", "paper-triplet-baseline", dataset="digits", backbone="smallcnn", pretrained=False,
                        batch_size=6, transform=None, embedding_dim=64, out=str(tmp_path))
    tr = Trainer(cfg)
    x, y = next(iter(tr.loader))
    z = tr.model(x).detach()
    real = tr.method.real_and_synthetic(tr, z, y, 1.0)[0]
    o = tr.method.objectives(tr, x, y)
    want = sum(max(0., float(((z[a] - z[p]) ** 2).sum() - ((z[a] - z[n]) ** 2).sum() + 1.0)) for a, p, n in zip(*real))
    assert o["j_metric"].item() == pytest.approx(want, rel=1e-5)
    assert set(o) == {"lam", "weight", "j_real", "j_metric", "j_m", "d_ap", "d_an", "viol_real"}   # no synthesis, no synthetic values
    assert o["j_m"] == pytest.approx(want + decay_penalty(tr.optimizer), rel=1e-5)   # the official J_m: the same loss + decay


def test_lambda_floor_and_synthetic_cap(tmp_path):
    "The tuning knobs: lambda never below `lambda_min`, the synthetic share 1 - w never above `max_synthetic`; defaults change nothing."
    from dml_book.methods.hdml import pulling_lambda, synthesis_weight
    for floor, cap in [(0.0, 1.0), (0.6, 0.1)]:
        tr = _trainer(tmp_path / f"{floor}", method_kwargs=dict(hidden=32, window=1, pulling_factor=500.0, beta=500.0,
                                                                 lambda_min=floor, max_synthetic=cap))
        x, y = next(iter(tr.loader))
        tr.training_step(x, y)
        hd = tr.method
        lam, w = pulling_lambda(hd.j_avg.value, hd.pulling_factor), synthesis_weight(hd.j_gen_avg.value, hd.beta)
        o = hd.objectives(tr, x, y)
        assert o["lam"] == max(floor, lam) and o["weight"] == max(1 - cap, w)
        if floor: assert lam < floor and w < 1 - cap   # the schedule alone would pass both bounds here
        assert math.isclose(o["j_metric"].item(), o["weight"] * o["j_real"].item() + (1 - o["weight"]) * o["j_syn"].item(), rel_tol=1e-5)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"): HDML(lambda_min=1.5)
