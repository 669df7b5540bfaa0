"""PADS against the published code (Confusezius/CVPR2020_PADS, `PADS_utilities.py`), read and restated here in our own
words as small numpy functions: the bin grid, the per-candidate probabilities (with the out-of-interval mask that the
published code means to apply), the action update, the state layout and the reward. A change of ours that departs from
these fails here, unless the departure is intended and documented in the chapter (`rule="bin"` is one: the paper's
definition; the published weighting is `rule="candidate"`)."""
import numpy as np
import pytest
import torch

from dml_book.methods.pads import BinnedDistribution, bin_index
from dml_book.methods.pads_policy import TrainingState, apply_actions, reward


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
