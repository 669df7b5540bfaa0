"""PADS against the authors' code run on the same inputs (`tools/parity_pads.py` wrote the fixture from
Confusezius/CVPR2020_PADS; its repository, commit and file:line per function are in `fixtures/parity/pads.json`).
Where our computation is the official one the numbers agree element by element to a relative 1e-12
(`parity.assert_parity`; values and gradients, float64); where we depart on purpose the test computes both and checks
the difference is the one the departure implies."""
import json
from pathlib import Path
import numpy as np
import pytest
import torch

from dml_book.methods.pads import BinnedDistribution, bin_index, negative_weights, init_probs, class_distances
from dml_book.distances import euclidean
from dml_book.methods.pads_policy import PolicyLearner, TrainingState, apply_actions, reward
from parity import RTOL, assert_fresh_fixture, assert_lines_match, assert_parity, fresh_run, official_copy, rel   # tests/parity.py

HERE = Path(__file__).parent / "fixtures" / "parity"
F = dict(np.load(HERE / "pads.npz"))
META = json.loads((HERE / "pads.json").read_text())
S = META["settings"]
K = S["n_bins"]


@pytest.fixture
def f64():
    old = torch.get_default_dtype(); torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def official_to_ours(flat: np.ndarray, learner: PolicyLearner, critic: bool = True) -> list[torch.Tensor]:
    "The official parameter vector (action rows a*K+k) as our parameters (actor rows k*3+a), in our order (critic=False: no value head)."
    out, i = [], 0
    for name, p in learner.policy.named_parameters():
        if name.startswith("critic") and not critic: continue
        x = flat[i:i + p.numel()]; i += p.numel()
        if name.startswith("actor"): x = x.reshape(3, K, -1).transpose(1, 0, 2).reshape(-1)   # (a, k) -> (k, a)
        out.append(torch.tensor(x).view_as(p))
    assert i == len(flat)
    return out


def drive(prefix="", algorithm="ppo", baseline="a2c"):
    "Our TrainingState, PolicyLearner and apply_actions over an official run's calls (`prefix`: its variant); every quantity per call."
    learner = PolicyLearner(F["states"].shape[1], K, S["action_values"], tuple(S["hidden"]), S["policy_lr"], algorithm=algorithm,
                            baseline=baseline, clip=S["ppo_clip"], old_policy_every=S["old_policy_every"], critic="metric",
                            gamma=S["discount"], ema_rate=0.05)
    with torch.no_grad():
        named = dict(learner.policy.named_parameters())
        for (n, p), x in zip([(n, p) for n, p in named.items() if baseline == "a2c" or not n.startswith("critic")],
                             official_to_ours(F[prefix + "init_params"], learner, critic=baseline == "a2c")): p.copy_(x)
        learner.old_policy.load_state_dict(learner.policy.state_dict())
    state = TrainingState(n_metrics=F["metrics"].shape[1], windows=S["windows"], history=S["history"])
    probs, e = torch.tensor(F["init_distr"]), F["metrics"][:, [0, 4]].mean(1)    # reward: mean of R@1 and NMI
    rec = {k: [] for k in ("state", "loss", "grad", "params", "old", "action_probs", "bins", "distr", "advantage", "learner")}
    rec["learner"] = learner
    actions = F[prefix + "actions"]
    for t, m in enumerate(F["metrics"]):
        state.push(torch.tensor(m))
        s = state(probs, S["progress_iters"][t] / S["max_iter"])
        rec["state"].append(s.numpy())
        if t:
            out = learner.update(s_prev, torch.tensor(actions[t - 1]), reward(float(e[t]), float(e[t - 1])), s, metric=float(e[t]))
            rec["loss"].append(out["policy_loss"]); rec["advantage"].append(out["advantage"])
            rec["grad"].append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in learner.policy.parameters()])
            rec["params"].append([p.detach().clone() for p in learner.policy.parameters()])
        rec["old"].append([p.detach().clone() for p in learner.old_policy.parameters()])
        pi = torch.softmax(learner.policy(s)[0], -1).detach()                        # (K, 3)
        rec["action_probs"].append(pi.numpy())
        cdf = torch.cumsum(pi, -1); cdf = cdf / cdf[:, -1:]                          # the same uniform, our probabilities
        rec["bins"].append(np.array([np.searchsorted(cdf[k].numpy(), u, side="right") for k, u in enumerate(F["uniforms"][t])]))
        probs = apply_actions(probs, torch.tensor(actions[t]), S["action_values"])
        rec["distr"].append(probs.numpy())
        s_prev = s
    return rec


@pytest.fixture(scope="module")
def run():
    old = torch.get_default_dtype(); torch.set_default_dtype(torch.float64)
    try: yield drive()
    finally: torch.set_default_dtype(old)


def test_fixture_names_the_official_code():
    assert META["repository"].endswith("Confusezius/CVPR2020_PADS") and len(META["commit"]) == 40
    assert all(":" in v and v.split(":")[1].isdigit() for v in META["functions"].values())
    assert set(META["lines"]) == set(META["functions"])      # the text of every cited line is stored
    named = {"states": "make_state", "action_probs": "act", "policy_forward": "forward", "init_distr": "probmode",
             "distrs, nonorm_distrs": "update_sample_distr", "triplets, neg_probs, neg_uniforms": "give", "dists": "dists",
             "ema_baselines": "exp_mov_avg", "losses, grads, params_final, old_params_final, old_refresh_call": "update",
             "edge_*, grid_*": "give", "grid_support": "__init__", "long_*": "update_sample_distr"}
    for key, name in named.items(): assert META["lines"][key].startswith(f"def {name}(self"), key


def test_cited_lines_and_numbers_match_a_fresh_run(tmp_path):
    "tools/parity_pads.py run again on the official copy: every cited line holds the stored text, and the fixture is what it writes."
    repo = official_copy("CVPR2020_PADS", META["commit"])
    assert_lines_match(META, repo)
    fresh_run("parity_pads.py", repo, tmp_path)
    assert_fresh_fixture(tmp_path, "pads", META, F)


def test_state_vector_equals_the_official(run):
    "History padded with the first metric vector, running averages, p, progress: the official `make_state` layout."
    assert_parity(run["state"], F["states"])


def test_action_probabilities_and_actions_equal_the_official(run):
    "The per-bin softmax over {alpha, 1, beta}; with the official uniforms our probabilities pick the official actions."
    assert_parity(run["action_probs"], F["action_probs"])
    np.testing.assert_array_equal(np.stack(run["bins"]), F["actions"])


def test_ppo_a2c_update_equals_the_official(run):
    "critic='metric' is the published update: loss and every gradient at each step, the parameters after the last Adam step, PPO's old policy."
    learner = run["learner"]
    assert_parity(run["loss"], F["losses"])
    for t, g in enumerate(run["grad"]):
        for ours, theirs in zip(g, official_to_ours(F["grads"][t], learner)): assert_parity(ours, theirs)
    for ours, theirs in zip(run["params"][-1], official_to_ours(F["params_final"], learner)): assert_parity(ours, theirs)
    for ours, theirs in zip(run["old"][-1], official_to_ours(F["old_params_final"], learner)): assert_parity(ours, theirs)
    refreshed = [t for t, o in enumerate(run["old"]) if any(not torch.equal(a, b) for a, b in zip(o, run["old"][0]))]
    assert refreshed[0] == int(F["old_refresh_call"])   # the same call refreshes the old policy in both codes


@pytest.mark.parametrize("prefix,algorithm,baseline", [("reinforce_", "reinforce", "a2c"), ("ema_", "ppo", "ema")])
def test_other_official_updates_equal_ours(f64, prefix, algorithm, baseline):
    """REINFORCE with the critic (`--policy_mode reinforce`) and PPO with the moving-average baseline (`--policy_dont_use_a2c`):
    the losses of every step, the first gradient, the parameters after the last step, and the moving average itself."""
    run = drive(prefix, algorithm, baseline)
    critic = baseline == "a2c"
    assert_parity(run["loss"], F[prefix + "losses"])
    first = [g for (n, _), g in zip(run["learner"].policy.named_parameters(), run["grad"][0]) if critic or not n.startswith("critic")]
    for ours, theirs in zip(first, official_to_ours(F[prefix + "first_grad"], run["learner"], critic)): assert_parity(ours, theirs)
    last = [p for (n, _), p in zip(run["learner"].policy.named_parameters(), run["params"][-1]) if critic or not n.startswith("critic")]
    for ours, theirs in zip(last, official_to_ours(F[prefix + "final_params"], run["learner"], critic)): assert_parity(ours, theirs)
    if not critic:
        e = F["metrics"][:, [0, 4]].mean(1); r = np.sign(np.diff(e))
        assert_parity(r - np.array(run["advantage"]), F[prefix + "baselines"])


def test_distribution_update_equals_the_official(run):
    assert_parity(run["distr"], F["distrs"])


def test_distribution_floor_departs_from_the_official_clip():
    """300 official updates with bin 0 always at alpha and the initial emphasis always at beta: ours (every bin's share
    >= 1e-30) equals the official (the unnormalised p clipped to [1e-25, 1e25]) element by element, the 1e-16 shares
    too, until our floor binds at call 73; the official clips bind at calls 94 (1e-25) and 268 (1e25). The total
    variation stays below 2e-16: the floor and the clip differ in shares no draw will ever meet."""
    acts, p = torch.tensor(F["long_actions"]), torch.tensor(F["long_init"])
    ours = []
    for _ in range(len(F["long_distrs"])): p = apply_actions(p, acts, S["action_values"]); ours.append(p.numpy())
    ours, off, raw = np.stack(ours), F["long_distrs"], F["long_nonorm_distrs"]
    first = int(np.argmax((ours <= 1e-30).any(1)))
    assert (first, int(np.argmax((raw <= 1e-25).any(1))), int(np.argmax((raw >= 1e25).any(1)))) == (72, 93, 267)
    np.testing.assert_allclose(ours[:first], off[:first], rtol=RTOL, atol=0)         # every share, however small
    assert np.abs(ours[first] - off[first]).max() / off[first].min() > 1e-3
    assert 0.5 * np.abs(ours - off).sum(1).max() < 2e-16


def official_bins(d):
    "The official bin of a distance: how many inner grid points it exceeds (0 below the support, K-1 above)."
    return (d[..., None] > np.linspace(*S["support"], K + 1)[1:-1]).sum(-1)


def negatives(rule="candidate"):
    "Our normalised negative distribution per anchor on the fixture's batch (self-regularised, as the official run)."
    d = euclidean(torch.tensor(F["batch"]))
    labels, a = torch.tensor(F["labels"]), torch.arange(len(F["labels"]))
    dist = BinnedDistribution(torch.tensor(F["sampler_distr"]), *S["support"], n_bins=K, rule=rule)
    w = negative_weights(d, labels, a, a, dist, self_regularization=True).numpy()   # p is unused by a BinnedDistribution
    return w / w.sum(1, keepdims=True), d.numpy()


def departure_masses():
    "Official probability mass per anchor on candidates we never offer: the anchor itself; others outside [lambda_min, lambda_max]."
    d, labels, p = F["batch_distances"], F["labels"], F["neg_probs"]
    same, eye = labels[:, None] == labels[None], np.eye(len(labels), dtype=bool)
    lo, hi = S["support"]
    outside = ~eye & (((d > hi)) | (~same & (d < lo)))    # a close positive is counted in bin 0 by both codes
    return (p * eye).sum(1), (p * outside).sum(1)


def test_negative_weights_equal_the_official_on_the_shared_candidates():
    "Where both codes offer a candidate, p_k of its bin (rule='candidate', the official weighting): the same after renormalising."
    ours, d = negatives("candidate")
    assert_parity(d, F["batch_distances"])
    off = F["neg_probs"]
    shared = ours > 0
    assert (off[shared] > 0).all()
    renorm = off * shared / (off * shared).sum(1, keepdims=True)
    assert_parity(ours, renorm)
    inside = (d >= S["support"][0]) & (d <= S["support"][1])
    np.testing.assert_array_equal(bin_index(torch.tensor(d), BinnedDistribution(n_bins=K).edges).numpy()[inside], official_bins(d)[inside])


def test_negative_sampling_departs_by_the_out_of_support_and_self_mass():
    """With `include_pos` the official weights run over the anchor's whole row, so the anchor itself is offered as its own
    negative (at distance 0, bin 0; `include_same` is about positives), and, its out-of-interval mask being a product of
    two exclusive conditions, so is every candidate outside [0.1, 1.4] (in bin 0 or K-1); we offer neither. So the total
    variation between the two distributions is exactly the official mass on those candidates: on this batch 0.388 per
    anchor on average, of which 0.3825 lies outside the interval and 0.0055 on the anchor itself."""
    ours, _ = negatives("candidate")
    self_mass, out_mass = departure_masses()
    tv = 0.5 * np.abs(ours - F["neg_probs"]).sum(1)
    assert_parity(tv, self_mass + out_mass)
    np.testing.assert_allclose([tv.mean(), out_mass.mean(), self_mass.mean()], [0.3880, 0.3825, 0.0055], atol=5e-5)
    assert (self_mass > 0).all()   # bin 0 has mass in this p, and the anchor is at distance 0


def test_sampled_negatives_under_identical_uniforms():
    """The official draws are the inverse CDF of the official p at the recorded uniforms. On the first batch every anchor
    has official mass on a candidate we drop; under a p whose edge bins are empty (the `edge_` batch) none has, and the
    official uniform picks the official negative from our distribution for every anchor."""
    np.testing.assert_array_equal(F["triplets"][:, 2], [np.searchsorted(np.cumsum(p) / p.sum(), u, side="right")
                                                         for p, u in zip(F["neg_probs"], F["neg_uniforms"])])
    self_mass, out_mass = departure_masses()
    assert (self_mass + out_mass > 0).all()                       # the first batch: no anchor to compare draws on
    d = euclidean(torch.tensor(F["batch"]))
    labels, a = torch.tensor(F["edge_labels"]), torch.arange(len(F["edge_labels"]))
    dist = BinnedDistribution(torch.tensor(F["edge_sampler_distr"]), *S["support"], n_bins=K, rule="candidate")
    w = negative_weights(d, labels, a, a, dist, self_regularization=True).numpy()
    ours = w / w.sum(1, keepdims=True)
    assert_parity(ours, F["edge_neg_probs"])                       # nothing dropped: the same distribution
    cdf = np.cumsum(ours, 1); cdf /= cdf[:, -1:]
    mine = np.array([np.searchsorted(c, u, side="right") for c, u in zip(cdf, F["edge_neg_uniforms"])])
    np.testing.assert_array_equal(mine, F["edge_triplets"][:, 2])
    assert len(set(mine)) > 8                                       # the draws differ from anchor to anchor


def test_negative_weights_at_bin_edges_ties_and_outside_the_interval():
    """`give` on a chosen distance matrix: distances exactly on the official grid points and on our edges (the two grids,
    np.linspace and torch.linspace, differ by one ulp at 10 of the 30 points), at 0, tied, below 0.1 and above 1.4. The
    official bin of a distance is how many inner grid points it exceeds (checked here against the official weights
    themselves); ours is bin k for edges[k] <= d. They differ only for a distance from our inner edge up to the official
    point where ours is the lower of the two (both included): there we take the upper bin, the official code the lower (a
    set of measure zero)."""
    d, labels = F["grid_distances"], torch.tensor(F["grid_labels"])
    n, p, off = len(d), F["grid_sampler_distr"], F["grid_neg_probs"]
    grid, edges = F["grid_support"], BinnedDistribution(n_bins=K).edges.numpy()
    assert (grid != edges).sum() == 10 and np.abs(grid - edges).max() <= 2.3e-16
    k_off = (d[..., None] > grid[1:-1]).sum(-1)
    assert_parity(off, p[k_off] / p[k_off].sum(1, keepdims=True))   # the official rule, all candidates, anchor included
    dist = BinnedDistribution(torch.tensor(p), *S["support"], n_bins=K, rule="candidate")
    a = torch.arange(n)
    w = negative_weights(torch.tensor(d), labels, a, a, dist, self_regularization=True).numpy()
    k_ours = bin_index(torch.tensor(d), dist.edges).numpy()
    same, eye = F["grid_labels"][:, None] == F["grid_labels"][None], np.eye(n, dtype=bool)
    cand = ~eye & (((d >= 0.1) & (d <= 1.4)) | (same & (d < 0.1)))   # close positives: bin 0 in both codes
    k_ours = np.where(same & (d < 0.1), 0, k_ours)
    assert_parity(w / w.sum(1, keepdims=True), p[k_ours] * cand / (p[k_ours] * cand).sum(1, keepdims=True))
    upper = ((edges[1:-1] <= d[..., None]) & (d[..., None] <= grid[1:-1])).any(-1)   # between our edge and the official point
    np.testing.assert_array_equal((k_ours != k_off) & cand, cand & upper)
    assert (cand & upper).sum() > 0 and (d == 0.7).sum() > 2 and ((d > 1.4) | (d < 0.1) & ~eye).any()


def init_departure():
    "Our and the official uniform_low p0 on the fixture's bins, and the total variation between them."
    ours = init_probs("uniform_low", BinnedDistribution(None, *S["support"], n_bins=K).centers).numpy()
    return ours, F["init_distr"], 0.5 * np.abs(ours - F["init_distr"]).sum()


def test_initial_distribution_departs_where_stated():
    """uniform_low: the official code marks the bins whose start + 2/30 (not the centre) lies in [0.3, 0.7], with 1e-15
    elsewhere; ours marks the bins whose centre lies in [0.3, 0.7], with 1e-3 elsewhere. The emphasis is the same
    number of bins, one bin lower in the official code; the total variation is what that shift and the floor make."""
    ours, off, tv = init_departure()
    edges = BinnedDistribution(None, *S["support"], n_bins=K).edges.numpy()
    on_off, on_ours = off > 1e-10, ours > 2 * ours.min()
    np.testing.assert_array_equal(on_off, (edges[:-1] + 2 / (K + 1) >= 0.3) & (edges[:-1] + 2 / (K + 1) <= 0.7))
    np.testing.assert_array_equal(np.roll(on_off, 1), on_ours)                    # one bin higher in ours
    assert_parity(ours, np.where(on_ours, 1.0, 1e-3) / np.where(on_ours, 1.0, 1e-3).sum())   # ours: 1 and 1e-3, normalised
    n, h, f = on_ours.sum(), ours.max(), ours.min()   # official: 1/n on its n bins; ours: h on ours, f elsewhere
    want = 0.5 * ((n - 1) * abs(h - 1 / n) + abs(f - 1 / n) + h + (K - n - 1) * f)   # overlap, official-only, ours-only, rest
    assert_parity(tv, want)


def test_class_distances_depart_as_cosine_against_euclidean():
    """The official state's intra/inter distances are cosine distances (the centres normalised); ours are Euclidean. Ours
    equal a brute-force mean over pairs; on unit vectors the official intra distance is the mean of |a - b|^2 / 2 over
    pairs of a class, and its inter distance that of the normalised centres: both pinned to those values."""
    if "dists" not in F: pytest.skip("the fixture was written without scipy/scikit-learn")
    emb, lab = F["dists_embeddings"], F["dists_labels"]
    pairs = lambda x: [(i, j) for i in range(len(x)) for j in range(len(x)) if i != j]
    classes = [emb[lab == c] for c in np.unique(lab)]
    centres = np.stack([x.mean(0) for x in classes]); unit = centres / np.linalg.norm(centres, axis=1, keepdims=True)
    ours = class_distances(torch.tensor(emb), lab)
    assert_parity(ours, [np.mean([np.mean([np.linalg.norm(x[i] - x[j]) for i, j in pairs(x)]) for x in classes]),
                         np.mean([np.linalg.norm(centres[i] - centres[j]) for i, j in pairs(centres)])])
    assert_parity(F["dists"], [np.mean([np.mean([np.sum((x[i] - x[j]) ** 2) / 2 for i, j in pairs(x)]) for x in classes]),
                               np.mean([np.sum((unit[i] - unit[j]) ** 2) / 2 for i, j in pairs(unit)])])
