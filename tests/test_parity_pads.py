"""PADS against the authors' code run on the same inputs (`tools/parity_pads.py` wrote the fixture from
Confusezius/CVPR2020_PADS; its repository, commit and file:line per function are in `fixtures/parity/pads.json`).
Where our computation is the official one the numbers agree to rtol 1e-6 (values and gradients, float64); where we
depart on purpose the test computes both and checks the difference is the one the departure implies."""
import json
from pathlib import Path
import numpy as np
import pytest
import torch

from dml_book.methods.pads import BinnedDistribution, bin_index, negative_weights, init_probs, class_distances
from dml_book.distances import euclidean
from dml_book.methods.pads_policy import PolicyLearner, TrainingState, apply_actions, reward
from parity import rel   # tests/parity.py

HERE = Path(__file__).parent / "fixtures" / "parity"
F = dict(np.load(HERE / "pads.npz"))
META = json.loads((HERE / "pads.json").read_text())
S = META["settings"]
K, RTOL = S["n_bins"], 1e-6


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


def test_state_vector_equals_the_official(run):
    "History padded with the first metric vector, running averages, p, progress: the official `make_state` layout."
    assert rel(run["state"], F["states"]) < RTOL


def test_action_probabilities_and_actions_equal_the_official(run):
    "The per-bin softmax over {alpha, 1, beta}; with the official uniforms our probabilities pick the official actions."
    assert rel(run["action_probs"], F["action_probs"]) < RTOL
    np.testing.assert_array_equal(np.stack(run["bins"]), F["actions"])


def test_ppo_a2c_update_equals_the_official(run):
    "critic='metric' is the published update: loss and every gradient at each step, the parameters after the last Adam step, PPO's old policy."
    learner = run["learner"]
    assert rel(run["loss"], F["losses"]) < RTOL
    for t, g in enumerate(run["grad"]):
        for ours, theirs in zip(g, official_to_ours(F["grads"][t], learner)): assert rel(ours, theirs) < RTOL
    for ours, theirs in zip(run["params"][-1], official_to_ours(F["params_final"], learner)): assert rel(ours, theirs) < RTOL
    for ours, theirs in zip(run["old"][-1], official_to_ours(F["old_params_final"], learner)): assert rel(ours, theirs) < RTOL
    refreshed = [t for t, o in enumerate(run["old"]) if any(not torch.equal(a, b) for a, b in zip(o, run["old"][0]))]
    assert refreshed[0] == int(F["old_refresh_call"])   # the same call refreshes the old policy in both codes


@pytest.mark.parametrize("prefix,algorithm,baseline", [("reinforce_", "reinforce", "a2c"), ("ema_", "ppo", "ema")])
def test_other_official_updates_equal_ours(f64, prefix, algorithm, baseline):
    """REINFORCE with the critic (`--policy_mode reinforce`) and PPO with the moving-average baseline (`--policy_dont_use_a2c`):
    the losses of every step, the first gradient, the parameters after the last step, and the moving average itself."""
    run = drive(prefix, algorithm, baseline)
    critic = baseline == "a2c"
    assert rel(run["loss"], F[prefix + "losses"]) < RTOL
    first = [g for (n, _), g in zip(run["learner"].policy.named_parameters(), run["grad"][0]) if critic or not n.startswith("critic")]
    for ours, theirs in zip(first, official_to_ours(F[prefix + "first_grad"], run["learner"], critic)): assert rel(ours, theirs) < RTOL
    last = [p for (n, _), p in zip(run["learner"].policy.named_parameters(), run["params"][-1]) if critic or not n.startswith("critic")]
    for ours, theirs in zip(last, official_to_ours(F[prefix + "final_params"], run["learner"], critic)): assert rel(ours, theirs) < RTOL
    if not critic:
        e = F["metrics"][:, [0, 4]].mean(1); r = np.sign(np.diff(e))
        assert rel(r - np.array(run["advantage"]), F[prefix + "baselines"]) < RTOL


def test_distribution_update_equals_the_official(run):
    assert rel(run["distr"], F["distrs"]) < RTOL


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
    np.testing.assert_allclose(d, F["batch_distances"], rtol=1e-12)
    off = F["neg_probs"]
    shared = ours > 0
    assert (off[shared] > 0).all()
    renorm = off * shared / (off * shared).sum(1, keepdims=True)
    assert rel(ours, renorm) < RTOL
    inside = (d >= S["support"][0]) & (d <= S["support"][1])
    np.testing.assert_array_equal(bin_index(torch.tensor(d), BinnedDistribution(n_bins=K).edges).numpy()[inside], official_bins(d)[inside])


def test_negative_sampling_departs_by_the_out_of_support_and_self_mass():
    """The official code offers the anchor itself (include_same) and, its out-of-interval mask being a product of two
    exclusive conditions, every candidate outside [0.1, 1.4] (in bin 0 or K-1); we offer neither. So the total variation
    between the two distributions is exactly the official mass on those candidates."""
    ours, _ = negatives("candidate")
    self_mass, out_mass = departure_masses()
    tv = 0.5 * np.abs(ours - F["neg_probs"]).sum(1)
    np.testing.assert_allclose(tv, self_mass + out_mass, rtol=1e-9, atol=1e-15)
    assert (self_mass > 0).all()   # bin 0 has mass in this p, and the anchor is at distance 0


def test_sampled_negatives_under_identical_uniforms():
    "Where the official distribution puts no mass on candidates we drop, the official uniform picks the same negative with ours."
    ours, _ = negatives("candidate")
    self_mass, out_mass = departure_masses()
    cdf = np.cumsum(ours, 1); cdf /= cdf[:, -1:]
    mine = np.array([np.searchsorted(c, u, side="right") for c, u in zip(cdf, F["neg_uniforms"])])
    np.testing.assert_array_equal(F["triplets"][:, 2], [np.searchsorted(np.cumsum(p) / p.sum(), u, side="right")
                                                         for p, u in zip(F["neg_probs"], F["neg_uniforms"])])
    clean = self_mass + out_mass == 0
    np.testing.assert_array_equal(mine[clean], F["triplets"][clean, 2])


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
    n, h, f = on_ours.sum(), ours.max(), ours.min()   # official: 1/n on its n bins; ours: h on ours, f elsewhere
    want = 0.5 * ((n - 1) * abs(h - 1 / n) + abs(f - 1 / n) + h + (K - n - 1) * f)   # overlap, official-only, ours-only, rest
    np.testing.assert_allclose(tv, want, rtol=1e-9)


def test_class_distances_depart_as_cosine_against_euclidean():
    """The official state's intra/inter distances are cosine distances (the centres normalised); ours are Euclidean. On unit
    vectors the official intra distance is half our mean squared distance."""
    if "dists" not in F: pytest.skip("the fixture was written without scipy/scikit-learn")
    emb, lab = torch.tensor(F["dists_embeddings"]), F["dists_labels"]
    d2 = euclidean(emb).numpy() ** 2 / 2
    intra = np.mean([d2[np.ix_(lab == c, lab == c)].sum() / ((lab == c).sum() ** 2 - (lab == c).sum()) for c in np.unique(lab)])
    np.testing.assert_allclose(F["dists"][0], intra, rtol=1e-9)
    ours = np.array(class_distances(emb, lab))
    assert rel(ours, F["dists"]) > 0.05
