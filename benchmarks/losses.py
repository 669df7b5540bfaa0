"""Forward+backward time of each dml_book loss (and miner+loss) against its pytorch-metric-learning equivalent.

Run: .venv/bin/python benchmarks/losses.py [--batches 128 512] [--dim 512] [--reps 5] [--threads 1]
Prints one row per (loss, batch): the best of `reps` timings of ours and of PML's in the same run (calls interleaved, so
that load from other processes hits both alike; the minimum is the least noisy statistic on a shared machine), and the
ratio PML / ours (> 1: we are faster). A case whose warm-up call takes more than 5 s is timed once (marked *).
Batches hold 4 images per class (N-pair: 2); proxy losses use max(100, B/4) classes.
"""
import argparse, time
import torch
import torch.nn.functional as F
from pytorch_metric_learning import losses as L, miners as M

from dml_book.losses import (TripletLoss, ContrastiveLoss, MarginLoss, NPairLoss, LiftedStructureLoss, AngularLoss,
                             MultiSimilarityLoss, ProxyNCALoss, ProxyAnchorLoss, NormSoftmaxLoss)
from dml_book.miners import SemiHardMiner, BatchHardMiner, DistanceWeightedMiner


def cases(n_cls):
    "name -> (ours, pml): callables (emb, labels) -> scalar loss."
    def plain(loss): return lambda e, y: loss(e, y)
    def mined(miner, loss): return lambda e, y: loss(e, y, miner(e, y))
    def proxy(ours, pml):
        with torch.no_grad():
            (pml.proxies if hasattr(pml, "proxies") else pml.W).copy_(ours.proxies if hasattr(pml, "proxies") else ours.proxies.T)
        return plain(ours), plain(pml)
    return {
        "triplet (all)": (plain(TripletLoss(0.2)), plain(L.TripletMarginLoss(0.2))),
        "semihard + triplet": (mined(SemiHardMiner(0.2), TripletLoss(0.2)),
                               mined(M.TripletMarginMiner(0.2, type_of_triplets="semihard"), L.TripletMarginLoss(0.2))),
        "batchhard + triplet": (mined(BatchHardMiner(), TripletLoss(0.2)), mined(M.BatchHardMiner(), L.TripletMarginLoss(0.2))),
        "distweighted + margin": (mined(DistanceWeightedMiner(), MarginLoss()),
                                  mined(M.DistanceWeightedMiner(), L.MarginLoss(nu=0))),
        "contrastive": (plain(ContrastiveLoss(0., 0.5)), plain(L.ContrastiveLoss(0., 0.5))),
        "margin (all)": (plain(MarginLoss()), plain(L.MarginLoss(nu=0))),
        "lifted": (plain(LiftedStructureLoss()), plain(L.LiftedStructureLoss())),
        "multisimilarity": (plain(MultiSimilarityLoss()), plain(L.MultiSimilarityLoss())),
        "angular": (plain(AngularLoss()), plain(L.AngularLoss())),
        "npair (2/class)": (plain(NPairLoss()), plain(L.NPairsLoss())),
        "proxynca": proxy(ProxyNCALoss(n_cls, ARGS.dim), L.ProxyNCALoss(n_cls, ARGS.dim)),
        "proxyanchor": proxy(ProxyAnchorLoss(n_cls, ARGS.dim), L.ProxyAnchorLoss(n_cls, ARGS.dim)),
        "normsoftmax": proxy(NormSoftmaxLoss(n_cls, ARGS.dim), L.NormalizedSoftmaxLoss(n_cls, ARGS.dim)),
    }


def step(fn, raw, labels):
    t = time.perf_counter()
    loss = fn(F.normalize(raw, dim=1), labels)
    loss.backward()
    raw.grad = None
    return time.perf_counter() - t


def main():
    torch.set_num_threads(ARGS.threads)
    print(f"torch {torch.__version__}, {ARGS.threads} thread(s), dim {ARGS.dim}, float32, best of {ARGS.reps} after 1 warm-up")
    print(f"{'loss':<24}{'batch':>6}{'ours ms':>10}{'pml ms':>10}{'pml/ours':>10}")
    for B in ARGS.batches:
        g = torch.Generator().manual_seed(0)
        raw = torch.randn(B, ARGS.dim, generator=g, requires_grad=True)
        labels = torch.arange(B // 4).repeat_interleave(4)
        pairs2 = torch.arange(B // 2).repeat_interleave(2)
        for name, (ours, pml) in cases(max(100, B // 4)).items():
            y = pairs2 if "npair" in name else labels
            torch.manual_seed(0)
            t1, t2 = [step(ours, raw, y)], [step(pml, raw, y)]  # warm-up
            slow = max(t1[0], t2[0]) > 5
            if not slow:
                t1, t2 = [], []
                for _ in range(ARGS.reps):
                    t1.append(step(ours, raw, y)); t2.append(step(pml, raw, y))
            m1, m2 = min(t1) * 1e3, min(t2) * 1e3
            print(f"{name:<24}{B:>6}{m1:>10.2f}{m2:>10.2f}{m2 / m1:>10.2f}{' *' if slow else ''}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[128, 512])
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    ARGS = p.parse_args()
    main()
