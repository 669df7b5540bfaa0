"""Does PADS's reward tell actions apart? A paired branching measurement on the study's data (glyphs_xl).

The reward of a policy step is r = sign(e_after - e_before), e the mean of Recall@1 and NMI on the reward split. For it
to teach the policy anything, the change an action causes in e must stand out from the change the same action shows
from one batch order to the next. This script measures both, from one model state:

1. train `--warmup` iterations with PADS's fixed initial distribution (`adapt=False`), on the study's settings with a
   reward split of `--split` of the training classes;
2. from that state, apply one of two coherent actions of the policy's size: `harder` multiplies the bins below p's mean
   distance by beta = 1.25 and the others by alpha = 0.8, `easier` the reverse (the largest shift of p's mean one
   action can make);
3. for each of `--replicates` batch orders (the same orders for both actions), train M iterations and evaluate e at each
   M of `--ms`, on the whole reward split and on its first half of classes (the split size halved).

Per (M, split size): `trend`, the mean change of e; `noise`, the standard deviation of the change over batch orders
within an action (what a single reward sees besides the action); `effect`, the paired mean difference harder - easier;
`snr` = |effect| / noise; `p_up`, the share of branches whose reward would be +1. During the warm-up it also records
how often self-regularisation (positives among the candidates) would have drawn a negative of the anchor's label.

    python benchmarks/pads_reward_signal.py [--warmup 100] [--replicates 3] [--ms 30 60] [--split 0.3] [--out FILE]
"""
import argparse, copy, json, tempfile, time

import numpy as np
import torch

from dml_book.data.core import LabelledSubset
from dml_book.methods.pads import distribution_means, sample_triplets, triplet_stats
from dml_book.methods.pads_policy import apply_actions
from dml_book.metrics import evaluate
from dml_book.study import STUDY_SETTINGS
from dml_book.train import Trainer, TrainConfig


def build(split: float, seed: int) -> Trainer:
    cfg = TrainConfig(**{**STUDY_SETTINGS, "method": "pads", "loss": "margin", "seed": seed, "out": tempfile.mkdtemp(),
                         "method_kwargs": {"adapt": False, "val_fraction": split}})
    return Trainer(cfg)


def reward_metric(tr: Trainer, parts: dict) -> dict:
    "e = (R@1 + NMI) / 2 on each part of the reward split (name -> subset of `tr.method.val_ds`)."
    emb, labels = tr.embed_dataset(tr.method.val_ds)
    out = {}
    for name, idx in parts.items():
        m = evaluate(emb[idx], np.asarray(labels)[idx], ks=(1,), metrics=("R@K", "NMI"), seed=0)
        out[name] = (float(m["R@1"]) + float(m["NMI"])) / 2
    return out


def batches(tr: Trainer, order: int):
    "Batches of sampler epoch `order`, then of the following ones: the same stream for the same order."
    for epoch in range(10_000 + order, 20_000):
        tr.sampler.set_epoch(epoch)
        yield from tr.loader


def train_steps(tr: Trainer, stream, n: int):
    "n iterations on the next batches of `stream`."
    tr.model.train(); tr.method.train()
    for _ in range(n):
        x, y = next(stream)
        tr.training_step(x.to(tr.device), y.to(tr.device))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=100, help="iterations before branching")
    ap.add_argument("--replicates", type=int, default=3, help="batch orders per action")
    ap.add_argument("--ms", type=int, nargs="+", default=[30, 60], help="iterations after the action at which e is read")
    ap.add_argument("--split", type=float, default=0.3, help="share of the training classes in the reward split")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tr = build(args.split, args.seed)
    m, val = tr.method, tr.method.val_ds
    classes = np.unique(val.labels)
    parts = {"full": np.arange(len(val)), "half": np.flatnonzero(np.isin(val.labels, classes[: len(classes) // 2]))}
    shares, tuples, g = [], m.tuples, torch.Generator().manual_seed(args.seed)
    def tuples_and_self_reg(trainer, z, y):   # what the old default (positives among the candidates) would draw from this batch
        t = sample_triplets(z.detach().cpu(), y.cpu(), m.distribution, self_regularization=True, generator=g)
        shares.append(triplet_stats(z.detach().cpu(), y.cpu(), t)["same_label_negatives"])
        return tuples(trainer, z, y)
    m.tuples = tuples_and_self_reg
    train_steps(tr, batches(tr, -1), args.warmup)
    m.tuples = tuples
    snap = {k: copy.deepcopy(v.state_dict()) for k, v in (("model", tr.model), ("opt", tr.optimizer), ("loss", tr.loss_fn), ("method", m))}
    e0 = reward_metric(tr, parts)
    p0 = m.distribution.probs.clone()
    below = m.distribution.centers < float(distribution_means(p0[None].numpy(), m.distribution.edges.numpy())[0])
    actions = {"harder": torch.where(below, 2, 0), "easier": torch.where(below, 0, 2)}
    de = {a: {name: np.zeros((args.replicates, len(args.ms))) for name in parts} for a in actions}
    for k in range(args.replicates):
        for a, act in actions.items():
            for key, mod in (("model", tr.model), ("opt", tr.optimizer), ("loss", tr.loss_fn), ("method", m)): mod.load_state_dict(copy.deepcopy(snap[key]))
            m.distribution.probs.copy_(apply_actions(p0, act))
            m.generator.manual_seed(1000 + k); torch.manual_seed(1000 + k)
            stream, done = batches(tr, k), 0
            for j, M in enumerate(args.ms):
                train_steps(tr, stream, M - done); done = M
                e = reward_metric(tr, parts)
                for name in parts: de[a][name][k, j] = 100 * (e[name] - e0[name])
            print(f"replicate {k} {a}: " + ", ".join(f"{name} " + " ".join(f"{x:+.2f}" for x in de[a][name][k]) for name in parts), flush=True)
    rows = []
    for name, idx in parts.items():
        for j, M in enumerate(args.ms):
            h, e = de["harder"][name][:, j], de["easier"][name][:, j]
            noise = float(np.sqrt((h.var(ddof=1) + e.var(ddof=1)) / 2)) if args.replicates > 1 else float("nan")
            rows.append(dict(split=name, images=len(idx), M=M, trend=float(np.r_[h, e].mean()), noise=noise,
                             effect=float((h - e).mean()), snr=abs(float((h - e).mean())) / noise, p_up=float(np.mean(np.r_[h, e] > 0))))
    result = dict(args=vars(args), e0=e0, self_regularization_same_label_share=float(np.mean(shares)),
                  train_classes=int(len(np.unique(tr.train_ds.labels))), rows=rows, seconds=round(time.perf_counter() - t0, 1),
                  changes={a: {n: v.tolist() for n, v in d.items()} for a, d in de.items()})
    print(json.dumps(result, indent=1))
    if args.out: open(args.out, "w").write(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
