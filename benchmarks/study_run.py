"""Benchmark: a study run on glyphs_xl under the study's fast path against the path the studies took before it.

"Today" is the earlier study setting: fp32, NCHW, the test and validation splits embedded after every epoch. "Fast"
is `dml_book.study_design.STUDY_SETTINGS`: bf16 autocast, channels-last, test and validation every fifth epoch and
after the last. The schedule (cosine) is the same in both, so both train the same steps. CPU seconds are the
process's own (user + system), one thread, measured in this run; the ratio fast / today < 1 is a saving.

Parts, each option on its own:
- a training step (`Trainer.training_step` on the same batches): fp32, fp32 + channels-last, bf16, bf16 + channels-last;
- an evaluated image (`Trainer.embed_dataset` over the test split): fp32 NCHW, channels-last, and batch 1024;
- a whole run of `--epochs` epochs (default 20, the study's), today's path and the fast path.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/study_run.py                 # about 12 CPU-minutes
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/study_run.py --epochs 2      # the parts and a short whole run

Measured: see the closing table of `nbs/11b_study_design.ipynb` ("What the fast path buys").
"""
import argparse, json, resource, tempfile, warnings
from dataclasses import replace
import torch


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def step_seconds(cfg, steps: int, out: str) -> float:
    "CPU seconds per training step of `cfg` over its first `steps` batches (after 3 untimed ones)."
    from dml_book.train import Trainer
    t = Trainer(replace(cfg, out=out))
    batches = []
    for x, y in t.loader:
        batches.append((x, y))
        if len(batches) == steps + 3: break
    for x, y in batches[:3]: t.training_step(x, y)
    c = cpu()
    for x, y in batches[3:]: t.training_step(x, y)
    return (cpu() - c) / steps


def image_seconds(cfg, out: str, batch_size: int = 256) -> float:
    "CPU seconds per test image embedded by `Trainer.embed_dataset` under `cfg`."
    from dml_book.train import Trainer
    t = Trainer(replace(cfg, out=out))
    t.embed_dataset(torch.utils.data.Subset(t.test_ds, range(256)), batch_size)   # warm-up
    c = cpu(); t.embed_dataset(t.test_ds, batch_size)
    return (cpu() - c) / len(t.test_ds)


def whole_run(cfg, out: str) -> dict:
    "CPU seconds of a whole run of `cfg`, and its final and selected test R@1."
    from dml_book.train import Trainer
    c = cpu(); t = Trainer(replace(cfg, out=out)); t.fit()
    m = json.loads((t.out/"metrics.json").read_text())
    return dict(cpu_seconds=cpu() - c, steps=m["run"]["steps"], final_R1=m["final"]["R@1"],
                evaluations=sum("R@1" in r for r in m["epochs"]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=20, help="epochs of the whole runs (0: parts only)")
    p.add_argument("--steps", type=int, default=20, help="timed training steps per setting")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from dml_book.train import TrainConfig
    from dml_book.study_design import study_config
    fast = study_config(TrainConfig(), seed=args.seed)
    today = replace(fast, precision="fp32", channels_last=False, eval_every=1)
    d = tempfile.mkdtemp()
    print(f"torch {torch.__version__}, 1 thread; glyphs_xl, study settings\n")
    steps = {name: step_seconds(replace(fast, precision=p, channels_last=cl), args.steps, f"{d}/s{name}")
             for name, p, cl in [("fp32", "fp32", False), ("fp32 + channels-last", "fp32", True),
                                 ("bf16", "bf16", False), ("bf16 + channels-last", "bf16", True)]}
    for k, v in steps.items(): print(f"step  {k:28s} {1000*v:7.1f} ms   {v / steps['fp32']:.2f}x fp32")
    images = {"fp32 NCHW, batch 256": image_seconds(today, f"{d}/i0"),
              "channels-last, batch 256": image_seconds(fast, f"{d}/i1"),
              "channels-last, batch 1024": image_seconds(fast, f"{d}/i2", 1024)}
    base = images["fp32 NCHW, batch 256"]
    for k, v in images.items(): print(f"image {k:28s} {1e3*v:7.3f} ms   {v / base:.2f}x fp32 NCHW")
    if args.epochs:
        runs = {name: whole_run(replace(cfg, epochs=args.epochs), f"{d}/{name}") for name, cfg in (("today", today), ("fast", fast))}
        for k, r in runs.items():
            print(f"run   {k:6s} {args.epochs} epochs: {r['cpu_seconds']/60:5.1f} CPU-min, {r['steps']} steps, "
                  f"{r['evaluations']} evaluations, final R@1 {r['final_R1']:.4f}")
        print(f"run   fast / today: {runs['fast']['cpu_seconds'] / runs['today']['cpu_seconds']:.2f}x")


if __name__ == "__main__":
    main()
