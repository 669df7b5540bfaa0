"""Benchmark: dml_book.metrics.evaluate at Stanford Online Products scale against pytorch-metric-learning.

Three measurements on one random SOP-sized set (60,502 x 512, 11,316 classes of 2 to 12 images, as SOP's test split):
  1. full evaluation: `evaluate` (Recall@1/10/100/1000, NMI, F1, MAP@R, R-Precision) vs PML's `AccuracyCalculator`
     computing the metrics both have (precision_at_1, NMI, mean_average_precision_at_r, r_precision);
  2. the kNN search alone: our chunked exact search for k = 1000 (+ self) vs a bare faiss `IndexFlatL2` search of all
     queries at once, the floor;
  3. the shared numbers, to show both libraries agree.
Peak memory is the process's peak resident set above its resident set before each step (Linux /proc/self/clear_refs),
so faiss' C++ allocations count. Each step runs in its own forked process, one after the other; we print wall-clock
time and CPU time (all threads), the latter being the fairer number on a machine shared with other jobs.

    .venv/bin/python benchmarks/evaluation.py                    # the full SOP size (several minutes on 2 cores)
    .venv/bin/python benchmarks/evaluation.py --n 6000 --classes 1100   # a quick run
"""
import argparse
import multiprocessing as mp
import re
import time

import numpy as np
import torch
import faiss

from dml_book.metrics import evaluate, knn_chunks


def _status(key: str) -> int:
    return int(re.search(key + r":\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024


def _child(fn, queue):
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak-RSS counter (VmHWM)
    before = _status("VmRSS")
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    queue.put((out, time.perf_counter() - t, time.process_time() - c, _status("VmHWM") - before))


def measure(fn):
    "Run `fn()` in a forked process: (result, wall seconds, CPU seconds of all threads, peak bytes above the start)."
    ctx = mp.get_context("fork")  # a fresh heap per step, so one step's freed memory cannot hide the next one's
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(fn, queue))
    proc.start()
    out = queue.get()
    proc.join()
    return out


def sop_like(n: int, n_classes: int, dim: int, a_noise: float = 3.0, seed: int = 0):
    "Labels with every class of 2 to 12 images (SOP's range) and clustered random embeddings."
    rng = np.random.default_rng(seed)
    if not 2 * n_classes <= n <= 12 * n_classes: raise ValueError("need 2 <= n / classes <= 12")
    sizes = np.full(n_classes, 2)
    extra = rng.choice(np.repeat(np.arange(n_classes), 10), n - 2 * n_classes, replace=False)
    sizes += np.bincount(extra, minlength=n_classes)
    labels = rng.permutation(np.repeat(np.arange(n_classes), sizes))
    centres = rng.normal(size=(n_classes, dim)).astype(np.float32)
    x = centres[labels] + a_noise * rng.normal(size=(n, dim)).astype(np.float32)
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True)), labels


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=60_502, help="number of images (SOP test: 60,502)")
    p.add_argument("--classes", type=int, default=11_316, help="number of classes (SOP test: 11,316)")
    p.add_argument("--dim", type=int, default=512, help="embedding dimension")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 10, 100, 1000], help="Recall@K values")
    a = p.parse_args()
    x, y = sop_like(a.n, a.classes, a.dim)
    k = max(a.ks)
    print(f"data: {a.n} x {a.dim}, {a.classes} classes (2-12 images each); faiss {faiss.__version__}, "
          f"{faiss.omp_get_max_threads()} threads; Recall@{a.ks}")

    # 1. the full evaluation
    ours, t_ours, c_ours, m_ours = measure(lambda: evaluate(x, y, ks=a.ks, progress=False))
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    calc = AccuracyCalculator(include=("precision_at_1", "NMI", "mean_average_precision_at_r", "r_precision"),
                              k="max_bin_count", device=torch.device("cpu"))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    pml, t_pml, c_pml, m_pml = measure(lambda: {key: float(v) for key, v in calc.get_accuracy(xt, yt).items()})

    # 2. the search alone: ours chunked, faiss' flat index all at once
    def our_search():
        for _ in knn_chunks(x, k, progress=False): pass
    def faiss_floor():
        index = faiss.IndexFlatL2(a.dim)
        index.add(x)
        index.search(x, k + 1)
    _, t_s, c_s, m_s = measure(our_search)
    _, t_f, c_f, m_f = measure(faiss_floor)

    mb = lambda b: f"{b / 2**20:8.0f}"
    print("\n| step | wall (s) | CPU (s) | peak extra memory (MB) | wall ratio | CPU ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(f"| dml_book `evaluate` (R@{'/'.join(map(str, a.ks))}, NMI, F1, MAP@R, R-Prec.) | {t_ours:.1f} | {c_ours:.1f} | {mb(m_ours)} | {t_ours / t_pml:.2f}x PML | {c_ours / c_pml:.2f}x PML |")
    print(f"| PML `AccuracyCalculator` (P@1, NMI, MAP@R, R-Prec.) | {t_pml:.1f} | {c_pml:.1f} | {mb(m_pml)} | 1 | 1 |")
    print(f"| dml_book chunked kNN search, k={k}+self | {t_s:.1f} | {c_s:.1f} | {mb(m_s)} | {t_s / t_f:.2f}x floor | {c_s / c_f:.2f}x floor |")
    print(f"| bare faiss IndexFlatL2.search, k={k}+1, all queries | {t_f:.1f} | {c_f:.1f} | {mb(m_f)} | 1 | 1 |")
    print("\n| metric | dml_book | PML |\n| --- | ---: | ---: |")
    for ours_key, pml_key in (("R@1", "precision_at_1"), ("NMI", "NMI"), ("MAP@R", "mean_average_precision_at_r"),
                              ("R-Precision", "r_precision")):
        print(f"| {ours_key} | {ours[ours_key]:.4f} | {pml[pml_key]:.4f} |")
    print("| " + " | ".join(f"{key} {val:.4f}" for key, val in ours.items() if key not in ("R@1", "NMI", "MAP@R", "R-Precision")) + " | | |")


if __name__ == "__main__":
    main()
