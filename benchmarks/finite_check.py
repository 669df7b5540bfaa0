"""What the non-finite check costs: forward+backward of each loss (and miner + loss) with the check and without it.

Run: .venv/bin/python benchmarks/finite_check.py [--batches 128 512] [--dim 512] [--reps 7] [--threads 1]
The check is one fused `torch.isfinite(embeddings).all()` per call (`dml_book.losses.base.check_finite`). Each row is
the best of `reps` timings with the check and with it replaced by a no-op, calls interleaved so that load from other
processes hits both alike; the ratio is checked / unchecked (1.00: no measurable cost).
"""
import argparse, time
import torch
import dml_book.losses.base as base
import dml_book.miners as miners
from dml_book.losses import TripletLoss, ContrastiveLoss, MarginLoss, MultiSimilarityLoss, ProxyAnchorLoss
from dml_book.miners import SemiHardMiner, BatchHardMiner


def cases(n_cls, dim):
    return {"triplet (all)": lambda e, y, l=TripletLoss(0.2): l(e, y),
            "semihard + triplet": lambda e, y, m=SemiHardMiner(0.2), l=TripletLoss(0.2): l(e, y, m(e, y)),
            "batchhard + triplet": lambda e, y, m=BatchHardMiner(), l=TripletLoss(0.2): l(e, y, m(e, y)),
            "contrastive": lambda e, y, l=ContrastiveLoss(0., 0.5): l(e, y),
            "margin": lambda e, y, l=MarginLoss(): l(e, y),
            "multisimilarity": lambda e, y, l=MultiSimilarityLoss(): l(e, y),
            "proxyanchor": lambda e, y, l=ProxyAnchorLoss(n_cls, dim): l(e, y)}


def best_time(fn, e, y) -> float:
    e = e.detach().requires_grad_()
    t = time.perf_counter(); fn(e, y).backward(); return time.perf_counter() - t


def main():
    checked = {m: getattr(m, "check_finite") for m in (base, miners) if hasattr(m, "check_finite")}
    def set_check(on: bool):
        for m, f in checked.items(): m.check_finite = f if on else (lambda *a, **k: None)
    print(f"{'case':24s} {'batch':>6s} {'checked ms':>11s} {'unchecked ms':>13s} {'ratio':>6s}")
    for b in ARGS.batches:
        y = torch.arange(b) // 4; n_cls = int(y.max()) + 1
        e = torch.randn(b, ARGS.dim)
        for name, fn in cases(max(100, n_cls), ARGS.dim).items():
            on, off = [], []
            for _ in range(ARGS.reps):
                set_check(True); on.append(best_time(fn, e, y))
                set_check(False); off.append(best_time(fn, e, y))
            set_check(True)
            print(f"{name:24s} {b:6d} {1e3 * min(on):11.3f} {1e3 * min(off):13.3f} {min(on) / min(off):6.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[128, 512]); p.add_argument("--dim", type=int, default=512)
    p.add_argument("--reps", type=int, default=7); p.add_argument("--threads", type=int, default=1)
    ARGS = p.parse_args(); torch.set_num_threads(ARGS.threads); main()
