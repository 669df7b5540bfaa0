"""Time per iteration of ALA against the same loss without ALA, in the same run.

The paper (Zheng et al., CVPR 2020) reports 0.65 s against 0.31 s per iteration (2.1x); our target is below 1.5x.
Both methods train on the same Glyphs episodes (100 training + 20 validation images, label-disjoint); the plain
baseline takes one step of the same loss on the whole episode (120 images) and, in the second column, on the
100 training images only. Iterations of the two are interleaved and the median is reported, so that the load of a
shared machine hits both alike.

    .venv/bin/python benchmarks/ala.py [--iters 15] [--threads 1]
"""
import argparse, statistics, tempfile, time

import torch

from dml_book.data import Glyphs
from dml_book.samplers import EpisodeSampler
from dml_book.train import Trainer, TrainConfig


def trainer(backbone: str, method: str, method_kwargs: dict | None = None):
    "A real `Trainer` (its model, loss, optimiser with the paper's learning rates); we drive its steps by hand."
    return Trainer(TrainConfig(dataset="glyphs", backbone=backbone, embedding_dim=64, loss="triplet", method=method,
                               method_kwargs=method_kwargs or {}, m_per_class=5, batch_size=120, lr_backbone=1e-4,
                               lr_head=1e-3, seed=0, device="cpu", out=tempfile.mkdtemp()))


def timed(f):
    t0 = time.perf_counter(); f(); return time.perf_counter() - t0


def bench(backbone: str, step: str, iters: int, ds) -> dict:
    episodes = iter(EpisodeSampler(ds.labels, 100, 20, 5, episodes_per_epoch=iters + 2))
    batches = [[torch.stack([ds[i][0] for i in ep]), torch.as_tensor(ds.labels[ep])] for ep in episodes]
    ala_tr, base_tr = trainer(backbone, "ala", dict(step=step)), trainer(backbone, "baseline")
    t_ala, t_120, t_100 = [], [], []
    for i, (x, y) in enumerate(batches):
        a = timed(lambda: ala_tr.training_step(x, y))
        b = timed(lambda: base_tr.training_step(x, y))
        c = timed(lambda: base_tr.training_step(x[:100], y[:100]))
        if i >= 2: t_ala.append(a); t_120.append(b); t_100.append(c)    # two warm-up iterations
    med = statistics.median
    return dict(backbone=backbone, step=step, ala=med(t_ala), base120=med(t_120), base100=med(t_100))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=15, help="timed iterations per setting")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: robust on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ds = Glyphs(split="train")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, Glyphs 32x32, triplet loss, K=3, "
          f"256 tuples/iteration, median of {args.iters} iterations")
    print(f"| backbone | differentiable step | ALA s/it | plain (120 img) s/it | plain (100 img) s/it | ratio vs 120 | ratio vs 100 |")
    print("|---|---|---|---|---|---|---|")
    for backbone, step in (("smallcnn", "head"), ("resnet18", "head"), ("smallcnn", "all")):
        r = bench(backbone, step, args.iters, ds)
        print(f"| {backbone} | {step} | {r['ala']:.3f} | {r['base120']:.3f} | {r['base100']:.3f} | "
              f"{r['ala'] / r['base120']:.2f}x | {r['ala'] / r['base100']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
