"""Benchmark: the training step under each precision, memory format and `compile`, as ratios to the fp32 step.

`Trainer.training_step` (forward under autocast, the loss in fp32, backward, optimiser step; fp16 with its gradient
scaler) on the same pre-loaded random batches of `--batch-size` x 3 x 224 x 224 images (m = 4 per class), for each
setting below; the best of `--repeat` timed runs of `--steps` steps after `--warmup` steps (compilation happens there).
The ratio fp32 / setting is the speed-up (> 1: faster). The peak memory is CUDA's (`max_memory_allocated`); on the CPU
it is not measured. fp16 runs only on CUDA: on a CPU its matrix products gain nothing (a 2048² product took 54 ms
against fp32's 56 and bf16's 9 on the AMX CPU below).

    .venv/bin/python benchmarks/precision.py --device cpu --backbone resnet18 --batch-size 16   # minutes on 2 cores
    python benchmarks/precision.py --device cuda --backbone resnet50 --batch-size 64 --compile    # a GPU

Measured on two of the project's 2-core x86-64 CPUs (resnet18, batch 8):
- one with AMX and AVX512-BF16 (`OMP_NUM_THREADS=2`, torch 2.14.1), two runs: fp32 451-473 ms/step; fp32 +
  channels-last 1.07-1.23x; bf16 1.95-2.00x; bf16 + channels-last 2.33-2.76x; bf16 + channels-last + compile
  (inductor, `--compile`) 2.25x.
- one without bf16 units (1 thread): fp32 3,882 ms/step, fp32 + channels-last 1.00x, bf16 0.09x, bf16 +
  channels-last 0.10x. There bf16 is emulated: use it on GPUs and on CPUs with AMX/AVX512-BF16
  (`grep -oE 'amx_bf16|avx512_bf16' /proc/cpuinfo`), where autocast's 16-bit matrix products are the point.
Not yet measured on a GPU.
"""
import argparse, tempfile, time, warnings
from pathlib import Path
import torch


def settings(device: str, with_compile: bool):
    "(precision, channels_last, compile) triples to time: fp32 first, the reference."
    precisions = ("fp32", "bf16", "fp16") if device == "cuda" else ("fp32", "bf16")
    out = [(p, cl, False) for p in precisions for cl in (False, True)]
    if with_compile: out += [("bf16", True, True)] + ([("fp16", True, True)] if device == "cuda" else [])
    return out


def time_steps(trainer, batches, warmup: int, repeat: int) -> float:
    "Best seconds per step of `trainer.training_step` over `batches`, after `warmup` steps."
    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    for x, y in batches[:warmup]: trainer.training_step(x, y)
    sync(); best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for x, y in batches[warmup:]: trainer.training_step(x, y)
        sync(); best = min(best, (time.perf_counter() - t) / (len(batches) - warmup))
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--backbone", default="resnet18", help="backbone (resnet50 or googlenet at the papers' scale)")
    p.add_argument("--batch-size", type=int, default=16, help="images per batch")
    p.add_argument("--steps", type=int, default=4, help="timed steps per repetition")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation, cuDNN autotuning)")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions (best kept)")
    p.add_argument("--compile", action="store_true", help="also time torch.compile of the backbone")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    from dml_book.data.replicas import write_cub
    from dml_book.train import Trainer
    dev = torch.device(args.device)
    if dev.type == "cuda": torch.backends.cudnn.benchmark = True
    g = torch.Generator().manual_seed(0)
    n = args.warmup + args.steps
    images = [torch.randn(args.batch_size, 3, 224, 224, generator=g) for _ in range(n)]
    labels = torch.arange(args.batch_size // 4).repeat_interleave(4)
    rows = []
    name = torch.cuda.get_device_name() if dev.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"training step: {args.backbone}, batch {args.batch_size} x 3 x 224 x 224, {name}, torch {torch.__version__}")
    print(f"{'precision':>9} {'channels_last':>13} {'compile':>7} {'ms/step':>9} {'peak MB':>9} {'fp32 / this':>11}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        root = write_cub(Path(d)/"data", classes=(*range(1, 9), 101, 102, 103), per_class=4)
        for precision, cl, comp in settings(dev.type, args.compile):
            torch.manual_seed(0)
            t = Trainer(dataset="cub200", data_root=str(root), backbone=args.backbone, pretrained=False, embedding_dim=128,
                        batch_size=args.batch_size, m_per_class=4, num_workers=0, device=args.device, out=f"{d}/run",
                        precision=precision, channels_last=cl, compile=comp, epochs=1, eval_every=10**6)
            fmt = torch.channels_last if cl else torch.contiguous_format
            batches = [(x.to(dev).contiguous(memory_format=fmt), labels.to(dev)) for x in images]
            if dev.type == "cuda": torch.cuda.reset_peak_memory_stats()
            s = time_steps(t, batches, args.warmup, args.repeat)
            mem = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else float("nan")
            rows.append((precision, cl, comp, s, mem))
            print(f"{precision:>9} {str(cl):>13} {str(comp):>7} {s * 1e3:9.1f} {mem:9.0f} {rows[0][3] / s:11.2f}", flush=True)
            del t, batches
            if dev.type == "cuda": torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
