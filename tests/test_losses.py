"Cross-checks of dml_book.losses against pytorch-metric-learning (values and gradients) and brute-force loops."
import itertools, math
import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses as pml_losses, miners as pml_miners

from dml_book.registry import LOSSES
from dml_book.losses import (BaseLoss, LossOutput, reduce_losses, TripletLoss, ContrastiveLoss, MarginLoss, NPairLoss,
                             LiftedStructureLoss, AngularLoss, MultiSimilarityLoss, ProxyNCALoss, ProxyAnchorLoss,
                             NormSoftmaxLoss)
from dml_book.miners import SemiHardMiner, BatchHardMiner

TOL = {torch.float64: 1e-5, torch.float32: 1e-4}
# (batch size, classes in the batch, balanced m-per-class labels?)
BATCHES = [(12, 4, True), (32, 8, True), (40, 5, False), (64, 16, True)]


def make_batch(B, C, balanced, dtype, seed, dim=16):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(B, dim, generator=g, dtype=dtype, requires_grad=True)
    if balanced: labels = torch.arange(C).repeat_interleave(B // C)[torch.randperm(B, generator=g)]
    else: labels = torch.randint(0, C, (B,), generator=g)
    return raw, labels


def value_and_grad(loss_fn, raw, labels, *args, params=()):
    "Loss on the L2-normalised batch; gradients with respect to the raw vectors (and `params`)."
    v = loss_fn(F.normalize(raw, dim=1), labels, *args)
    return v.detach(), torch.autograd.grad(v, [raw, *params])


def assert_same(ours, pml, raw, labels, *args, params=((), ())):
    v1, g1 = value_and_grad(ours, raw, labels, *args, params=params[0])
    v2, g2 = value_and_grad(pml, raw, labels, *args, params=params[1])
    tol = TOL[raw.dtype]
    assert torch.isfinite(v1) and abs((v1 - v2).item()) <= tol * max(1, abs(v2.item())), (v1.item(), v2.item())
    for a, b in zip(g1, g2):
        b = b.reshape(a.shape) if a.shape == b.shape else b.T
        assert (a - b).abs().max() <= tol, float((a - b).abs().max())


# Rows of the table: our loss = PML loss (same constructor arguments where the concept is the same).
PAIR_ROWS = {
    "triplet": (lambda: TripletLoss(margin=0.2), lambda: pml_losses.TripletMarginLoss(margin=0.2)),
    "triplet_m05": (lambda: TripletLoss(margin=0.5), lambda: pml_losses.TripletMarginLoss(margin=0.5)),
    "contrastive": (lambda: ContrastiveLoss(pos_margin=0.1, neg_margin=0.8),
                    lambda: pml_losses.ContrastiveLoss(pos_margin=0.1, neg_margin=0.8)),
    "margin": (lambda: MarginLoss(margin=0.2, beta=1.2), lambda: pml_losses.MarginLoss(margin=0.2, nu=0, beta=1.2)),
    "multisimilarity": (lambda: MultiSimilarityLoss(alpha=2, beta=40, base=0.5),
                        lambda: pml_losses.MultiSimilarityLoss(alpha=2, beta=40, base=0.5)),
    "lifted": (lambda: LiftedStructureLoss(neg_margin=1.0, pos_margin=0.1),
               lambda: pml_losses.LiftedStructureLoss(neg_margin=1.0, pos_margin=0.1)),
    "angular": (lambda: AngularLoss(alpha=40), lambda: pml_losses.AngularLoss(alpha=40)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("row", list(PAIR_ROWS))
def test_pair_losses_match_pml(row, batch, dtype):
    ours, pml = PAIR_ROWS[row]
    raw, labels = make_batch(*batch, dtype, seed=len(row) * 100 + batch[0])
    assert_same(ours(), pml(), raw, labels)


@pytest.mark.parametrize("miner", ["semihard", "batchhard", "pml_pairs"])
@pytest.mark.parametrize("row", list(PAIR_ROWS))
def test_pair_losses_match_pml_with_mined_tuples(row, miner):
    ours, pml = PAIR_ROWS[row]
    raw, labels = make_batch(32, 8, True, torch.float64, seed=3)
    emb = F.normalize(raw.detach(), dim=1)
    tup = {"semihard": lambda: SemiHardMiner(0.3)(emb, labels), "batchhard": lambda: BatchHardMiner()(emb, labels),
           "pml_pairs": lambda: pml_miners.MultiSimilarityMiner(0.1)(emb, labels)}[miner]()
    assert len(tup[0]) > 0
    assert_same(ours(), pml(), raw, labels, tup)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n_classes", [2, 8, 20])
def test_npair_matches_pml_on_two_per_class(n_classes, dtype):
    g = torch.Generator().manual_seed(n_classes)
    raw = torch.randn(2 * n_classes, 16, generator=g, dtype=dtype, requires_grad=True)
    labels = torch.arange(n_classes).repeat(2)[torch.randperm(2 * n_classes, generator=g)]
    assert_same(NPairLoss(), pml_losses.NPairsLoss(), raw, labels)


def test_multisimilarity_epsilon_is_pml_miner_then_loss():
    raw, labels = make_batch(32, 8, True, torch.float64, seed=5)
    emb = F.normalize(raw.detach(), dim=1)
    tup = pml_miners.MultiSimilarityMiner(epsilon=0.1)(emb, labels)
    v1, g1 = value_and_grad(MultiSimilarityLoss(2, 40, 0.5, epsilon=0.1), raw, labels)
    v2, g2 = value_and_grad(pml_losses.MultiSimilarityLoss(2, 40, 0.5), raw, labels, tup)
    assert abs((v1 - v2).item()) < 1e-10 and (g1[0] - g2[0]).abs().max() < 1e-10


@pytest.mark.parametrize("batch", BATCHES[:3])
def test_margin_learnable_per_class_beta_matches_pml(batch):
    raw, labels = make_batch(*batch, torch.float64, seed=11)
    n_cls = batch[1]
    ours = MarginLoss(margin=0.2, beta=1.1, learn_beta=True, num_classes=n_cls).double()
    pml = pml_losses.MarginLoss(margin=0.2, nu=0, beta=1.1, learn_beta=True, num_classes=n_cls).double()
    with torch.no_grad():
        b = torch.linspace(0.9, 1.3, n_cls, dtype=torch.float64)
        ours.beta.copy_(b); pml.beta.copy_(b)
    assert_same(ours, pml, raw, labels, params=((ours.beta,), (pml.beta,)))


PROXY_ROWS = {
    "proxynca": (lambda C, D: ProxyNCALoss(C, D), lambda C, D: pml_losses.ProxyNCALoss(C, D)),
    "proxynca_scale": (lambda C, D: ProxyNCALoss(C, D, softmax_scale=3.), lambda C, D: pml_losses.ProxyNCALoss(C, D, softmax_scale=3.)),
    "proxyanchor": (lambda C, D: ProxyAnchorLoss(C, D, margin=0.1, alpha=32), lambda C, D: pml_losses.ProxyAnchorLoss(C, D, margin=0.1, alpha=32)),
    "normsoftmax": (lambda C, D: NormSoftmaxLoss(C, D, temperature=0.05), lambda C, D: pml_losses.NormalizedSoftmaxLoss(C, D, temperature=0.05)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("row", list(PROXY_ROWS))
def test_proxy_losses_match_pml_with_same_proxies(row, batch, dtype):
    raw, labels = make_batch(*batch, dtype, seed=7)
    n_cls, dim = batch[1] + 3, raw.shape[1]  # some proxies without images in the batch
    ours, pml = (f(n_cls, dim).to(dtype) for f in PROXY_ROWS[row])
    theirs = pml.proxies if hasattr(pml, "proxies") else pml.W
    with torch.no_grad(): theirs.copy_(ours.proxies if theirs.shape == ours.proxies.shape else ours.proxies.T)
    assert_same(ours, pml, raw, labels, params=((ours.proxies,), (theirs,)))


# The seed papers' forms, against brute force.
def brute_triplets(labels):
    B = len(labels)
    return [(a, p, n) for a, p, n in itertools.product(range(B), repeat=3)
            if a != p and labels[a] == labels[p] and labels[n] != labels[a]]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_triplet_squared_mean_is_facenet_form(dtype):
    raw, labels = make_batch(12, 3, False, dtype, seed=2)
    x = F.normalize(raw, dim=1)
    sq = lambda i, j: (x[i] - x[j]).pow(2).sum()
    ref = torch.stack([F.relu(sq(a, p) - sq(a, n) + 0.2) for a, p, n in brute_triplets(labels)]).mean()
    got = TripletLoss(margin=0.2, squared=True, reduction="mean")(x, labels)
    assert abs(float(got.detach() - ref.detach())) < TOL[dtype]
    g1, = torch.autograd.grad(got, raw, retain_graph=True)
    g2, = torch.autograd.grad(ref, raw)
    assert (g1 - g2).abs().max() < TOL[dtype]


def test_contrastive_squared_is_hadsell_form():
    raw, labels = make_batch(10, 3, False, torch.float64, seed=4)
    x = F.normalize(raw, dim=1)
    d = lambda i, j: (x[i] - x[j]).pow(2).sum().sqrt()
    B = len(labels)
    pos = [F.relu(d(i, j)) ** 2 / 2 for i in range(B) for j in range(B) if i != j and labels[i] == labels[j]]
    neg = [F.relu(1.0 - d(i, j)) ** 2 / 2 for i in range(B) for j in range(B) if labels[i] != labels[j]]
    ref = sum(pos) / len(pos) + sum(neg) / len(neg)
    got = ContrastiveLoss(0., 1., squared=True, reduction="mean")(x, labels)
    assert abs(float(got.detach() - ref.detach())) < 1e-10


def test_proxynca_exclude_positive_is_paper_form():
    raw, labels = make_batch(12, 4, True, torch.float64, seed=1)
    loss = ProxyNCALoss(6, 16, exclude_positive=True).double()
    x, P = F.normalize(raw, dim=1), F.normalize(loss.proxies, dim=1)
    ref = torch.stack([-torch.log(torch.exp(-(x[i] - P[labels[i]]).pow(2).sum()) /
                                  sum(torch.exp(-(x[i] - P[z]).pow(2).sum()) for z in range(6) if z != labels[i]))
                       for i in range(12)]).mean()
    assert abs(float(loss(x, labels).detach() - ref.detach())) < 1e-10


# Reductions, weights and the per-tuple output.
def test_reduction_none_returns_per_triplet_losses_and_indices():
    raw, labels = make_batch(16, 4, True, torch.float64, seed=0)
    x = F.normalize(raw.detach(), dim=1)  # values only: no graph
    out = TripletLoss(0.3, reduction="none")(x, labels)
    assert isinstance(out, LossOutput)
    a, p, n = out.indices_tuple
    assert len(a) == len(brute_triplets(labels)) == len(out.losses)
    d = torch.cdist(x, x)
    assert torch.allclose(out.losses, F.relu(d[a, p] - d[a, n] + 0.3), atol=1e-10)
    assert abs(float(reduce_losses(out, "mean_nonzero") - TripletLoss(0.3)(x, labels))) < 1e-12


@pytest.mark.parametrize("name", ["triplet", "contrastive", "margin", "lifted", "angular", "multisimilarity", "npair"])
def test_weights_give_weighted_mean(name):
    raw, labels = make_batch(16, 4, True, torch.float64, seed=9)
    x = F.normalize(raw.detach(), dim=1)  # values only: no graph
    tup = SemiHardMiner(0.5)(x, labels)
    out = LOSSES.get(name)(reduction="none")(x, labels, tup)
    w = torch.rand(len(out.losses), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    sizes = out.groups or (len(out.losses),)
    ref = sum((wi * li).sum() / wi.sum() for wi, li in zip(w.split(sizes), out.losses.split(sizes)))
    got = LOSSES.get(name)(reduction="mean")(x, labels, tup, weights=w)
    assert abs(float(got - ref)) < 1e-10
    ones = LOSSES.get(name)(reduction="mean")(x, labels, tup, weights=torch.ones_like(w))
    assert abs(float(ones - LOSSES.get(name)(reduction="mean")(x, labels, tup))) < 1e-12
    with pytest.raises(ValueError, match="one entry per tuple"):
        LOSSES.get(name)()(x, labels, tup, weights=torch.ones(len(w) + 1, dtype=torch.float64))


def test_triplet_accepts_any_explicit_triplets():
    raw, labels = make_batch(8, 2, True, torch.float64, seed=0)
    x = F.normalize(raw.detach(), dim=1)  # values only: no graph
    tup = (torch.tensor([0, 0, 5]), torch.tensor([3, 3, 1]), torch.tensor([2, 7, 0]))  # repeats and any labels
    d = torch.cdist(x, x)
    ref = F.relu(d[tup[0], tup[1]] - d[tup[0], tup[2]] + 0.4).sum()
    assert abs(float(TripletLoss(0.4, reduction="sum")(x, labels, tup) - ref)) < 1e-12


def test_bad_inputs_fail_clearly():
    x, labels = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    with pytest.raises(ValueError, match="unknown reduction"): TripletLoss(reduction="avg")
    with pytest.raises(ValueError, match="6 embeddings but 5 labels"): TripletLoss()(x, labels[:5])
    with pytest.raises(ValueError, match="outside"): TripletLoss()(x, labels, (torch.tensor([9]),) * 3)
    with pytest.raises(ValueError, match="labels must be in"): ProxyNCALoss(2, 4)(x, labels)
    with pytest.raises(ValueError, match="dimension 4, the proxies 8"): NormSoftmaxLoss(3, 8)(x, labels)


def test_registry_names_and_proxy_flag():
    names = ["contrastive", "triplet", "margin", "npair", "lifted", "angular", "multisimilarity",
             "proxynca", "proxyanchor", "normsoftmax"]
    for name in names:
        cls = LOSSES.get(name)
        assert issubclass(cls, BaseLoss)
        assert cls.uses_proxies == (name in ("proxynca", "proxyanchor", "normsoftmax"))
    assert LOSSES.get("proxyanchor")(5, 8).proxies.shape == (5, 8)


# Edge cases: finite values and gradients, no NaN.
def all_losses():
    return [TripletLoss(), TripletLoss(squared=True), ContrastiveLoss(), ContrastiveLoss(squared=True), MarginLoss(),
            NPairLoss(), LiftedStructureLoss(), AngularLoss(), MultiSimilarityLoss(), MultiSimilarityLoss(epsilon=0.1),
            ProxyNCALoss(4, 6), ProxyAnchorLoss(4, 6), NormSoftmaxLoss(4, 6)]


def edge_batches():
    g = torch.Generator().manual_seed(0)
    x = F.normalize(torch.randn(8, 6, generator=g, dtype=torch.float64), dim=1)
    return {
        "one_class": (x, torch.zeros(8, dtype=torch.long)),
        "single_image_class": (x, torch.tensor([0, 0, 0, 1, 1, 1, 2, 3])),
        "all_singletons": (x[:4], torch.arange(4)),
        "duplicates": (torch.cat([x[:3], x[:3]]), torch.tensor([0, 1, 2, 0, 1, 2])),
        "zero_vectors": (torch.cat([x[:4], torch.zeros(4, 6, dtype=torch.float64)]), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])),
        "one_image": (x[:1], torch.tensor([0])),
    }


@pytest.mark.parametrize("case", list(edge_batches()))
def test_edge_cases_are_finite(case):
    x, labels = edge_batches()[case]
    x = x.clone().requires_grad_()
    for loss in all_losses():
        loss = loss.double()
        v = loss(x, labels)
        g, = torch.autograd.grad(v, x)
        assert torch.isfinite(v) and torch.isfinite(g).all(), (case, type(loss).__name__)


def test_no_valid_tuple_gives_exact_zero():
    x = F.normalize(torch.randn(5, 6, dtype=torch.float64), dim=1).requires_grad_()
    for loss in (TripletLoss(), ContrastiveLoss(neg_margin=0.), MarginLoss(), NPairLoss(), LiftedStructureLoss(), AngularLoss()):
        assert loss(x, torch.zeros(5, dtype=torch.long) if not isinstance(loss, ContrastiveLoss) else torch.arange(5)).item() == 0.
    empty = (torch.zeros(0, dtype=torch.long),) * 3
    v = TripletLoss()(x, torch.tensor([0, 0, 1, 1, 2]), empty)
    assert v.item() == 0. and v.requires_grad


# pytorch-metric-learning's convention: the losses normalise inside (normalize=True, the default), so raw,
# unnormalised embeddings give PML's values and gradients; normalize=False computes on the vectors as given.
def raw_value_and_grad(loss_fn, raw, labels, *args, params=()):
    "Loss on the raw batch (no normalisation by the caller); gradients with respect to it (and `params`)."
    v = loss_fn(raw, labels, *args)
    return v.detach(), torch.autograd.grad(v, [raw, *params])


def assert_same_raw(ours, pml, raw, labels, *args, params=((), ())):
    v1, g1 = raw_value_and_grad(ours, raw, labels, *args, params=params[0])
    v2, g2 = raw_value_and_grad(pml, raw, labels, *args, params=params[1])
    tol = TOL[raw.dtype]
    assert torch.isfinite(v1) and abs((v1 - v2).item()) <= tol * max(1, abs(v2.item())), (v1.item(), v2.item())
    for a, b in zip(g1, g2):
        b = b.reshape(a.shape) if a.shape == b.shape else b.T
        assert (a - b).abs().max() <= tol, float((a - b).abs().max())


def scaled_batch(B, C, balanced, dtype, seed, dim=16):
    "A batch whose rows have norms between 0.3 and 8, far from the unit sphere."
    raw, labels = make_batch(B, C, balanced, dtype, seed, dim)
    g = torch.Generator().manual_seed(seed + 1)
    scale = (0.3 + 7.7 * torch.rand(B, 1, generator=g)).to(dtype)
    return (raw.detach() * scale).requires_grad_(), labels


def test_issue_example_triplet_on_raw_embeddings():
    raw, labels = scaled_batch(32, 8, True, torch.float64, seed=0)
    ours, pml = TripletLoss(margin=0.2)(raw, labels), pml_losses.TripletMarginLoss(margin=0.2)(raw, labels)
    assert abs(float((ours - pml).detach())) < 1e-10
    d = torch.cdist(raw, raw)  # the raw distances: what normalize=False measures, brute force
    ref = torch.stack([F.relu(d[a, p] - d[a, n] + 0.2) for a, p, n in brute_triplets(labels)])
    got = TripletLoss(margin=0.2, normalize=False, reduction="sum")(raw, labels)
    assert abs((got - ref.sum()).item()) < 1e-8 and abs((got - ours * (ref > 0).sum()).item()) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch", BATCHES[:3])
@pytest.mark.parametrize("row", [r for r in PAIR_ROWS if r != "angular"])
def test_pair_losses_match_pml_on_raw_embeddings(row, batch, dtype):
    ours, pml = PAIR_ROWS[row]
    raw, labels = scaled_batch(*batch, dtype, seed=len(row) * 10 + batch[0])
    assert_same_raw(ours(), pml(), raw, labels)
    raw2, labels2 = scaled_batch(32, 8, True, dtype, seed=4)
    tup = SemiHardMiner(0.3)(raw2, labels2)  # mined on the raw batch too: the miner normalises as well
    assert len(tup[0]) > 0
    assert_same_raw(ours(), pml(), raw2, labels2, tup)


@pytest.mark.parametrize("n_classes", [2, 8])
def test_npair_matches_pml_on_raw_embeddings(n_classes):
    raw, labels = scaled_batch(2 * n_classes, n_classes, True, torch.float64, seed=n_classes)
    assert_same_raw(NPairLoss(), pml_losses.NPairsLoss(), raw, labels)
    with pytest.raises(ValueError, match="pass normalize=False"): NPairLoss(l2_reg=0.1)


@pytest.mark.parametrize("row", list(PROXY_ROWS))
def test_proxy_losses_match_pml_on_raw_embeddings(row):
    raw, labels = scaled_batch(32, 8, True, torch.float64, seed=13)
    n_cls, dim = 11, raw.shape[1]
    ours, pml = (f(n_cls, dim).double() for f in PROXY_ROWS[row])
    theirs = pml.proxies if hasattr(pml, "proxies") else pml.W
    with torch.no_grad(): theirs.copy_(ours.proxies if theirs.shape == ours.proxies.shape else ours.proxies.T)
    assert_same_raw(ours, pml, raw, labels, params=((ours.proxies,), (theirs,)))


@pytest.mark.parametrize("name", ["triplet", "contrastive", "margin", "lifted", "npair", "multisimilarity", "angular"])
def test_normalize_false_is_the_old_raw_computation(name):
    raw, labels = scaled_batch(16, 4, True, torch.float64, seed=21)
    unit = F.normalize(raw.detach(), dim=1)
    # on unit vectors the flag changes nothing beyond rounding (methods whose heads normalise are unaffected)
    assert abs((LOSSES.get(name)()(unit, labels) - LOSSES.get(name)(normalize=False)(unit, labels)).item()) < 1e-12
    # on raw vectors, normalize=True is exactly "normalise, then the raw computation"
    v1 = LOSSES.get(name)()(raw, labels)
    v2 = LOSSES.get(name)(normalize=False)(F.normalize(raw, dim=1), labels)
    assert abs((v1 - v2).item()) < 1e-12


def test_angular_on_raw_embeddings_normalises_all_three():
    # PML's AngularLoss normalises anchors and positives but multiplies by the raw negatives; eq. (8) lives on the
    # unit sphere, so ours normalises all three: on a raw batch it is PML's value on the normalised batch.
    raw, labels = scaled_batch(24, 6, True, torch.float64, seed=5)
    assert_same_raw(lambda e, l: AngularLoss(alpha=40)(e, l),
                    lambda e, l: pml_losses.AngularLoss(alpha=40)(F.normalize(e, dim=1), l), raw, labels)
    assert abs((AngularLoss(alpha=40)(raw, labels) - pml_losses.AngularLoss(alpha=40)(raw, labels)).item()) > 1e-3


# A reference set (PML's ref_emb, ref_labels): anchors from the batch, positives and negatives from the reference set.
REF_ROWS = ["triplet", "triplet_m05", "contrastive", "margin", "multisimilarity"]


def make_reference(R, C, dtype, seed, dim=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(R, dim, generator=g, dtype=dtype, requires_grad=True), torch.randint(0, C, (R,), generator=g)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("row", REF_ROWS)
def test_losses_with_ref_emb_match_pml(row, dtype):
    ours, pml = PAIR_ROWS[row]
    raw, labels = make_batch(24, 6, True, dtype, seed=7)
    ref, ref_labels = make_reference(20, 6, dtype, seed=8)
    for tuples in (None, "semihard", "pml_pairs"):
        t = {None: lambda: None,
             "semihard": lambda: SemiHardMiner(0.3)(raw.detach(), labels, ref.detach(), ref_labels),
             "pml_pairs": lambda: pml_miners.MultiSimilarityMiner(0.1)(raw.detach(), labels, ref.detach(), ref_labels)}[tuples]()
        vals, grads = [], []
        for fn in (ours(), pml()):
            v = fn(F.normalize(raw, dim=1), labels, t, F.normalize(ref, dim=1), ref_labels)
            vals.append(v.item()); grads.append(torch.autograd.grad(v, [raw, ref]))
        assert abs(vals[0] - vals[1]) <= TOL[dtype] * max(1, abs(vals[1])), (tuples, vals)
        for a, b in zip(*grads): assert (a - b).abs().max() <= TOL[dtype], (tuples, float((a - b).abs().max()))


def test_ref_emb_reduction_none_indexes_the_reference_set():
    raw, labels = make_batch(8, 2, True, torch.float64, seed=1)
    ref, ref_labels = make_reference(6, 2, torch.float64, seed=2)
    out = TripletLoss(reduction="none")(raw, labels, None, ref, ref_labels)
    a, p, n = out.indices_tuple
    assert a.max() < 8 and p.max() < 6 and n.max() < 6
    assert (labels[a] == ref_labels[p]).all() and (labels[a] != ref_labels[n]).all()
    brute = [(i, j, k) for i in range(8) for j in range(6) for k in range(6) if labels[i] == ref_labels[j] != ref_labels[k]]
    assert sorted(zip(a.tolist(), p.tolist(), n.tolist())) == brute   # every (row, ref, ref) triplet, the 'diagonal' too


@pytest.mark.parametrize("name", ["lifted", "angular", "npair", "proxyanchor"])
def test_losses_without_ref_support_refuse_it_in_one_line(name):
    raw, labels = make_batch(8, 2, True, torch.float64, seed=1)
    ref, ref_labels = make_reference(6, 2, torch.float64, seed=2)
    loss = LOSSES.get(name)(num_classes=2, embedding_size=16) if LOSSES.get(name).uses_proxies else LOSSES.get(name)()
    with pytest.raises(ValueError, match="takes no ref_emb"): loss(raw, labels, None, ref, ref_labels)


def test_weights_are_keyword_only():
    raw, labels = make_batch(8, 2, True, torch.float64, seed=1)
    with pytest.raises(ValueError, match="weights is keyword-only"): TripletLoss()(raw, labels, None, torch.ones(3))   # 4th: ref_emb, as in PML
    with pytest.raises(ValueError, match="together"): TripletLoss()(raw, labels, None, raw)


# A batch a loss cannot use: PML's value (0; NaN for two proxy losses on an empty batch, where ours give 0), said once.
PML_OF = {TripletLoss: lambda: pml_losses.TripletMarginLoss(margin=0.2), ContrastiveLoss: pml_losses.ContrastiveLoss,
          MarginLoss: lambda: pml_losses.MarginLoss(nu=0), NPairLoss: pml_losses.NPairsLoss,
          LiftedStructureLoss: lambda: pml_losses.LiftedStructureLoss(neg_margin=1), AngularLoss: pml_losses.AngularLoss,
          MultiSimilarityLoss: pml_losses.MultiSimilarityLoss, ProxyNCALoss: lambda: pml_losses.ProxyNCALoss(4, 6),
          ProxyAnchorLoss: lambda: pml_losses.ProxyAnchorLoss(4, 6), NormSoftmaxLoss: lambda: pml_losses.NormalizedSoftmaxLoss(4, 6)}


def unusable_batches():
    x = F.normalize(torch.randn(8, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64), dim=1)
    return {"empty": (x[:0], torch.zeros(0, dtype=torch.long)), "one_image": (x[:1], torch.tensor([0])),
            "singletons": (x[:4], torch.arange(4)), "one_class": (x, torch.zeros(8, dtype=torch.long)),
            "one_paired_class": (x[:3], torch.tensor([0, 0, 1]))}


@pytest.mark.parametrize("case", list(unusable_batches()))
@pytest.mark.parametrize("cls", list(PML_OF), ids=lambda c: c.__name__)
def test_unusable_batch_gives_pml_value_and_is_said_once(cls, case):
    import warnings
    from dml_book.losses.base import UnusableBatchWarning
    x, labels = unusable_batches()[case]
    ours = (cls(4, 6) if cls.uses_proxies else cls()).double()
    pml = PML_OF[cls]().double()
    if cls.uses_proxies:
        with torch.no_grad():
            theirs = pml.proxies if hasattr(pml, "proxies") else pml.W
            theirs.copy_(ours.proxies if theirs.shape == ours.proxies.shape else ours.proxies.T)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        v = ours(x, labels); ours(x, labels)
    said = [w for w in said if issubclass(w.category, UnusableBatchWarning)]
    p = pml(x, labels)
    if said:   # the loss could not use the batch: PML's 0 (or NaN, where ours is 0), said once
        assert len(said) == 1 and cls.__name__ in str(said[0].message) and "\n" not in str(said[0].message)
        assert v.item() == 0. and (p.item() == 0. or (math.isnan(p.item()) and case == "empty" and cls.uses_proxies)), (v, p)
    else:      # a batch it can use: PML's value, no word
        assert abs(v.item() - p.item()) < 1e-9, (v, p)


def test_npair_on_singletons_is_said():
    import warnings
    from dml_book.losses.base import UnusableBatchWarning
    x = F.normalize(torch.randn(4, 6, dtype=torch.float64), dim=1)
    with pytest.warns(UnusableBatchWarning, match="NPairLoss: no class has two embeddings \\(4 singletons\\)"):
        assert NPairLoss()(x, torch.arange(4)).item() == pml_losses.NPairsLoss()(x, torch.arange(4)).item() == 0.
    empty = (torch.zeros(0, dtype=torch.long),) * 3
    with pytest.warns(UnusableBatchWarning, match="TripletLoss: the indices_tuple holds no tuple"):
        TripletLoss()(x, torch.tensor([0, 0, 1, 1]), empty)


@pytest.mark.parametrize("build,says", [(lambda: TripletLoss(margin="0.2"), "TripletLoss: margin='0.2' is not a number"),
                                        (lambda: TripletLoss(margin=True), "TripletLoss: margin=True is not a number"),
                                        (lambda: ProxyAnchorLoss(4.5, 8), "ProxyAnchorLoss: num_classes=4.5 is not a whole number"),
                                        (lambda: MultiSimilarityLoss(epsilon="0.1"), "epsilon='0.1' is not a number or None"),
                                        (lambda: AngularLoss(normalize="no"), "AngularLoss: normalize='no' is not true or false"),
                                        (lambda: BatchHardMiner(normalize=1), "BatchHardMiner: normalize=1 is not true or false"),
                                        (lambda: SemiHardMiner(margin=[0.2]), "SemiHardMiner: margin=[0.2] is not a number")])
def test_a_constructor_argument_of_the_wrong_kind_is_one_line(build, says):
    "A loss or miner given a number of the wrong kind refuses it at construction, not with a TypeError inside the first batch."
    with pytest.raises(ValueError) as e: build()
    assert says in str(e.value) and "\n" not in str(e.value)
    import numpy as np
    assert TripletLoss(margin=np.float64(0.3)).margin == 0.3 and ProxyAnchorLoss(np.int64(4), 8).proxies.shape == (4, 8)   # numpy's numbers are numbers
