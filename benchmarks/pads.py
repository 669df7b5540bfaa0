"""Wall-clock overhead of PADS over the same loss with static distance-weighted sampling, in the same run.

The paper (Roth et al., CVPR 2020) reports under 20% overhead at M = 30; our target is under 10%.
Both trainers use the margin loss on the same class-balanced batches of Glyphs (drawn from the PADS trainer's training
part, so both see identical images). The baseline mines with `dml_book.miners.DistanceWeightedMiner` (Wu et al.);
PADS draws its triplets from the binned distribution and, every M iterations, embeds the held-out validation images
(15% of the training split), computes Recall@1, NMI and the class distances, updates the policy with PPO and adjusts p.
Blocks of M iterations of the two are interleaved (in alternating order), so the load of a shared machine hits both alike; the ratio of the
median block times is the overhead, including the amortised policy step.

What to expect: the sampler itself costs about as much as the distance-weighted miner; nearly all of the overhead is the
forward pass over the validation images, so it is roughly (0.15 N_train t_fwd) / (M B t_fwd+bwd): the larger the
batch B and the interval M relative to the training split, the smaller the overhead.

    .venv/bin/python benchmarks/pads.py [--blocks 3] [--M 30] [--batch 112] [--threads 1]
"""
import argparse, statistics, tempfile, time

import torch

from dml_book.train import Trainer, TrainConfig


def build(method: str, batch: int, M: int, out: str, dataset: str) -> Trainer:
    kw = dict(dataset=dataset, batch_size=batch, m_per_class=4, embedding_dim=64, loss="margin",
              loss_kwargs=dict(margin=0.2, beta=1.2), seed=0, out=out)
    if method == "pads": return Trainer(TrainConfig(method="pads", method_kwargs=dict(update_every=M), **kw))
    return Trainer(TrainConfig(method="baseline", miner="distance_weighted", **kw))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=3, help="timed blocks of M iterations per method")
    ap.add_argument("--M", type=int, default=30, help="DML iterations per policy step")
    ap.add_argument("--batch", type=int, default=112, help="batch size (the paper's: 112)")
    ap.add_argument("--dataset", default="glyphs", help="built-in dataset: glyphs or digits")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: robust on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tmp = tempfile.mkdtemp()
    pads, base = build("pads", args.batch, args.M, f"{tmp}/pads", args.dataset), build("dw", args.batch, args.M, f"{tmp}/dw", args.dataset)
    for tr in (pads, base): tr.model.train(); tr.method.train()
    def cycle(loader):
        while True: yield from loader
    batches = cycle(pads.loader)
    pads_blocks, base_blocks, policy_steps, pads_plain, base_iters = [], [], [], [], []
    for b in range(args.blocks + 1):                                   # block 0 warms up
        data = [next(batches) for _ in range(args.M)]
        def run_pads():
            out = []
            for x, y in data:
                t0 = time.perf_counter(); logs = pads.training_step(x, y); out.append(time.perf_counter() - t0)
            return out, logs
        def run_base():
            out = []
            for x, y in data:
                t0 = time.perf_counter(); base.training_step(x, y); out.append(time.perf_counter() - t0)
            return out
        if b % 2: tb = run_base(); tp, logs = run_pads()                  # alternate the order: no first-mover bias
        else: (tp, logs), tb = run_pads(), run_base()
        assert "reward" in logs or b == 0 and "pads_probs" in logs, "the last iteration of a block must be a policy step"
        if b == 0: continue
        pads_blocks.append(sum(tp)); base_blocks.append(sum(tb))
        policy_steps.append(tp[-1]); pads_plain += tp[:-1]; base_iters += tb
    med = statistics.median
    ratio = med(pads_blocks) / med(base_blocks)
    print(f"dataset {args.dataset}, batch {args.batch}, M = {args.M}, {args.blocks} timed blocks, {args.threads} thread(s); "
          f"validation images per policy step: {len(pads.method.val_ds)}")
    print("| | seconds |")
    print("| --- | --- |")
    print(f"| distance-weighted (static), median block of {args.M} iterations | {med(base_blocks):.3f} |")
    print(f"| PADS, median block of {args.M} iterations (incl. one policy step) | {med(pads_blocks):.3f} |")
    print(f"| distance-weighted, median iteration | {med(base_iters):.4f} |")
    print(f"| PADS, median iteration without the policy step | {med(pads_plain):.4f} |")
    print(f"| PADS policy step (validation + PPO update + p), median | {med(policy_steps):.3f} |")
    print(f"\nPADS / distance-weighted per block: {ratio:.3f}  (overhead {100 * (ratio - 1):+.1f}%; target < +10%)")
    print(f"policy step / distance-weighted block: {med(policy_steps) / med(base_blocks):.3f}  "
          f"(the part of the overhead that does not depend on the noise of single iterations)")


if __name__ == "__main__":
    main()
