"""DCML against the authors' code run on the same inputs (`tools/parity_dcml.py` wrote the fixture from wzzheng/DCML;
its repository, commit and file:line per function are in `fixtures/parity/dcml.json`). Where our computation is the
official one the numbers agree element by element to a relative 1e-12 (`parity.assert_parity`; values and gradients,
float64); where we depart on purpose the test computes both and checks that the difference is the one the departure
implies. The one difference of arithmetic: the official margin loss takes sqrt(|a - p|^2 + 1e-8) where ours takes
|a - p|; the tests that compare margin-loss values give our loss the official distance (`official_sqrt`), and
`test_margin_distance_epsilon_is_the_whole_residual` measures what the 1e-8 does on its own."""
import json
from pathlib import Path
from types import SimpleNamespace
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dml_book.methods.dcml import DCML, Compositor, compose, rein_loss, concatenate
from dml_book.losses import MarginLoss
from dml_book.distances import euclidean
from parity import assert_fresh_fixture, assert_lines_match, assert_parity, fresh_run, official_copy, rel   # tests/parity.py

HERE = Path(__file__).parent / "fixtures" / "parity"
FX = {k: torch.tensor(v) for k, v in np.load(HERE / "dcml.npz").items()}
META = json.loads((HERE / "dcml.json").read_text())
S = META["settings"]
K, D, M = S["n_learners"], S["learner_dim"], S["n_compositors"]
TRIPLETS = tuple(FX["triplets"].T)


def method(use_sign: bool, seed: int = 0) -> DCML:
    "Our DCML with the official compositor weights (and, with the sign score, a seeded V of eq. 5)."
    torch.manual_seed(seed)
    dcml = DCML(n_learners=K, learner_dim=D, n_compositors=M, use_sign=use_sign)
    dcml.compositor = Compositor(K * D, K, M, use_sign).double()
    with torch.no_grad():
        dcml.compositor.weighting.copy_(FX["compositor_weight"]); dcml.compositor.weighting_bias.copy_(FX["compositor_bias"])
    return dcml


def margin():
    "The official margin settings: alpha 0.2, one learned beta per class at 1.2 (float32, as the official code casts it)."
    return MarginLoss(margin=S["margin"], beta=S["beta"], learn_beta=True, num_classes=S["n_classes"], per_class=True)


def trainer(loss):
    "The attributes `DCML.losses` uses: the loss, a miner that returns the fixture's triplets, one process."
    return SimpleNamespace(loss_fn=loss, miner=lambda e, l: TRIPLETS, gather=lambda g, l: (g, l))


def official_distance(e):
    "The official margin loss's distance, sqrt(sum (a - p)^2 + 1e-8) (criteria/margin.py), for every pair."
    return ((e[:, None] - e[None]).pow(2).sum(-1) + 1e-8).pow(0.5)


@pytest.fixture
def official_sqrt(monkeypatch):
    "Our MarginLoss with the official 1e-8 inside its square root (everything else ours)."
    monkeypatch.setattr("dml_book.losses.triplet.euclidean", official_distance)


def active(z):
    "Per-term activity of the margin loss on the fixture's triplets: (non-zero pair terms, triplets with one)."
    d = euclidean(F.normalize(z, dim=-1)); a, p, n = TRIPLETS
    beta = torch.tensor(S["beta"], dtype=torch.float32).double()
    pos, neg = F.relu(d[a, p] - beta + S["margin"]) > 0, F.relu(beta - d[a, n] + S["margin"]) > 0
    return int(pos.sum() + neg.sum()), int((pos | neg).sum())


def test_fixture_names_the_official_code():
    assert META["repository"].endswith("wzzheng/DCML") and len(META["commit"]) == 40
    assert all(":" in v and v.split(":")[1].isdigit() for v in META["functions"].values())
    L = META["lines"]
    assert set(L) == set(META["functions"])                  # the text of every cited line is stored
    assert L["composites_raw"].startswith("def soft_select(") and L["j_sub"] == L["j_dis"] == "def forward(self, batch, labels):"
    assert L["miner_probs"].startswith("def inverse_sphere_distances(") and "softmax(self.compos_layer" in L["weights"]
    assert L["rein"].startswith("supervise_loss = supervise_loss +") and L["loss_sum"].startswith("loss = supervise_loss")


def test_cited_lines_and_numbers_match_a_fresh_run(tmp_path):
    "tools/parity_dcml.py run again on the official copy: every cited line holds the stored text, and the fixture is what it writes."
    repo = official_copy("DCML", META["commit"])
    assert_lines_match(META, repo)
    fresh_run("parity_dcml.py", repo, tmp_path)
    assert_fresh_fixture(tmp_path, "dcml", META, FX)


def test_weights_and_composites_equal_the_official_without_the_sign_score():
    "use_sign=False is the official compositor: softmax weights on the detached concatenation, composites of eq. 6."
    z, c = method(False).composites(FX["sub_embeddings"])
    assert_parity(c, FX["weights"])
    assert_parity(z, FX["composites_raw"])
    assert_parity(F.normalize(z, dim=-1), FX["composites"])   # what the subtask losses see (normalize_composites)


def test_rein_equals_the_official_with_and_without_the_sign_score():
    "J_rein: -sum_m log max_k |c_m^k|, batch mean; |c| = t with the sign score too, so both equal the official value and gradient."
    for use_sign in (False, True):
        dcml = method(use_sign)
        _, c = dcml.composites(FX["sub_embeddings"])
        loss = rein_loss(c); loss.backward()
        assert_parity(loss, FX["rein"])
        assert_parity(dcml.compositor.weighting.grad, FX["rein_grad_weight"])
        assert_parity(dcml.compositor.weighting_bias.grad, FX["rein_grad_bias"])


def test_subtask_losses_and_gradients_match_up_to_the_margin_normalisation(official_sqrt):
    """J_T(z_m), the margin loss on each normalised composite, and its gradient on the sub-embeddings and the compositor.
    The hinge terms are the same; the official loss divides their sum by the triplets with a non-zero term (`(pos > 0) +
    (neg > 0)` of two bool tensors is their `or`), ours by the non-zero terms (the library's `mean_nonzero`). So ours x terms = theirs x triplets."""
    for m in range(M):
        dcml, g = method(False), FX["sub_embeddings"].clone().requires_grad_()
        z, _ = dcml.composites(g)
        loss = margin()(z[:, m], FX["labels"], TRIPLETS); loss.backward()
        terms, trips = active(z[:, m].detach())
        assert_parity(loss * terms / trips, FX["j_sub"][m])
        assert_parity(g.grad * terms / trips, FX["j_sub_grad_sub"][m])
        assert_parity(dcml.compositor.weighting.grad[m] * terms / trips, FX["j_sub_grad_weight"][m])


def test_losses_of_the_method_equal_the_official_terms(official_sqrt):
    "`DCML.losses` (no sign score): J_rein, the sum of the J_T and J_dis on the normalised concatenation, term by term."
    dcml = method(False)
    out = dcml.losses(trainer(margin()), FX["sub_embeddings"], FX["labels"])
    assert_parity(out["rein"], FX["rein"])
    z, _ = dcml.composites(FX["sub_embeddings"])
    factors = [np.divide(*active(z[:, m].detach())) for m in range(M)]
    per = [FX["j_sub"][m] / factors[m] for m in range(M)]   # the official J_T in our normalisation
    assert_parity(out["sub"], sum(per))
    terms, trips = active(concatenate(FX["sub_embeddings"]))
    assert_parity(out["dis"] * terms / trips, FX["j_dis"])
    assert_parity(out["loss"], out["dis"] + out["sub"] + 0.05 * out["rein"])   # lambda_m = 1, lambda_r = 0.05


def test_margin_distance_epsilon_is_the_whole_residual():
    """Without the official 1e-8 inside the square root, J_T and its gradients differ from the official ones by
    0.3 to 0.6e-8 relative (the chapter's 5.7e-9: each distance moves by ~5e-9 / d); with it, by rounding only (above).
    Both codes hold beta in float32 (1.2000000477, 4.8e-8 above 1.2), so beta adds nothing to it."""
    worst = []
    for m in range(M):
        dcml, g = method(False), FX["sub_embeddings"].clone().requires_grad_()
        z, _ = dcml.composites(g)
        loss = margin()(z[:, m], FX["labels"], TRIPLETS); loss.backward()
        terms, trips = active(z[:, m].detach())
        worst.append([rel(loss * terms / trips, FX["j_sub"][m]), rel(g.grad * terms / trips, FX["j_sub_grad_sub"][m]),
                      rel(dcml.compositor.weighting.grad[m] * terms / trips, FX["j_sub_grad_weight"][m])])
    worst = np.array(worst)
    np.testing.assert_allclose(worst.max(0), [5.7067e-9, 6.0482e-9, 3.2081e-9], rtol=1e-4)   # J_T, d/d sub-embeddings, d/d compositors
    assert worst.min() > 2e-9
    assert margin().beta.dtype == torch.float32


def sign_departure():
    "Composites with the sign score (our default) and without (official), the signs, and the weights."
    z_off, t = method(False).composites(FX["sub_embeddings"])
    z_sign, c = method(True).composites(FX["sub_embeddings"])
    return z_sign.detach(), z_off.detach(), t.detach(), c.detach()


def test_sign_score_departs_by_twice_the_negatively_signed_learners():
    """Eq. (5) is not in the official code. With it, z_m = sum_k s_m^k t_m^k g_k, so z_ours - z_official =
    -2 sum_{k: s = -1} t_m^k g_k, and the weights' magnitudes are the official ones."""
    z_sign, z_off, t, c = sign_departure()
    s = torch.sign(c)
    want = -2 * torch.einsum("bmk,bkd->bmd", t * (s < 0), FX["sub_embeddings"])
    assert_parity(z_sign - FX["composites_raw"], want)
    assert_parity(c.abs(), FX["weights"])
    assert 0 < (s < 0).double().mean() < 1                      # both signs occur on this fixture


def test_compositor_input_departs_by_the_concatenations_norm():
    """Our learners give blocks of the unit-norm y, the official raw blocks: the compositors read y / |y|, so their
    weights differ, while each composite of the given weights only rescales."""
    g = FX["sub_embeddings"]; scale = concatenate(g).norm(dim=1)[:, None, None]
    z_unit, c_unit = method(False).composites(g / scale)
    assert_parity(compose(FX["weights"], g / scale), FX["composites_raw"] / scale)
    assert (c_unit - FX["weights"]).abs().max() > 1e-3


def test_single_feature_forward_fails_in_the_official_code():
    "The README's default (one feature) passes a list to normalize in the official forward; the script records the error."
    assert META["single_feature_forward"].startswith("AttributeError")
    assert "else if" in META["syntax_fixed"]


def miner_departure():
    "Our distance-weighted negative distribution on the normalised concatenation, with and without the upper cut-off."
    from dml_book.miners import DistanceWeightedMiner
    y, labels = concatenate(FX["sub_embeddings"]), FX["labels"]
    with_cut = DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4).probabilities(y, labels)
    no_cut = DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=float("inf")).probabilities(y, labels)
    return with_cut, no_cut


def test_distance_weighted_miner_departs_by_the_upper_cutoff():
    """The official `batchminer/distance.py` weights negatives by 1/q(d) with d clipped at 0.5, and leaves its upper cut-off
    commented out; our miner (and the DCML-MDW presets, Wu et al.'s 1.4) never draws a negative at d >= 1.4. Without the
    cut-off ours is the official distribution; with it, the total variation is the official mass at d >= 1.4."""
    with_cut, no_cut = miner_departure()
    assert_parity(no_cut, FX["miner_probs"])
    far = FX["miner_distances"] >= 1.4
    tv = 0.5 * (with_cut - FX["miner_probs"]).abs().sum(1)
    assert_parity(tv, (FX["miner_probs"] * far).sum(1))
    assert tv.max() > 0
