"Tests of the PADS chapter: sampling distribution, sampler, static baselines, policy, PPO, and short runs."
import copy, json, math
import numpy as np
import pytest
from dml_book.checkpoint import read_checkpoint
import torch
import torch.nn.functional as F
from scipy.stats import chisquare

from dml_book.distances import euclidean
from dml_book.methods.pads import (PADS, BinnedDistribution, DistanceWeighted, DistributionSampler, SemiHard, bin_index,
                                   class_distances, init_probs, sample_triplets, validation_split, triplet_stats,
                                   action_effects, reward_signal, plot_policy_run, critic_sentence)
from dml_book.methods.pads_policy import (PolicyLearner, TrainingState, apply_actions, log_prob, ppo_objective,
                                          reinforce_objective, reward)
from dml_book.registry import METHODS

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py: one torch thread, restored after


def _batch(n_classes=8, per_class=4, dim=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = F.normalize(torch.randn(n_classes * per_class, dim, generator=g), dim=1)
    return emb, torch.arange(n_classes).repeat_interleave(per_class)


# ---------------------------------------------------------------- the distribution and the sampler

def test_bin_index_matches_explicit_edges():
    edges = torch.linspace(0.1, 1.4, 31, dtype=torch.float64)
    d = torch.cat([torch.rand(2000, dtype=torch.float64) * 2, edges])
    k = bin_index(d, edges)
    for x, kk in zip(d.tolist(), k.tolist()):
        if x < 0.1 or x > 1.4: assert kk == -1
        elif x == edges[-1]: assert kk == 29
        else: assert edges[kk] <= x < edges[kk + 1]


def test_negative_frequencies_per_bin_match_p_chi_square():
    "One candidate per bin: the bins of the drawn negatives follow p exactly (chi-square at a fixed seed)."
    g = torch.Generator().manual_seed(3)
    dist = BinnedDistribution(torch.rand(30, generator=g) ** 3 + 0.005)
    r = torch.cat([dist.centers.float(), torch.tensor([0.02, 0.07, 1.5, 1.9])])  # 4 candidates outside the interval
    emb = torch.zeros(2 + len(r), 2); emb[2:, 0] = r
    lab = torch.cat([torch.zeros(2, dtype=torch.long), torch.arange(1, len(r) + 1)])
    counts = torch.zeros(len(r))
    for _ in range(1500): counts += torch.bincount(sample_triplets(emb, lab, dist, generator=g)[2] - 2, minlength=len(r))
    assert counts[30:].sum() == 0
    expected = dist.probs * counts.sum()
    assert chisquare(counts[:30], expected).pvalue > 0.01
    assert chisquare(counts[:30], torch.full((30,), counts.sum() / 30)).pvalue < 1e-6  # the test has power


@pytest.mark.parametrize("rule", ["bin", "candidate"])
def test_negative_frequencies_match_p_on_a_random_batch(rule):
    """A random batch. The paper's rule: a bin with p_k among the anchor's non-empty bins, then a negative in it, so
    P(n | a) = (p_k / n_ak) / sum over non-empty bins j of p_j; the official weighting: P(bin k | a) = p_k n_ak / sum_j p_j n_aj."""
    emb, lab = _batch(n_classes=16, per_class=4, dim=3, seed=1)
    g = torch.Generator().manual_seed(0)
    dist = BinnedDistribution(torch.rand(30, generator=g) + 0.05, rule=rule)
    D = euclidean(emb); neg = lab[:, None] != lab[None]
    k = bin_index(D, dist.edges)
    w = torch.where((k >= 0) & neg, dist.probs.float()[k.clamp_min(0)], torch.zeros(()))
    if rule == "bin":   # divide by the anchor's number of candidates in the same bin, computed by brute force
        n_ak = torch.tensor([[((k[i] == k[i, j]) & neg[i]).sum().item() for j in range(len(lab))] for i in range(len(lab))])
        w = w / n_ak.clamp_min(1)
    P = w / w.sum(1, keepdim=True)                                   # every anchor has a positive here
    expected_per_draw = torch.zeros(30).index_add_(0, k[neg & (k >= 0)], P[neg & (k >= 0)])
    counts, rounds = torch.zeros(30), 400
    for _ in range(rounds):
        a, p, n = sample_triplets(emb, lab, dist, generator=g)
        assert len(a) == len(lab)
        counts += torch.bincount(k[a, n], minlength=30)
    keep = expected_per_draw * rounds >= 5
    f_exp = expected_per_draw[keep] * rounds
    assert chisquare(counts[keep], f_exp * counts[keep].sum() / f_exp.sum()).pvalue > 0.01
    assert counts[~keep].sum() <= max(10, 3 * expected_per_draw[~keep].sum() * rounds)


@pytest.mark.parametrize("self_regularization", [False, True])
def test_no_negative_outside_the_interval_is_ever_drawn(self_regularization):
    g = torch.Generator().manual_seed(0)
    dist = BinnedDistribution(torch.ones(30), lambda_min=0.6, lambda_max=1.1)
    for seed in range(50):
        emb, lab = _batch(n_classes=6, per_class=5, dim=3, seed=seed)
        a, p, n = sample_triplets(emb, lab, dist, self_regularization=self_regularization, generator=g)
        d, is_neg = euclidean(emb)[a, n], lab[a] != lab[n]
        assert ((d >= 0.6) & (d <= 1.1))[is_neg].all()                 # negatives: the interval is a hard cut
        assert (d[~is_neg] <= 1.1).all()                                # positives (self-regularisation): clipped into bin 0
        assert (lab[a] == lab[p]).all() and (a != p).all() and (a != n).all()
        if not self_regularization: assert is_neg.all()


def test_self_regularization_draws_positives_only_when_enabled():
    emb, lab = _batch(n_classes=4, per_class=8, dim=3, seed=2)
    dist, g = BinnedDistribution(torch.ones(30), lambda_min=0.0, lambda_max=2.0), torch.Generator().manual_seed(0)
    same = lambda on: sum(int((lab[a] == lab[n]).sum()) for a, _, n in
                          (sample_triplets(emb, lab, dist, self_regularization=on, generator=g) for _ in range(30)))
    assert same(False) == 0 and same(True) > 0


def test_anchors_without_candidates_are_dropped():
    emb = torch.tensor([[0., 0], [0, 0.01], [0.05, 0], [2.0, 0]])  # negatives at 0.05 and 2.0: outside [0.1, 1.4]
    a, p, n = sample_triplets(emb, torch.tensor([0, 0, 1, 2]), BinnedDistribution())
    assert len(a) == len(p) == len(n) == 0
    a, p, n = sample_triplets(emb, torch.tensor([0, 1, 2, 3]), BinnedDistribution())  # no positives at all
    assert len(a) == 0


def test_distribution_stays_a_distribution_after_any_action_sequence():
    g = torch.Generator().manual_seed(0)
    dist = BinnedDistribution(init_probs("uniform_low", BinnedDistribution().centers))
    for t in range(3000):
        acts = torch.randint(0, 3, (30,), generator=g) if t % 3 else torch.full((30,), 2).index_fill(0, torch.tensor([t % 30]), 0)
        dist.probs.copy_(apply_actions(dist.probs, acts))
        assert torch.isfinite(dist.probs).all() and (dist.probs > 0).all()
        assert abs(dist.probs.sum().item() - 1) < 1e-9
    for _ in range(2000): dist.probs.copy_(apply_actions(dist.probs, torch.tensor([0] * 29 + [2])))
    assert abs(dist.probs[-1].item() - 1) < 1e-9 and (dist.probs > 0).all()  # the floor keeps every bin revivable
    one_up = apply_actions(dist.probs, torch.tensor([2] + [1] * 29))
    assert one_up[0] > dist.probs[0]


def test_apply_actions_formula():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q = apply_actions(p, torch.tensor([0, 1, 2, 2]))
    ref = torch.tensor([0.08, 0.2, 0.375, 0.5], dtype=torch.float64)
    torch.testing.assert_close(q, ref / ref.sum())


# ---------------------------------------------------------------- the static baselines

def test_distance_weighted_matches_the_library_miner():
    from dml_book.miners import DistanceWeightedMiner
    emb, lab = _batch(n_classes=8, per_class=4, dim=16, seed=4)
    ref = DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4).probabilities(emb, lab)
    neg = lab[:, None] != lab[None]
    w = DistanceWeighted(dim=16)(euclidean(emb)) * neg
    mine = w / w.sum(1, keepdim=True).clamp_min(1e-30)
    torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-6)


def test_distance_weighted_formula_eq2():
    d = torch.tensor([[0.3, 0.7, 1.0, 1.39, 1.41]], dtype=torch.float64)
    D = 32
    q_inv = lambda x: 1 / (x ** (D - 2) * (1 - x ** 2 / 4) ** ((D - 3) / 2))
    ref = np.array([q_inv(0.5), q_inv(0.7), q_inv(1.0), q_inv(1.39), 0.0])
    np.testing.assert_allclose(DistanceWeighted(D)(d)[0].numpy(), ref / ref.max(), rtol=1e-9)


def test_semihard_support_is_the_semihard_band():
    emb, lab = _batch(n_classes=6, per_class=4, dim=4, seed=5)
    D, g = euclidean(emb), torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(300):
        a, p, n = sample_triplets(emb, lab, SemiHard(0.3), generator=g)
        assert ((D[a, n] > D[a, p]) & (D[a, n] < D[a, p] + 0.3) & (lab[a] != lab[n])).all()
        seen |= set(zip(a.tolist(), p.tolist(), n.tolist()))
    brute = {(a, p, n) for a in range(len(lab)) for p in range(len(lab)) for n in range(len(lab))
             if a != p and lab[a] == lab[p] and lab[a] != lab[n] and D[a, p] < D[a, n] < D[a, p] + 0.3}
    assert seen <= brute and len(seen) > 0.8 * len(brute)


def test_distribution_sampler_is_a_miner():
    emb, lab = _batch()
    a, p, n = DistributionSampler(BinnedDistribution(torch.ones(30)), seed=0)(emb, lab)
    a2, p2, n2 = DistributionSampler(BinnedDistribution(torch.ones(30)), seed=0)(emb, lab)
    assert torch.equal(n, n2) and len(a) > 0


def test_initial_distributions():
    c = BinnedDistribution().centers
    low = init_probs("uniform_low", c)
    assert low[(c >= 0.3) & (c <= 0.7)].sum() > 0.99 and abs(low.sum() - 1) < 1e-12
    w = init_probs("distance", c, dim=32)
    ref = DistanceWeighted(32, nonzero_loss_cutoff=math.inf)(c[None])[0]
    torch.testing.assert_close(w, ref / ref.sum())
    with pytest.raises(ValueError, match="unknown initial distribution 'gauss'"): init_probs("gauss", c)


# ---------------------------------------------------------------- the policy side

def test_ppo_clipped_objective_on_hand_made_numbers():
    lp_old = torch.log(torch.tensor([0.5, 0.4, 0.2, 0.2]))
    lp = torch.log(torch.tensor([0.75, 0.2, 0.22, 0.23]))       # ratios 1.5, 0.5, 1.1, 1.15
    # A = +1: min(1.5, 1.2) + min(0.5, 0.8) + 1.1 + 1.15 ; A = -2: min(-3, -2.4) + min(-1, -1.6) - 2.2 - 2.3
    assert ppo_objective(lp, lp_old, 1.0).item() == pytest.approx((1.2 + 0.5 + 1.1 + 1.15) / 4, rel=1e-5)
    assert ppo_objective(lp, lp_old, -2.0).item() == pytest.approx((-3 - 1.6 - 2.2 - 2.3) / 4, rel=1e-5)
    assert ppo_objective(lp, lp_old, 1.0, clip=0.6).item() == pytest.approx((1.5 + 0.5 + 1.1 + 1.15) / 4, rel=1e-5)
    x = lp.clone().requires_grad_()
    ppo_objective(x, lp_old, 1.0).backward()
    torch.testing.assert_close(x.grad, torch.tensor([0, 0.5, 1.1, 1.15]) / 4)  # clipped terms have no gradient


def test_reward_and_reinforce():
    assert [reward(0.9, 0.8), reward(0.8, 0.9), reward(0.5, 0.5)] == [1.0, -1.0, 0.0]
    lp = torch.tensor([-1.0, -2.0])
    assert reinforce_objective(lp, 0.5).item() == pytest.approx(-0.75)


def test_training_state_layout():
    ts = TrainingState(n_metrics=4, windows=(2, 8, 16, 32), history=20)
    ms = torch.rand(40, 4)
    for m in ms: ts.push(m)
    p = torch.full((30,), 1 / 30)
    s = ts(p, 0.4)
    assert len(s) == ts.dim(30) == 4 * 20 + 4 * 4 + 30 + 1
    torch.testing.assert_close(s[:80], ms[-20:].flatten())
    torch.testing.assert_close(s[80:96], torch.stack([ms[-w:].mean(0) for w in (2, 8, 16, 32)]).flatten())
    torch.testing.assert_close(s[96:126], p); assert s[-1].item() == pytest.approx(0.4)


@pytest.mark.parametrize("critic", ["reward", "metric", "td"])
def test_a2c_advantage_and_critic_target(critic):
    """Single-step episodes: V = tanh(z / 2) fitted to r by the log-loss of its sign, A = r - V(s); the official form and
    TD bootstrap with gamma V(s') and a squared error."""
    torch.manual_seed(0)
    agent = PolicyLearner(5, 3, hidden=(8,), baseline="a2c", gamma=0.9, critic=critic)
    s0, s1 = torch.randn(5), torch.randn(5)
    z0, v1 = agent.policy(s0)[1].item(), agent.policy(s1)[1].item()
    v0 = math.tanh(z0 / 2) if critic == "reward" else z0
    out = agent.update(s0, torch.tensor([0, 1, 2]), -1.0, s1, metric=0.3)
    adv, target = {"reward": (-1 - v0, -1.0), "metric": (-1 + 0.9 * v1 - v0, 0.3), "td": (-1 + 0.9 * v1 - v0, -1 + 0.9 * v1)}[critic]
    assert out["advantage"] == pytest.approx(adv, rel=1e-5) and out["value"] == pytest.approx(v0, rel=1e-5)
    loss = -math.log((1 - v0) / 2) if critic == "reward" else 0.5 * (v0 - target) ** 2   # r = -1: P(r = -1) = (1 - V) / 2
    assert out["critic_loss"] == pytest.approx(loss, rel=1e-5)


def test_single_step_critic_learns_the_expected_reward():
    "A fixed state whose actions earn +1 with probability 0.75: V(s) settles near E[r] = 0.5, inside the reward's range."
    torch.manual_seed(0); g = torch.Generator().manual_seed(0)
    agent, s = PolicyLearner(6, 3, hidden=(16,), lr=0.01), torch.randn(6)
    values = [agent.update(s, agent.act(s, g), 1.0 if torch.rand(1, generator=g).item() < 0.75 else -1.0, s)["value"]
              for _ in range(300)]
    assert max(abs(v) for v in values) <= 1.5 and abs(np.mean(values[-100:]) - 0.5) < 0.2


def test_metric_critic_needs_the_metric():
    with pytest.raises(ValueError, match="pass metric=e"): PolicyLearner(5, 3, critic="metric").update(torch.randn(5), torch.tensor([0, 1, 2]), 1.0, torch.randn(5))


def test_ema_baseline():
    agent = PolicyLearner(5, 3, hidden=(8,), baseline="ema", ema_rate=0.5, algorithm="reinforce")
    s = torch.randn(5)
    advs = [agent.update(s, torch.tensor([0, 1, 2]), r, s)["advantage"] for r in (1.0, 1.0, -1.0)]
    assert advs == pytest.approx([1.0, 0.0, -2.0])   # b: 0, then r_1 = 1, then 0.5 * 1 + 0.5 * 1 (the published average starts at r_1)


def test_ppo_old_policy_refreshed_every_k_updates():
    agent = PolicyLearner(5, 3, hidden=(8,), old_policy_every=5)
    s, a = torch.randn(5), torch.tensor([0, 1, 2])
    old0 = copy.deepcopy(agent.old_policy.state_dict())
    for i in range(1, 11):
        agent.update(s, a, 1.0 if i % 2 else -1.0, s)
        same_as_old0 = all(torch.equal(old0[k], v) for k, v in agent.old_policy.state_dict().items())
        same_as_now = all(torch.equal(agent.policy.state_dict()[k], v) for k, v in agent.old_policy.state_dict().items())
        assert same_as_old0 == (i < 5) and same_as_now == (i % 5 == 0)


def test_policy_learns_a_toy_reward():
    "Reward = sign of the change of the mass on bins 5..9: PPO+A2C must concentrate p there."
    torch.manual_seed(1); g = torch.Generator().manual_seed(1)
    ts = TrainingState(n_metrics=1, windows=(2, 8), history=4)
    agent = PolicyLearner(ts.dim(30), 30, hidden=(64,))
    p = torch.full((30,), 1 / 30, dtype=torch.float64); prev = None
    for t in range(100):
        e = p[5:10].sum().item(); ts.push(torch.tensor([e])); s = ts(p, t / 100)
        if prev is not None: agent.update(prev[1], prev[2], reward(e, prev[0]), s)
        a = agent.act(s, g); p = apply_actions(p, a); prev = (e, s, a)
    assert p[5:10].sum() > 0.8


def test_learner_resume_is_exact():
    agent = PolicyLearner(8, 4, hidden=(16,))
    s0, s1 = torch.randn(8), torch.randn(8)
    for r in (1., -1., 1., 1.): agent.update(s0, torch.tensor([0, 1, 2, 0]), r, s1)
    clone = PolicyLearner(8, 4, hidden=(16,))
    clone.load_state_dict(copy.deepcopy(agent.state_dict()))
    for m in (agent, clone): m.update(s0, torch.tensor([2, 2, 1, 0]), -1., s1)
    for (k, v), w in zip(agent.state_dict().items(), clone.state_dict().values()):
        if torch.is_tensor(v): assert torch.equal(v, w), k


# ---------------------------------------------------------------- the method

def test_validation_split_per_class_and_label_disjoint():
    lab = np.repeat(np.arange(20), 10)
    tr, va = validation_split(lab, 0.15)
    assert len(np.intersect1d(tr, va)) == 0 and len(tr) + len(va) == 200
    assert set(np.bincount(lab[va])) == {2}        # round(1.5) = 2 per class
    tr, va = validation_split(lab, 0.15, by_class=True)
    assert len(np.intersect1d(lab[tr], lab[va])) == 0 and len(np.unique(lab[va])) == 3
    with pytest.raises(ValueError, match="fraction must be in"): validation_split(lab, 0.0)


def test_class_distances_brute_force():
    emb, lab = torch.randn(12, 3), np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3])
    intra = np.mean([np.mean([torch.dist(emb[i], emb[j]).item() for i in np.flatnonzero(lab == c)
                              for j in np.flatnonzero(lab == c) if i != j]) for c in range(4)])
    cs = [emb[lab == c].mean(0) for c in range(4)]
    inter = np.mean([torch.dist(cs[i], cs[j]).item() for i in range(4) for j in range(4) if i != j])
    assert class_distances(emb, lab) == pytest.approx((intra, inter), rel=1e-5)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown initial distribution"): PADS(init="gaussian")
    with pytest.raises(ValueError, match="unknown sampling rule"): PADS(sampling_rule="weighted")
    with pytest.raises(ValueError, match="must contain 1"): PADS(recall_ks=(2, 4))
    with pytest.raises(ValueError, match="update_every must be at least 1"): PADS(update_every=0)
    with pytest.raises(ValueError, match="choose from: ppo, reinforce"): PADS(algorithm="dqn")
    with pytest.raises(ValueError, match="choose from: a2c, ema"): PADS(baseline="none")
    with pytest.raises(ValueError, match="lambda_min < lambda_max"): PADS(lambda_min=1.5)
    with pytest.raises(ValueError, match="choose from: reward, metric, td"): PADS(critic="bootstrap")
    with pytest.raises(ValueError, match="choose from: binned, distance_weighted"): PADS(sampler="semihard", adapt=False)
    with pytest.raises(ValueError, match="fixed scheme: set adapt=False"): PADS(sampler="distance_weighted")
    with pytest.raises(ValueError, match="call setup"): PADS(sampler="distance_weighted", adapt=False).sample(*_batch())


def test_registered_with_the_paper_presets():
    assert METHODS.get("pads") is PADS
    for name, beta in (("cub200", 0.6), ("cars196", 0.6), ("sop", 1.2)):
        p = PADS.presets[name]
        assert (p["loss"], p["loss_kwargs"]["beta"], p["lr_backbone"], p["batch_size"]) == ("margin", beta, 1e-5, 112)  # Sec. 5
        assert p["loss_kwargs"]["per_class"] and p["loss_kwargs"]["learn_beta"]            # Wu et al. / official: beta per class
        assert not PADS(**p["method_kwargs"]).self_regularization                            # the official runs: no --policy_include_pos
        ks = (1, 10, 100, 1000) if name == "sop" else (1, 2, 4, 8)                          # official k_vals
        assert p["ks"] == p["method_kwargs"]["recall_ks"] == ks
    assert PADS.presets["sop"]["method_kwargs"]["val_by_class"] is True                   # whole classes on SOP (official)
    for name, at in (("cub200", 150), ("cars196", 140), ("sop", 80)):                     # the official runs' schedule
        p = PADS.presets[name]
        assert (p["lr_schedule"], p["lr_milestones"], p["lr_gamma"], p["freeze_bn"]) == ("multistep", (at,), 0.3, True)


def test_presets_are_valid_train_configs():
    from dml_book.train import preset_config
    cfg = preset_config("pads", "cars196")
    assert (cfg.method, cfg.dataset, cfg.loss, cfg.batch_size, cfg.lr_backbone, cfg.embedding_dim) == ("pads", "cars196", "margin", 112, 1e-5, 128)
    assert PADS(**cfg.method_kwargs).update_every == 30
    assert PADS(**preset_config("pads", "sop").method_kwargs).update_every == 60


def test_cli_trains_pads(tmp_path, capsys):
    from dml_book.cli import main
    rc = main(["train", "--method", "pads", "--dataset", "digits", "--batch-size", "20", "--epochs", "1", "--max-steps-per-epoch", "6",
               "--embedding-dim", "16", "--ks", "1", "--method-kwargs", '{"update_every": 3}', "--no-umap", "--no-progress", "--out", str(tmp_path)])
    assert rc == 0 and "pads / triplet on digits" in capsys.readouterr().out
    log = [json.loads(l) for l in open(tmp_path / "log.jsonl")]
    assert sum("pads_probs" in r for r in log if r["kind"] == "step") == 2


def _cfg(out, **kw):
    from dml_book.train import TrainConfig
    base = dict(dataset="digits", batch_size=20, m_per_class=4, epochs=2, max_steps_per_epoch=9, embedding_dim=16,
                ks=(1,), seed=0, method="pads", method_kwargs=dict(update_every=3), out=str(out))
    base.update(kw)
    return TrainConfig(**base)


def test_setup_splits_off_the_validation_images(tmp_path):
    from dml_book.train import Trainer
    tr = Trainer(_cfg(tmp_path))
    m = tr.method
    assert len(tr.train_ds) + len(m.val_ds) == 901 and abs(len(m.val_ds) - 0.15 * 901) < 5
    assert len(np.intersect1d(tr.train_ds.indices, m.val_ds.indices)) == 0
    tr = Trainer(_cfg(tmp_path / "b", batch_size=12, method_kwargs=dict(val_by_class=True, val_fraction=0.4)))
    assert sorted(set(tr.train_ds.labels)) == [0, 1, 2] and sorted(set(tr.method.val_ds.labels)) == [0, 1]
    assert tr.method.param_groups(tr) == []
    assert all(not any(p is q for g in tr.optimizer.param_groups for q in g["params"]) for p in tr.method.parameters())


def test_static_mode_keeps_the_initial_distribution(tmp_path):
    "adapt=False: the fixed-distribution baseline (here Wu et al.'s weights on the bins) holds out the reward split all the same."
    from dml_book.train import Trainer
    tr = Trainer(_cfg(tmp_path, method_kwargs=dict(adapt=False, init="distance", update_every=1)))
    m = tr.method
    assert len(tr.train_ds) + len(m.val_ds) == 901 and abs(len(m.val_ds) - 0.15 * 901) < 5
    p0 = m.distribution.probs.clone()
    torch.testing.assert_close(p0, init_probs("distance", m.distribution.centers, dim=16))
    for i, (x, y) in enumerate(tr.loader):
        logs = tr.training_step(x, y)
        assert "pads_probs" not in logs and logs["triplets"] > 0
        if i == 3: break
    assert torch.equal(m.distribution.probs, p0)


def test_resumed_run_equals_uninterrupted(tmp_path):
    from dml_book.train import train, Trainer
    train(_cfg(tmp_path / "full"))
    tr = Trainer(_cfg(tmp_path / "half"))
    run_epoch = tr.run_epoch
    def crash_in_epoch_2():
        if tr.epoch == 2: raise KeyboardInterrupt("simulated crash")
        return run_epoch()
    tr.run_epoch = crash_in_epoch_2
    with pytest.raises(KeyboardInterrupt): tr.fit()
    train(_cfg(tmp_path / "half"))                # a new process: resumes from the epoch-1 checkpoint
    a = read_checkpoint(tmp_path / "full" / "checkpoint.pt")
    b = read_checkpoint(tmp_path / "half" / "checkpoint.pt")
    for k, v in a["model"].items(): assert torch.equal(v, b["model"][k]), k
    for k, v in a["method"].items():
        if torch.is_tensor(v): assert torch.equal(v, b["method"][k]), k
    ea, eb = a["method"]["_extra_state"], b["method"]["_extra_state"]
    assert ea["trajectory"] == eb["trajectory"] and ea["iteration"] == eb["iteration"] == 18
    assert len(ea["trajectory"]) == 1 + 18 // 3


@pytest.mark.slow
def test_short_run_improves_test_recall_and_logs_the_trajectory(tmp_path):
    "Glyphs, 30 PADS iterations: test Recall@1 (on 20 test classes) beats the untrained network's, same seed."
    from dml_book.train import LabelledSubset, Trainer, TrainConfig
    cfg = TrainConfig(dataset="glyphs", batch_size=32, m_per_class=4, epochs=1, max_steps_per_epoch=30, embedding_dim=32,
                      ks=(1,), seed=0, method="pads", method_kwargs=dict(update_every=10, val_fraction=0.05), out=str(tmp_path))
    tr = Trainer(cfg)
    keep = np.flatnonzero(tr.test_ds.labels < 20)
    tr.test_ds = LabelledSubset(tr.test_ds, keep, relabel=True)
    tr.fit()
    log = [json.loads(l) for l in open(tmp_path / "log.jsonl")]
    epochs = [r for r in log if r["kind"] == "epoch"]
    assert epochs[0]["step"] == 0 and epochs[-1]["step"] == 30
    assert epochs[-1]["R@1"] > epochs[0]["R@1"] + 0.05, (epochs[0]["R@1"], epochs[-1]["R@1"])
    traj = [r["pads_probs"] for r in log if r["kind"] == "step" and "pads_probs" in r]
    assert len(traj) == 3 and all(abs(sum(p) - 1) < 1e-9 for p in traj)
    assert sum("reward" in r for r in log) == 2
    assert all(r["triplets"] > 0 for r in log if r["kind"] == "step")


def test_margin_beta_per_class_has_its_own_rate_and_no_weight_decay(tmp_path):
    "Wu et al. / the official PADS code: one beta per training class, learned at its own rate without weight decay."
    from dml_book.train import Trainer
    tr = Trainer(_cfg(tmp_path, loss="margin", weight_decay=1e-2,
                      loss_kwargs=dict(beta=0.6, learn_beta=True, per_class=True, beta_lr=5e-4)))
    n_classes = len(tr.train_ds.class_names)
    assert tr.loss_fn.beta.shape == (n_classes,)
    (group,) = [g for g in tr.optimizer.param_groups if g.get("name") == "beta"]
    assert group["lr"] == 5e-4 and group["weight_decay"] == 0.0 and group["params"][0] is tr.loss_fn.beta
    head = [g for g in tr.optimizer.param_groups if g.get("name") == "head"][0]
    assert all(p is not tr.loss_fn.beta for p in head["params"])
    emb = torch.nn.functional.normalize(torch.randn(8, 16), dim=1).requires_grad_()
    labels = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])                 # classes 0 and 1 only
    tr.loss_fn(emb, labels).backward()
    g = tr.loss_fn.beta.grad
    assert (g[2:] == 0).all() and g[:2].abs().sum() > 0              # absent classes' betas get no gradient
    with pytest.raises(ValueError, match="per_class=True needs num_classes"):
        from dml_book.losses import MarginLoss
        MarginLoss(per_class=True)


def test_reward_split_uses_the_evaluation_transform_and_whole_classes_on_small_classes(tmp_path):
    "On the SOP layout replica with the SOP preset's split: no class is shared with training; images are not augmented."
    from dml_book.data.replicas import write_sop
    from dml_book.train import Trainer, preset_config
    write_sop(tmp_path/"data", n_train=20, n_test=4, per_class=3)
    cfg = preset_config("pads", "sop", data_root=str(tmp_path/"data"), pretrained=False, backbone="resnet18",
                        val_fraction=0.2, batch_size=8, m_per_class=2, ks=(1, 2), device="cpu", out=str(tmp_path/"run"))
    cfg.method_kwargs.update(recall_ks=(1, 2))
    tr = Trainer(cfg)
    m = tr.method
    train_classes = {tr.train_ds.dataset.class_names[c] for c in tr.train_ds.dataset.labels[tr.train_ds.indices]} \
        if hasattr(tr.train_ds.dataset, "class_names") else set()
    val_names = {m.val_ds.class_names[c] for c in m.val_ds.labels}
    assert val_names and not (val_names & train_classes)                      # whole classes held out
    base = m.val_ds.dataset
    assert "RandomCrop" not in repr(base.transform) and "Flip" not in repr(base.transform)   # the evaluation transform
    x0, x1 = m.val_ds[0][0], m.val_ds[0][0]
    assert torch.equal(x0, x1)                                                # deterministic: no augmentation
    assert m.metric_keys == ("R@1", "R@2", "NMI", "intra", "inter")           # every Recall@k of the state, NMI, distances
    n_beta = tr.loss_fn.beta.shape[0]   # built before PADS holds out its reward classes: those betas stay unused
    assert n_beta > 1 and max(tr.train_ds.labels) < n_beta                    # one margin beta per training class


# ---------------------------------------------------------------- the study's arms, the negatives, the critic in a run

ARMS = {"pads": {}, "fixed": {"adapt": False}, "distance-weighted": {"adapt": False, "sampler": "distance_weighted"}}


def test_every_arm_holds_out_the_same_reward_split_and_trains_the_same_steps(tmp_path):
    "PADS, the fixed initial distribution and distance-weighted sampling: same training images, reward split and steps."
    from dml_book.train import Trainer
    trs = {k: Trainer(_cfg(tmp_path / k, loss="margin", method_kwargs=dict(update_every=3, **kw))) for k, kw in ARMS.items()}
    ref = trs["pads"]
    assert len(ref.train_ds) + len(ref.method.val_ds) == 901 and len(ref.method.val_ds) > 100
    for name, tr in trs.items():
        assert np.array_equal(tr.train_ds.indices, ref.train_ds.indices), name
        assert np.array_equal(tr.method.val_ds.indices, ref.method.val_ds.indices), name
        assert np.array_equal(tr.train_ds.labels, ref.train_ds.labels) and tr.steps_per_epoch == ref.steps_per_epoch, name
        assert [b for _, b in zip(range(3), tr.sampler)] == [b for _, b in zip(range(3), ref.sampler)], name   # same batches
    assert isinstance(trs["distance-weighted"].method.weighting, DistanceWeighted) and trs["pads"].method.weighting is None


def test_distance_weighted_arm_draws_with_wu_et_al_weights(tmp_path):
    "The arm's negatives follow eq. (2): P(n | a) proportional to min(lambda, q^-1(d)) among the negatives (chi-square)."
    from dml_book.train import Trainer
    m = Trainer(_cfg(tmp_path, embedding_dim=16, method_kwargs=ARMS["distance-weighted"])).method
    emb, lab = _batch(n_classes=8, per_class=4, dim=16, seed=4)
    D, neg = euclidean(emb), lab[:, None] != lab[None]
    w = DistanceWeighted(16)(D) * neg
    P = (w / w.sum(1, keepdim=True))[0]                            # anchor 0's distribution over the batch
    counts = torch.zeros(len(lab))
    for _ in range(1500):
        a, p, n = m.sample(emb, lab)
        counts[n[a == 0]] += 1
    keep = P * counts.sum() >= 5
    assert counts[~neg[0]].sum() == 0 and chisquare(counts[keep], P[keep] * counts[keep].sum() / P[keep].sum()).pvalue > 0.01


def test_no_sampled_negative_shares_the_anchor_label():
    "Defaults: only other labels are candidates, so the share is 0; self-regularisation (off by default) makes it positive."
    g = torch.Generator().manual_seed(0)
    dist = BinnedDistribution(init_probs("uniform_low", BinnedDistribution().centers))
    shares = {False: [], True: []}
    for seed in range(40):
        cen = F.normalize(torch.randn(16, 32, generator=g), dim=1)
        emb = F.normalize(cen.repeat_interleave(2, 0) + 0.08 * torch.randn(32, 32, generator=g), dim=1)   # pairs ~0.3-0.5 apart
        lab = torch.arange(16).repeat_interleave(2)
        for on in shares:
            a, p, n = sample_triplets(emb, lab, dist, self_regularization=on, generator=g)
            shares[on].append(triplet_stats(emb, lab, (a, p, n))["same_label_negatives"])
            if not on: assert (lab[a] != lab[n]).all() and len(a) == 32
    assert max(shares[False]) == 0 and np.mean(shares[True]) > 0.3
    assert PADS().self_regularization is False


def test_triplet_stats_by_hand():
    emb = torch.tensor([[0., 0], [3, 4], [0, 1], [1, 0]])
    lab = torch.tensor([0, 0, 0, 1])
    s = triplet_stats(emb, lab, (torch.tensor([0, 0]), torch.tensor([1, 1]), torch.tensor([2, 3])))
    assert s == {"triplets": 2, "same_label_negatives": 0.5, "d_ap": 5.0, "d_an": 1.0}
    empty = torch.tensor([], dtype=torch.long)
    assert triplet_stats(emb, lab, (empty,) * 3)["triplets"] == 0


def test_a_run_logs_the_critic_and_the_triplets_and_keeps_the_value_bounded(tmp_path):
    "Every iteration logs triplet_stats (no same-label negative); every policy step value, advantage, reward, critic loss."
    from dml_book.train import train
    train(_cfg(tmp_path, loss="margin"))
    log = [json.loads(l) for l in open(tmp_path / "log.jsonl")]
    steps = [r for r in log if r["kind"] == "step"]
    assert all(r["same_label_negatives"] == 0 and r["triplets"] > 0 and 0 < r["d_ap"] and 0 < r["d_an"] for r in steps)
    rewarded = [r for r in steps if "reward" in r]
    assert len(rewarded) == 18 // 3 - 1
    for r in rewarded:
        assert abs(r["value"]) < 1 and r["advantage"] == pytest.approx(r["reward"] - r["value"], abs=1e-5)
        up, v = (1 + r["reward"]) / 2, r["value"]     # the log-loss of r's sign under P(r = +1) = (1 + V) / 2, twice half of it
        assert r["critic_loss"] == pytest.approx(-up * math.log((1 + v) / 2) - (1 - up) * math.log((1 - v) / 2), rel=1e-4)


def test_action_effects_line_up_each_reward_with_the_action_it_scores(tmp_path):
    "From a real log: reward at policy step t, p's mean shift from step t-2 to t-1, sampled d(a, n) windows by brute force."
    from dml_book.train import train
    from dml_book.study import read_log
    from dml_book.methods.pads import distribution_means
    train(_cfg(tmp_path, epochs=3))
    steps, _ = read_log(tmp_path / "log.jsonl")
    edges = PADS().distribution.edges.numpy()
    fx = action_effects(steps, edges)
    pol = [r for _, r in steps.iterrows() if isinstance(r.pads_probs, list)]
    assert len(fx) == len(pol) - 2 and list(fx.step) == [int(r.step) for r in pol[2:]]
    for t, row in zip(range(2, len(pol)), fx.itertuples()):
        mu = distribution_means([pol[t - 1].pads_probs, pol[t - 2].pads_probs], edges)
        assert row.reward == pol[t].reward and row.p_shift == pytest.approx(mu[0] - mu[1])
        d = dict(zip(steps.step, steps.d_an))
        before = np.mean([d[s] for s in range(int(pol[t - 2].step) + 1, int(pol[t - 1].step) + 1)])
        after = np.mean([d[s] for s in range(int(pol[t - 1].step) + 1, int(pol[t].step) + 1)])
        assert row.d_an_shift == pytest.approx(after - before)
    sig = reward_signal(steps, edges)
    assert sig["actions"] == len(fx) and -1 <= sig["p_shift"] <= 1 and -1 <= sig["d_an_shift"] <= 1


def test_policy_run_figure_reads_new_and_old_logs(tmp_path):
    "The reference-run figure: three panels from a new log; an old log without critic values still draws (empty critic panel)."
    import matplotlib.pyplot as plt
    from dml_book.train import train
    from dml_book.study import read_log
    train(_cfg(tmp_path, epochs=1))
    steps, _ = read_log(tmp_path / "log.jsonl")
    edges = PADS().distribution.edges.numpy()
    fig = plot_policy_run(steps, edges)
    critic_ax = fig.axes[2]
    assert len(critic_ax.lines) == 2 and len(critic_ax.patches) >= 2 and critic_ax.get_yscale() == "symlog"
    old = steps.drop(columns=["value", "advantage", "reward", "critic_loss", "d_an", "d_ap", "same_label_negatives"])
    fig = plot_policy_run(old, edges)
    assert "no critic values" in fig.axes[2].texts[0].get_text() and critic_sentence(old) == "This log holds no critic values."
    assert "in 2 of the 2 updates" in critic_sentence(steps)   # 9 steps, M = 3: 3 policy steps, 2 rewarded; |V| < 1: A has r's sign
    plt.close("all")


def test_critic_sentence_counts_the_updates_skipped_for_an_overflowing_gradient():
    "An update skipped because its gradient overflowed float32 is counted in the critic's sentence; none skipped, or a log from before the guard, says nothing of it."
    import pandas as pd
    steps = pd.DataFrame(dict(value=[0.1, -0.2, 0.3], reward=[1.0, -1.0, 1.0], advantage=[0.9, -0.8, 0.7], skipped=[0.0, 1.0, 1.0]))
    assert critic_sentence(steps).endswith("in 3 of the 3 updates. 2 of the updates were skipped: their gradient overflowed float32.")
    assert "skipped" not in critic_sentence(steps.assign(skipped=0.0)) and "skipped" not in critic_sentence(steps.drop(columns="skipped"))


def test_a_policy_gone_nan_stops_the_run_as_diverged(tmp_path):
    "A policy update that overshoots (NaN weights) stops the run as `TrainingDiverged` naming the policy, never torch.multinomial's error; a tuning trial counts it as diverged."
    from dml_book.train import Trainer, TrainingDiverged
    tr = Trainer(_cfg(tmp_path))
    with torch.no_grad(): next(tr.method.learner.policy.parameters()).fill_(float("nan"))
    with pytest.raises(TrainingDiverged, match=r"PADS's policy holds a NaN or infinity \(body.*policy_lr"):
        tr.fit()
    assert tr.step == 2   # raised inside the third step (the first policy step, update_every=3), before it counted


def test_a_policy_whose_logits_overflow_stops_the_run_as_diverged(tmp_path):
    "Finite but huge weights give infinite logits: the same clear stop, found after the update, before the draw."
    from dml_book.train import Trainer, TrainingDiverged
    tr = Trainer(_cfg(tmp_path))
    with torch.no_grad():
        for p in tr.method.learner.policy.parameters(): p.fill_(1e30)
    with pytest.raises(TrainingDiverged, match=r"PADS's policy holds a NaN or infinity \(its action logits\)"):
        tr.fit()
