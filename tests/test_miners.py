"Miners against pytorch-metric-learning (exact tuples, or the sampling distribution) and brute-force loops."
import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning import miners as pml_miners

from dml_book.registry import MINERS
from dml_book.miners import Miner, SemiHardMiner, BatchHardMiner, DistanceWeightedMiner, RandomTripletMiner

BATCHES = [(12, 4, True), (32, 8, True), (40, 5, False), (64, 16, True), (48, 40, False)]


def make_batch(B, C, balanced, dtype=torch.float64, seed=0, dim=16):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(B, dim, generator=g, dtype=dtype), dim=1)
    if balanced: labels = torch.arange(C).repeat_interleave(B // C)[torch.randperm(B, generator=g)]
    else: labels = torch.randint(0, C, (B,), generator=g)
    return x, labels


def assert_same_tuples(t1, t2):
    assert len(t1) == len(t2)
    for a, b in zip(t1, t2): assert torch.equal(a, b.to(a.dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("margin", [0.05, 0.2, 0.5])
@pytest.mark.parametrize("batch", BATCHES)
def test_semihard_equals_pml_triplet_margin_miner(batch, margin, dtype):
    x, labels = make_batch(*batch, dtype=dtype, seed=batch[0])
    ours = SemiHardMiner(margin=margin)(x, labels)
    theirs = pml_miners.TripletMarginMiner(margin=margin, type_of_triplets="semihard")(x, labels)
    if dtype == torch.float32:  # a triplet exactly on the band's edge may flip with rounding: compare as sets
        s1, s2 = set(zip(*(t.tolist() for t in ours))), set(zip(*(t.tolist() for t in theirs)))
        assert len(s1 ^ s2) <= max(1, len(s2) // 1000)
    else: assert_same_tuples(ours, theirs)
    d = torch.cdist(x, x)
    a, p, n = ours
    m = d[a, n] - d[a, p]
    assert ((m > -1e-5) & (m <= margin + 1e-5)).all() and (labels[a] == labels[p]).all() and (labels[a] != labels[n]).all()


def test_semihard_closest_negative_is_facenet_choice():
    x, labels = make_batch(24, 4, True, seed=1)
    d = torch.cdist(x, x)
    expect = []
    for a in range(24):
        for p in range(24):
            if a == p or labels[a] != labels[p]: continue
            band = [n for n in range(24) if labels[n] != labels[a] and 0 < d[a, n] - d[a, p] <= 0.3]
            if band: expect.append((a, p, min(band, key=lambda n: d[a, n])))
    got = SemiHardMiner(0.3, closest_negative=True)(x, labels)
    assert list(zip(*(t.tolist() for t in got))) == expect
    full = set(zip(*(t.tolist() for t in SemiHardMiner(0.3)(x, labels))))
    assert set(expect) <= full


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch", BATCHES)
def test_batchhard_equals_pml(batch, dtype):
    x, labels = make_batch(*batch, dtype=dtype, seed=batch[0] + 1)
    assert_same_tuples(BatchHardMiner()(x, labels), pml_miners.BatchHardMiner()(x, labels))


def test_batchhard_brute_force_and_singletons():
    x, labels = make_batch(20, 6, False, seed=3)
    d = torch.cdist(x, x)
    a, p, n = BatchHardMiner()(x, labels)
    for ai, pi, ni in zip(a.tolist(), p.tolist(), n.tolist()):
        pos = [j for j in range(20) if j != ai and labels[j] == labels[ai]]
        neg = [j for j in range(20) if labels[j] != labels[ai]]
        assert d[ai, pi] == max(d[ai, j] for j in pos) and d[ai, ni] == min(d[ai, j] for j in neg)
    has_pos = [(labels == labels[i]).sum() > 1 for i in range(20)]
    assert a.tolist() == [i for i in range(20) if has_pos[i]]


def empirical(miner, x, labels, draws, seed):
    "Frequencies of (anchor, negative) per anchor row, and of (anchor, positive), over many draws."
    torch.manual_seed(seed)
    B = len(labels)
    an, ap = torch.zeros(B, B, dtype=torch.float64), torch.zeros(B, B, dtype=torch.float64)
    for _ in range(draws):
        a, p, n = miner(x, labels)
        an.index_put_((a, n), torch.ones(len(a), dtype=torch.float64), accumulate=True)
        ap.index_put_((a, p), torch.ones(len(a), dtype=torch.float64), accumulate=True)
    norm = lambda c: c / c.sum(1, keepdim=True).clamp_min(1)
    return norm(an), norm(ap)


@pytest.mark.parametrize("dim,cutoff,nz", [(4, 0.5, 1.4), (8, 0.3, 1.7)])
def test_distance_weighted_same_distribution_as_pml(dim, cutoff, nz):
    x, labels = make_batch(16, 4, True, seed=dim, dim=dim)
    ours = DistanceWeightedMiner(cutoff=cutoff, nonzero_loss_cutoff=nz)
    pml = pml_miners.DistanceWeightedMiner(cutoff=cutoff, nonzero_loss_cutoff=nz)
    exact = ours.probabilities(x, labels)
    an1, ap1 = empirical(ours, x, labels, 300, seed=0)
    an2, ap2 = empirical(pml, x, labels, 300, seed=1)
    rows = exact.sum(1) > 0
    # both samplers follow the exact per-anchor distribution of negatives (>= 1200 draws per anchor: 5 sigma < 0.07)
    assert (an1[rows] - exact[rows]).abs().max() < 0.07
    assert (an2[rows] - exact[rows]).abs().max() < 0.07
    assert (an1 - an2).abs().max() < 0.08
    # positives are uniform over the anchor's class in both
    same = (labels[:, None] == labels[None]) & ~torch.eye(16, dtype=torch.bool)
    uniform = same.double() / same.sum(1, keepdim=True)
    assert (ap1[rows] - uniform[rows]).abs().max() < 1e-12 and (ap2[rows] - uniform[rows]).abs().max() < 0.07
    # the weights follow 1/q(d) of Wu et al. Sec. 4, clipped at cutoff, zero at and beyond nz
    d = torch.cdist(x, x).clamp_min(cutoff)
    w = d ** (2 - dim) * (1 - d ** 2 / 4) ** (-(dim - 3) / 2) * (labels[:, None] != labels[None]) * (d < nz)
    assert torch.allclose(exact, w / w.sum(1, keepdim=True).clamp_min(1e-300), atol=1e-10)


def test_distance_weighted_edge_cases():
    x, labels = make_batch(8, 2, True, seed=0)
    assert all(len(t) == 0 for t in DistanceWeightedMiner()(x, torch.zeros(8, dtype=torch.long)))
    assert all(len(t) == 0 for t in DistanceWeightedMiner()(x, torch.arange(8)))
    far = DistanceWeightedMiner(nonzero_loss_cutoff=0.)  # every negative is cut off
    assert all(len(t) == 0 for t in far(x, labels))
    dup = torch.cat([x[:4], x[:4]])
    a, p, n = DistanceWeightedMiner()(dup, torch.tensor([0, 0, 1, 1, 0, 0, 1, 1]))
    assert (torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])[a] != torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])[n]).all()


def test_miners_edge_cases_and_errors():
    x, labels = make_batch(8, 2, True, seed=0)
    for miner in (SemiHardMiner(), BatchHardMiner(), DistanceWeightedMiner()):
        for lab in (torch.zeros(8, dtype=torch.long), torch.arange(8)):
            out = miner(x, lab)
            assert len(out) == 3 and all(len(t) == 0 and t.dtype == torch.long for t in out)
        z = torch.zeros(8, 16, dtype=torch.float64)
        assert all(torch.isfinite(t.double()).all() for t in miner(z, labels))
        with pytest.raises(ValueError, match="8 embeddings but 3 labels"): miner(x, labels[:3])


def test_registry_names():
    for name, cls in [("semihard", SemiHardMiner), ("batchhard", BatchHardMiner), ("distance_weighted", DistanceWeightedMiner)]:
        assert MINERS.get(name) is cls and issubclass(cls, Miner)


def test_miner_then_loss_backward():
    from dml_book.losses import TripletLoss, MarginLoss
    raw = torch.randn(32, 16, requires_grad=True)
    labels = torch.arange(8).repeat_interleave(4)
    for miner, loss in [(SemiHardMiner(0.2), TripletLoss(0.2)), (BatchHardMiner(), TripletLoss(0.2)),
                        (DistanceWeightedMiner(), MarginLoss())]:
        emb = F.normalize(raw, dim=1)
        v = loss(emb, labels, miner(emb, labels))
        v.backward()
        assert torch.isfinite(raw.grad).all()
        raw.grad = None


def scaled(x, seed):
    g = torch.Generator().manual_seed(seed)
    return x * (0.3 + 7.7 * torch.rand(len(x), 1, generator=g, dtype=x.dtype))


@pytest.mark.parametrize("batch", BATCHES[:4])
def test_miners_match_pml_on_raw_embeddings(batch):
    "PML's miners measure normalised embeddings by default; ours too, so raw inputs give the same tuples."
    x, labels = make_batch(*batch, seed=batch[0] + 7)
    raw = scaled(x, batch[0])
    assert_same_tuples(SemiHardMiner(margin=0.2)(raw, labels),
                       pml_miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard")(raw, labels))
    assert_same_tuples(BatchHardMiner()(raw, labels), pml_miners.BatchHardMiner()(raw, labels))
    assert_same_tuples(SemiHardMiner(margin=0.2)(raw, labels), SemiHardMiner(margin=0.2)(x, labels))


def test_miners_normalize_false_measure_raw_distances():
    x, labels = make_batch(20, 5, True, seed=2)
    raw = scaled(x, 3)
    d = torch.cdist(raw, raw)
    a, p, n = BatchHardMiner(normalize=False)(raw, labels)
    for ai, pi, ni in zip(a.tolist(), p.tolist(), n.tolist()):
        assert d[ai, pi] == max(d[ai, j] for j in range(20) if j != ai and labels[j] == labels[ai])
        assert d[ai, ni] == min(d[ai, j] for j in range(20) if labels[j] != labels[ai])
    assert not all(torch.equal(u, v) for u, v in zip(BatchHardMiner(normalize=False)(raw, labels), BatchHardMiner()(raw, labels)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_miners_with_ref_emb_equal_pml(seed):
    "PML's ref_emb: anchors from the batch, positives and negatives from the reference set (no diagonal to skip)."
    g = torch.Generator().manual_seed(seed)
    x, labels = torch.randn(20, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (20,), generator=g)
    ref, ref_labels = torch.randn(16, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (16,), generator=g)
    assert_same_tuples(SemiHardMiner(0.3)(x, labels, ref, ref_labels),
                       pml_miners.TripletMarginMiner(margin=0.3, type_of_triplets="semihard")(x, labels, ref, ref_labels))
    assert_same_tuples(BatchHardMiner()(x, labels, ref, ref_labels), pml_miners.BatchHardMiner()(x, labels, ref, ref_labels))
    a, p, n = DistanceWeightedMiner()(x, labels, ref, ref_labels)
    assert (labels[a] == ref_labels[p]).all() and (labels[a] != ref_labels[n]).all() and p.max() < 16
    pos = (labels[:, None] == ref_labels[None]).sum()
    assert len(a) <= pos and len(a) > 0
    with pytest.raises(ValueError, match="dimension"): BatchHardMiner()(x, labels, ref[:, :4], ref_labels)


def test_degenerate_batches_give_pmls_empty_result_and_are_said_once():
    import warnings
    from pytorch_metric_learning import miners as pml_miners
    from dml_book.losses.base import UnusableBatchWarning
    x = F.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64), dim=1)
    batches = {"empty": (x[:0], torch.zeros(0, dtype=torch.long)), "singletons": (x, torch.arange(6)),
               "one_class": (x, torch.zeros(6, dtype=torch.long)), "one_image": (x[:1], torch.tensor([3]))}
    peers = {BatchHardMiner: pml_miners.BatchHardMiner, DistanceWeightedMiner: pml_miners.DistanceWeightedMiner,
             SemiHardMiner: lambda: pml_miners.TripletMarginMiner(0.2, type_of_triplets="semihard"),
             RandomTripletMiner: lambda: pml_miners.TripletMarginMiner(10., type_of_triplets="all")}
    for cls, peer in peers.items():
        miner = cls()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            for case, (e, l) in batches.items():
                ours = miner(e, l)
                assert [len(t) for t in ours] == [0, 0, 0] and all(t.dtype == torch.long for t in ours), (cls, case)
                if case != "empty": assert [len(t) for t in peer()(e, l)] == [0, 0, 0]   # PML's (its batch-hard: IndexError on empty)
        said = [str(w.message) for w in said if issubclass(w.category, UnusableBatchWarning)]
        assert said == [f"{cls.__name__}: the batch is empty; it mines no triplet, as in pytorch-metric-learning (said once per object)"], said
    with pytest.warns(UnusableBatchWarning, match="BatchHardMiner: the batch holds one class: no negative"):
        BatchHardMiner()(x, torch.zeros(6, dtype=torch.long))
