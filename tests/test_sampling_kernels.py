"""Distance-weighted and semi-hard sampling have one implementation, in `dml_book.miners`
(`distance_log_weights`, `semihard_band`), which the miners and PADS's static distributions share.
These tests pin that the shared code behaves exactly as the two copies it replaced did (the old code is kept here,
verbatim, as the reference)."""
import math
import pytest
import torch
import torch.nn.functional as F
from dml_book.distances import euclidean, squared_euclidean, pair_masks
from dml_book.miners import DistanceWeightedMiner, SemiHardMiner, distance_log_weights, semihard_band
from dml_book.methods.pads import DistanceWeighted, SemiHard, DistributionSampler, init_probs, BinnedDistribution, sample_triplets

# ---------------------------------------------------------------- the two copies before the merge, verbatim
def old_miner_probabilities(embeddings, labels, cutoff=0.5, nonzero_loss_cutoff=1.4):
    n = embeddings.shape[1]
    d = euclidean(F.normalize(embeddings, dim=1)).clamp_min(cutoff)
    logw = (2.0 - n) * d.log() - (n - 3) / 2 * torch.log1p(-0.25 * d ** 2)
    ok = pair_masks(labels)[1] & (d < nonzero_loss_cutoff) & torch.isfinite(logw)
    logw = logw.masked_fill(~ok, -math.inf)
    return torch.softmax(logw, 1).nan_to_num(0.)

def old_pads_distance_weighted(d_an, dim, cutoff=0.5, nonzero_loss_cutoff=1.4):
    d = d_an.double().clamp_min(cutoff)
    log_w = -(dim - 2) * d.log() - (dim - 3) / 2 * (1 - d**2 / 4).clamp_min(1e-8).log()
    keep = d_an < nonzero_loss_cutoff
    log_w = log_w.masked_fill(~keep, -math.inf)
    w = (log_w - log_w.max(-1, keepdim=True).values.clamp_min(-1e30)).exp()
    return torch.where(keep, w, torch.zeros_like(w)).to(d_an.dtype)

def old_miner_band(d_an, d_ap, margin):
    m = d_an - d_ap
    return (m > 0) & (m <= margin)

def old_pads_semihard(d_an, d_ap, margin):
    return ((d_an > d_ap) & (d_an < d_ap + margin)).to(d_an.dtype)

def batch(n=24, dim=16, classes=6, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (F.normalize(torch.randn(n, dim, generator=g, dtype=dtype), dim=1),
            torch.arange(classes).repeat_interleave(n // classes))

# ---------------------------------------------------------------- distance-weighted
@pytest.mark.parametrize("dim", [3, 4, 16, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_miner_probabilities_unchanged(dim, dtype):
    for seed in range(3):
        x, y = batch(dim=dim, seed=seed, dtype=dtype)
        for cutoff, nz in [(0.5, 1.4), (0.2, 2.0), (0.5, math.inf), (0.5, 0.0)]:
            new = DistanceWeightedMiner(cutoff, nz).probabilities(x, y)
            assert torch.equal(new, old_miner_probabilities(x, y, cutoff, nz)), (dim, dtype, cutoff, nz)

@pytest.mark.parametrize("dim", [4, 16, 128])
def test_pads_distance_weights_unchanged(dim):
    for seed in range(3):
        x, _ = batch(dim=dim, seed=seed, dtype=torch.float64)
        d = euclidean(x)
        for cutoff, nz in [(0.5, 1.4), (0.3, 1.9)]:
            torch.testing.assert_close(DistanceWeighted(dim, cutoff, nz)(d), old_pads_distance_weighted(d, dim, cutoff, nz),
                                       rtol=1e-12, atol=0)
    c = BinnedDistribution().centers   # the "distance" start of PADS: eq. (2) at the bin centres, no upper cutoff
    torch.testing.assert_close(init_probs("distance", c, dim=64),
                               (w := old_pads_distance_weighted(c[None].double(), 64, 0.5, math.inf)[0]) / w.sum(), rtol=1e-12, atol=0)

def test_the_two_normalisations_of_one_weight():
    "The miner normalises the shared weights by the row sum, PADS by the row maximum: the same distribution."
    x, y = batch(dim=16, seed=4, dtype=torch.float64)
    w = DistanceWeighted(16)(euclidean(x)) * pair_masks(y)[1]
    torch.testing.assert_close(w / w.sum(1, keepdim=True), DistanceWeightedMiner().probabilities(x, y), rtol=1e-10, atol=1e-12)

def test_distance_log_weights_formula():
    d = torch.tensor([0.2, 0.5, 0.9, 1.3, 1.5], dtype=torch.float64)
    q_inv = lambda x, D=16: 1 / (x ** (D - 2) * (1 - x ** 2 / 4) ** ((D - 3) / 2))
    got = distance_log_weights(d, 16)
    torch.testing.assert_close(got[:4].exp(), torch.tensor([q_inv(0.5), q_inv(0.5), q_inv(0.9), q_inv(1.3)], dtype=torch.float64))
    assert got[4] == -math.inf   # beyond the non-zero-loss cutoff

# ---------------------------------------------------------------- semi-hard
def test_semihard_band_unchanged_for_the_miner():
    for seed in range(5):
        x, y = batch(seed=seed)
        for dist in (euclidean, squared_euclidean):
            d = dist(x)
            a, p = torch.where(pair_masks(y)[0])
            for margin in (0.0, 0.1, 0.3, 1.0):
                assert torch.equal(semihard_band(d[a], d[a, p][:, None], margin), old_miner_band(d[a], d[a, p][:, None], margin))
                for closest in (False, True):   # the miner end to end, against the old body on the same batch
                    got = SemiHardMiner(margin, closest_negative=closest, squared=dist is squared_euclidean, normalize=False)(x, y)
                    band = pair_masks(y)[1][a] & old_miner_band(d[a], d[a, p][:, None], margin)
                    if closest:
                        cl, n = d[a].masked_fill(~band, math.inf).min(1); keep = torch.isfinite(cl)
                        ref = a[keep], p[keep], n[keep]
                    else:
                        row, n = torch.where(band); ref = a[row], p[row], n
                    assert all(torch.equal(u, v) for u, v in zip(got, ref))

class OldSemiHard(torch.nn.Module):
    def __init__(self, margin): super().__init__(); self.margin = margin
    def forward(self, d_an, d_ap): return old_pads_semihard(d_an, d_ap, self.margin)

def test_pads_semihard_draws_unchanged():
    "Same generator, same triplets: PADS's semi-hard distribution draws exactly what it drew before."
    for seed in range(5):
        x, y = batch(seed=seed)
        d = euclidean(x)
        a, p = torch.where(pair_masks(y)[0])
        assert torch.equal(SemiHard(0.3)(d[a], d[a, p][:, None]), old_pads_semihard(d[a], d[a, p][:, None], 0.3))
        new = DistributionSampler(SemiHard(0.3), seed=seed)(x, y)
        old = DistributionSampler(OldSemiHard(0.3), seed=seed)(x, y)
        assert all(torch.equal(u, v) for u, v in zip(new, old)) and len(new[0]) > 0

def test_semihard_band_boundary():
    "The band is FaceNet's 0 < d(a,n) - d(a,p) <= margin: a negative exactly at the positive's distance is out."
    d_ap = torch.tensor([1.0])
    assert semihard_band(torch.tensor([1.0, 1.1, 1.25, 1.3]), d_ap, 0.25).tolist() == [False, True, True, False]
