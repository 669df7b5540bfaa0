"""Benchmark: the training input pipeline and the trainer's per-step overhead, on a CUB-like replica at real image sizes.

A replica of CUB-200-2011's layout (`dml_book.data.replicas.write_cub`) whose images are then rewritten as JPEGs of
CUB's sizes (about 500 x 375, some portrait, some greyscale), smooth enough to compress like photographs.

(a) Images per second through a DataLoader (random crop 224 training pipeline, shuffled, same batch size and
    workers) for our datasets (`decoder="pil"` and `decoder="torchvision"`) and for torchvision's `ImageFolder` over
    the same files with the same transform; ratio ours / ImageFolder (> 1: ours is faster).
(b) Seconds per training step of `Trainer.run_epoch` against a minimal hand-written loop doing the same work
    (same model, loss, optimiser and pre-loaded batches: forward, loss, zero_grad, backward, step, loss.item());
    ratio trainer / loop (the trainer's overhead: its step bookkeeping, finiteness check and JSON-lines log).
Runs alternate and the best of `--repeat` is kept; (b) also reports CPU time of this process, which other load on a
shared machine disturbs less than wall-clock time. The ratios are what to read.

    .venv/bin/python benchmarks/training.py                      # a few minutes on 2 busy cores
    .venv/bin/python benchmarks/training.py --classes 50 --per-class 30 --workers 8 --backbone resnet50 --batch-size 64
"""
import argparse, copy, tempfile, time, warnings
from dataclasses import replace
from pathlib import Path
import numpy as np
import torch
from PIL import Image


def write_cub_like(root: Path, classes: int, per_class: int, seed: int = 0) -> Path:
    "CUB's layout: `classes` training classes (and 3 test classes) of `per_class` JPEGs of CUB's sizes; returns the data root."
    from dml_book.data.replicas import write_cub
    ids = (*range(1, classes + 1), 101, 102, 103)
    base, rng = write_cub(root, classes=ids, per_class=per_class, seed=seed), np.random.default_rng(seed)
    for i, p in enumerate(sorted((base/"images").rglob("*.jpg"))):
        h, w = (375, 500) if i % 4 else (500, 375)                         # a quarter portrait
        h, w = h + int(rng.integers(-40, 41)), w + int(rng.integers(-20, 21))
        y, x = np.mgrid[0:h, 0:w]
        f = rng.uniform(8, 40, 6)
        img = np.stack([np.sin(x / f[c] + c) * np.cos(y / f[c + 3] - c) * 90 + 128 for c in range(3)], -1)
        img = (img + rng.normal(0, 6, img.shape)).clip(0, 255).astype(np.uint8)
        im = Image.fromarray(img)
        (im.convert("L") if i % 10 == 0 else im).save(p, quality=90)       # a tenth greyscale, as in CUB
    return root


def images_per_second(ds, batch_size, workers, repeat):
    best = float("inf")
    for _ in range(repeat):
        loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                                             persistent_workers=False, drop_last=False)
        t = time.perf_counter()
        n = sum(len(x) for x, _ in loader)
        best = min(best, time.perf_counter() - t)
    return n / best


def input_pipeline(root, args):
    from torchvision.datasets import ImageFolder
    from dml_book.data.core import build_split
    from dml_book.train import TrainConfig
    cfg = TrainConfig(dataset="cub200", data_root=str(root))
    ours = {d: build_split(replace(cfg, decoder=d), "train", True) for d in ("pil", "torchvision")}
    is_train = lambda p: int(Path(p).parent.name[:3]) <= 100                  # CUB's training classes: 1 to 100
    folder = ImageFolder(str(root/"CUB_200_2011"/"images"), transform=ours["pil"].transform, is_valid_file=is_train, allow_empty=True)
    assert len(folder) == len(ours["pil"]), (len(folder), len(ours["pil"]))
    rates = {k: 0.0 for k in ("ImageFolder", "pil", "torchvision")}
    for _ in range(args.repeat):   # alternate, keep the best of each
        rates["ImageFolder"] = max(rates["ImageFolder"], images_per_second(folder, args.batch_size, args.workers, 1))
        for d, ds in ours.items(): rates[d] = max(rates[d], images_per_second(ds, args.batch_size, args.workers, 1))
    print(f"(a) input pipeline: {len(folder)} images, batch {args.batch_size}, {args.workers} workers, retrieval224 training transform")
    print(f"    torchvision ImageFolder        {rates['ImageFolder']:8.1f} images/s")
    for d in ("pil", "torchvision"):
        print(f"    ours, decoder={d:<12}    {rates[d]:8.1f} images/s   ours / ImageFolder = {rates[d] / rates['ImageFolder']:.2f}")


def step_overhead(root, args):
    from dml_book.train import Trainer
    out = Path(tempfile.mkdtemp())
    t = Trainer(dataset="cub200", data_root=str(root), backbone=args.backbone, embedding_dim=128, batch_size=args.batch_size,
                m_per_class=4, num_workers=0, device="cpu", out=str(out), eval_every=10**6, epochs=10**6)
    batches = [b for _, b in zip(range(args.steps), t.loader)]                # the same pre-loaded batches for both
    t.loader, t.epoch = batches, 0
    model, loss_fn = copy.deepcopy(t.model), copy.deepcopy(t.loss_fn)
    opt = torch.optim.Adam([{"params": list(model.backbone.parameters()), "lr": t.cfg.lr_backbone},
                            {"params": list(model.head.parameters()) + list(loss_fn.parameters()), "lr": t.cfg.lr_head}],
                           weight_decay=t.cfg.weight_decay)

    def hand_loop():
        model.train()
        for x, y in batches:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
            loss.item()

    def trainer_epoch():
        t.epoch += 1; t.run_epoch()

    best = {k: float("inf") for k in ("loop", "trainer", "loop cpu", "trainer cpu")}
    all_batches, batches[:] = list(batches), batches[:1]
    hand_loop(); trainer_epoch()                                              # warm-up on one batch (first-call costs)
    batches[:] = all_batches
    runs = (("loop", hand_loop), ("trainer", trainer_epoch))
    for r in range(args.repeat):
        for name, fn in runs if r % 2 == 0 else runs[::-1]:               # alternate which goes first
            s, c = time.perf_counter(), time.process_time(); fn()
            best[name] = min(best[name], (time.perf_counter() - s) / len(batches))
            best[f"{name} cpu"] = min(best[f"{name} cpu"], (time.process_time() - c) / len(batches))   # less sensitive to other load
    print(f"(b) step time: {args.backbone}, batch {args.batch_size} x 3 x 224 x 224, {len(batches)} steps, {torch.get_num_threads()} threads")
    print(f"    hand-written loop   {best['loop'] * 1e3:8.1f} ms/step wall  {best['loop cpu'] * 1e3:8.1f} ms/step CPU")
    print(f"    Trainer.run_epoch   {best['trainer'] * 1e3:8.1f} ms/step wall  {best['trainer cpu'] * 1e3:8.1f} ms/step CPU")
    print(f"    trainer / loop = {best['trainer'] / best['loop']:.3f} wall, {best['trainer cpu'] / best['loop cpu']:.3f} CPU time  (target <= 1.05)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--classes", type=int, default=20, help="classes of the replica (1 to 100: CUB's training classes)")
    p.add_argument("--per-class", type=int, default=15, help="images per class")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers for (a)")
    p.add_argument("--batch-size", type=int, default=16, help="images per batch")
    p.add_argument("--backbone", default="resnet18", help="backbone for (b)")
    p.add_argument("--steps", type=int, default=4, help="training steps per timed epoch in (b)")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions (best kept)")
    p.add_argument("--only", choices=("input", "step"), default=None, help="run one part only")
    args = p.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        root = write_cub_like(Path(d), args.classes, args.per_class)
        print(f"replica: {args.classes * args.per_class} training JPEGs of about 500 x 375 in {time.perf_counter() - t0:.1f} s")
        if args.only != "step": input_pipeline(root, args)
        if args.only != "input": step_overhead(root, args)
