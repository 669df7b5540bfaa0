"""PADS against the published code (Confusezius/CVPR2020_PADS, `PADS_utilities.py`), read and restated here in our own
words as small numpy functions: the bin grid, the per-candidate probabilities (with the out-of-interval mask that the
published code means to apply), the action update, the state layout, the reward, and the A2C + PPO loss with its critic. A change of ours that departs from
these fails here, unless the departure is intended and documented in the chapter (`rule="bin"` is one: the paper's
definition; the published weighting is `rule="candidate"`)."""
import copy
import numpy as np
import pytest
import torch

from dml_book.methods.pads import BinnedDistribution, bin_index
from dml_book.methods.pads_policy import PolicyLearner, TrainingState, apply_actions, reward


def official_bins(d, lam_min, lam_max, n_support):
    "The published grid: n_support points from lam_min to lam_max; a distance's bin counts the inner points it exceeds."
    support = np.linspace(lam_min, lam_max, n_support)
    return (np.asarray(d)[..., None] > support[1:-1]).sum(-1)


def official_candidate_probs(d, distr, lam_min, lam_max):
    "Each candidate gets its bin's probability; 0 outside [lam_min, lam_max] (the mask the code means: an `or`, not a product)."
    p = np.asarray(distr)[official_bins(d, lam_min, lam_max, len(distr) + 1)]
    return np.where((np.asarray(d) < lam_min) | (np.asarray(d) > lam_max), 0.0, p)


def official_update(unnormalised, change):
    "Multiply, clip to [1e-25, 1e25], renormalise."
    u = np.clip(unnormalised * change, 1e-25, 1e25)
    return u, u / u.sum()


def official_state(metric_history, window_contents, distr, progress):
    "History (flattened), each window's mean, the distribution, the relative progress: one vector."
    return np.concatenate([np.asarray(metric_history).reshape(-1),
                           np.asarray([np.mean(w, axis=0) for w in window_contents]).reshape(-1),
                           np.asarray(distr).reshape(-1), [progress]])


def test_bin_grid_matches_the_published_one_away_from_the_edges():
    rng = np.random.default_rng(0)
    d = rng.uniform(0.1, 1.4, 5000)
    ours = bin_index(torch.tensor(d), BinnedDistribution(n_bins=29).edges).numpy()   # 30 grid points = 29 bins
    np.testing.assert_array_equal(ours, official_bins(d, 0.1, 1.4, 30))


def test_candidate_probabilities_match_the_published_weighting():
    rng = np.random.default_rng(1)
    distr = rng.random(29); distr /= distr.sum()
    d = rng.uniform(0.0, 2.0, (16, 16))
    dist = BinnedDistribution(torch.tensor(distr), n_bins=29, rule="candidate")
    np.testing.assert_allclose(dist(torch.tensor(d)).numpy(), official_candidate_probs(d, distr, 0.1, 1.4), rtol=1e-12)
    everyone = torch.ones(16, 16, dtype=torch.bool)
    np.testing.assert_allclose(dist.candidate_weights(torch.tensor(d), everyone).numpy(), official_candidate_probs(d, distr, 0.1, 1.4))
    paper = BinnedDistribution(torch.tensor(distr), n_bins=29)                      # the documented departure
    assert not np.allclose(paper.candidate_weights(torch.tensor(d), everyone).numpy(), official_candidate_probs(d, distr, 0.1, 1.4))


def test_action_update_matches_the_published_one():
    rng = np.random.default_rng(2)
    values = np.array([0.8, 1.0, 1.25])
    unnorm = rng.random(30) + 0.01; p = torch.tensor(unnorm / unnorm.sum())
    for _ in range(20):
        actions = rng.integers(0, 3, 30)
        unnorm, want = official_update(unnorm, values[actions])
        p = apply_actions(p, torch.tensor(actions), tuple(values))
        np.testing.assert_allclose(p.numpy(), want, rtol=1e-10)


def test_state_layout_matches_the_published_one():
    rng = np.random.default_rng(3)
    windows, history, n_bins = (2, 8, 16, 32), 20, 30
    state = TrainingState(n_metrics=7, windows=windows, history=history)
    pushed = [rng.random(7) for _ in range(40)]
    for m in pushed: state.push(torch.tensor(m))
    distr = rng.random(n_bins); distr /= distr.sum()
    ours = state(torch.tensor(distr), 0.25).numpy()
    want = official_state(pushed[-history:], [pushed[-w:] for w in windows], distr, 0.25)
    np.testing.assert_allclose(ours, want, rtol=1e-6)
    assert len(ours) == state.dim(n_bins)


@pytest.mark.parametrize("seed", range(5))
def test_reward_is_the_sign_of_the_change_of_recall_and_nmi(seed):
    rng = np.random.default_rng(seed)
    (r1, n1), (r0, n0) = rng.random(2), rng.random(2)
    assert reward(float(r1 + n1), float(r0 + n0)) == np.sign(np.mean([r1, n1]) - np.mean([r0, n0]))   # the code: sign of the mean's change


def official_policy_loss(value_logits, old_logits, next_value, actions, metrics, clip=0.2, discount=0.99):
    """The published A2C + PPO loss of one policy update. `value_logits` = (V(s_prev), logits (1, n_actions, K)) of the current
    policy on the previous state, `old_logits` the old policy's, `next_value` V(s) on the new state, `metrics` the reward
    metric (mean of R@1 and NMI) before and after. Reward: the sign of the metric's change; advantage: the reward plus the
    discounted value of the new state, minus the value of the previous one (both detached); the clipped PPO surrogate
    averaged over bins; plus half the squared error between V(s_prev) and the metric reached after the action."""
    value, logits = value_logits
    k = torch.arange(logits.shape[-1])
    logp = torch.log_softmax(logits, dim=1)[:, actions, k]                    # over the actions, per bin
    logp_old = torch.log_softmax(old_logits, dim=1)[:, actions, k]
    r = float(np.sign(metrics[-1] - metrics[-2]))
    adv = r + discount * next_value.detach() - value.detach()
    ratio = torch.exp(logp - logp_old.detach())
    surrogate = -torch.mean(torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv))
    return surrogate + 0.5 * torch.nn.functional.mse_loss(value, torch.full_like(value, float(metrics[-1])))


@pytest.mark.parametrize("seed", range(3))
def test_critic_and_policy_loss_match_the_published_formula(seed):
    "critic='metric' is the published update: the same loss value and the same gradient on every parameter."
    torch.manual_seed(seed)
    ours = PolicyLearner(9, 5, hidden=(16, 16), critic="metric")
    for _ in range(2): ours.update(torch.randn(9), torch.randint(0, 3, (5,)), 1.0, torch.randn(9), metric=0.5)   # pi != pi_old
    theirs = copy.deepcopy(ours)
    s_prev, s, actions = torch.randn(9), torch.randn(9), torch.randint(0, 3, (5,))
    metrics = [0.41, 0.43 if seed % 2 else 0.40]
    layout = lambda net, x: (net(x[None])[1].view(1, 1), net(x[None])[0].transpose(1, 2))   # (value (1, 1), logits (1, 3, K))
    loss = official_policy_loss(layout(theirs.policy, s_prev), layout(theirs.old_policy, s_prev)[1], theirs.policy(s[None])[1],
                                actions, metrics)
    theirs.optimizer.zero_grad(); loss.backward()
    out = ours.update(s_prev, actions, reward(metrics[1], metrics[0]), s, metric=metrics[1])
    assert out["policy_loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    for (name, p), q in zip(ours.policy.named_parameters(), theirs.policy.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)
    assert out["critic_loss"] == pytest.approx(0.5 * (out["value"] - metrics[1]) ** 2, rel=1e-5)


def test_the_single_step_critic_departs_from_the_published_one_where_intended():
    """The default: the value fitted to the reward r (T = 1, Sec. 4.2), V = tanh(z / 2) with the log-loss of r's sign, and
    A = r - V(s_prev); the published: the value regressed on the metric, the advantage bootstrapped."""
    torch.manual_seed(0)
    ours = PolicyLearner(9, 5, hidden=(16,))
    s_prev, s, actions = torch.randn(9), torch.randn(9), torch.tensor([0, 1, 2, 1, 0])
    v_prev = np.tanh(ours.policy(s_prev)[1].item() / 2)
    out = ours.update(s_prev, actions, -1.0, s, metric=0.42)
    assert out["value"] == pytest.approx(v_prev, rel=1e-5) and out["advantage"] == pytest.approx(-1.0 - v_prev, rel=1e-5)
    assert out["critic_loss"] == pytest.approx(-np.log((1 - v_prev) / 2), rel=1e-5)   # 2 * 0.5 * the log-loss of "r = -1"
