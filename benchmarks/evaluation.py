"""Benchmark: dml_book.metrics.evaluate at Stanford Online Products scale against pytorch-metric-learning and the floor.

One random SOP-sized set (60,502 x 512, 11,316 classes of 2 to 12 images, as SOP's test split), measured in one run:
  1. the full evaluation: `evaluate` (Recall@1/10/100/1000, NMI, F1, MAP@R, R-Precision) vs PML's
     `AccuracyCalculator` computing the metrics both have (precision_at_1, NMI, mean_average_precision_at_r,
     r_precision);
  2. the floor: what any exact evaluation of these metrics must do at least, faiss k-means (the settings `evaluate`
     uses) plus one bare faiss `IndexFlatL2` search of all queries for the largest class size (+ self);
  3. the parts, to show what dominates: k-means alone, the bare search alone, our retrieval metrics alone
     (Recall@K by counting + the lists for MAP@R, as `evaluate` chooses: one pass on the CPU), the same forced to the
     two steps of the previous version (counts first, then lists for the queries whose AP@R can be above 0), and our
     count of the first correct neighbour's rank for every query, alone and with the lists in one pass;
  4. the shared numbers, to show both libraries agree.
Peak memory is the process's peak resident set above its resident set before each step (Linux /proc/self/clear_refs),
so faiss' C++ allocations count. Each step runs in its own forked process, one after the other; we print wall-clock
time and CPU time (all threads), the latter being the fairer number on a machine shared with other jobs.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/evaluation.py                  # the full SOP size (minutes)
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/evaluation.py --noise 2.2      # embeddings like a trained model's
    .venv/bin/python benchmarks/evaluation.py --n 6000 --classes 1100            # a quick run
"""
import argparse
import multiprocessing as mp
import re
import time

import numpy as np
import torch
import faiss

from dml_book.metrics import evaluate, kmeans_assign, count_ahead, count_ahead_knn, _retrieval


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
    p.add_argument("--noise", type=float, default=3.0,
                   help="spread of each class around its centre: 3 gives R@1 about 0.1 (an untrained model), "
                        "2.2 about 0.8 (a trained one)")
    a = p.parse_args()
    x, y = sop_like(a.n, a.classes, a.dim, a.noise)
    depth = int(np.bincount(y).max()) - 1  # the largest R: MAP@R's lists are this long
    print(f"data: {a.n} x {a.dim}, {a.classes} classes (2-12 images each, largest R = {depth}); faiss "
          f"{faiss.__version__}, {faiss.omp_get_max_threads()} threads, torch {torch.get_num_threads()}; Recall@{a.ks}")

    # 1. the full evaluation, ours and PML's
    ours, t_ours, c_ours, m_ours = measure(lambda: evaluate(x, y, ks=a.ks, progress=False))
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    calc = AccuracyCalculator(include=("precision_at_1", "NMI", "mean_average_precision_at_r", "r_precision"),
                              k="max_bin_count", device=torch.device("cpu"))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    pml, t_pml, c_pml, m_pml = measure(lambda: {key: float(v) for key, v in calc.get_accuracy(xt, yt).items()})

    # 2. the floor: k-means + one bare flat search as deep as the largest class (+ self), in one process
    def search():
        index = faiss.IndexFlatL2(a.dim)
        index.add(x)
        index.search(x, depth + 1)
    def floor():
        kmeans_assign(x, a.classes, gpus=None)
        search()
    _, t_fl, c_fl, m_fl = measure(floor)

    # 3. the parts
    _, t_km, c_km, m_km = measure(lambda: kmeans_assign(x, a.classes, gpus=None))
    _, t_s, c_s, m_s = measure(search)
    one, t_r, c_r, m_r = measure(lambda: evaluate(x, y, ks=a.ks, metrics=("R@K", "MAP@R", "R-Precision"), progress=False))
    two = lambda: _retrieval(x, y, None, y, sorted(a.ks), ("R@K", "MAP@R", "R-Precision"), "euclidean",
                             256 * 2**20, [], False, first="counts")
    two_out, t_2, c_2, m_2 = measure(two)
    xq = torch.from_numpy(x)
    def counts(lists=False):
        gn = (xq * xq).sum(1)
        for s in range(0, a.n, 4096):
            rows = np.arange(s, min(s + 4096, a.n))
            if lists: count_ahead_knn(xq[s:s + 4096], xq, y[rows], y, rows, cosine=False, k=depth, gn=gn)
            else: count_ahead(xq[s:s + 4096], xq, y[rows], y, rows, cosine=False, gn=gn)
    _, t_c, c_c, m_c = measure(counts)
    _, t_ck, c_ck, m_ck = measure(lambda: counts(lists=True))

    mb = lambda b: f"{b / 2**20:8.0f}"
    row = lambda name, t, c, m, ref: (f"| {name} | {t:.1f} | {c:.1f} | {mb(m)} | {ref[0]}{t / ref[1]:.2f}x | "
                                      f"{ref[0]}{c / ref[2]:.2f}x |")
    print("\n| step | wall (s) | CPU (s) | peak extra memory (MB) | wall ratio | CPU ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    ks = "/".join(map(str, a.ks))
    print(row(f"dml_book `evaluate` (R@{ks}, NMI, F1, MAP@R, R-Prec.)", t_ours, c_ours, m_ours, ("PML ", t_pml, c_pml)))
    print(row("PML `AccuracyCalculator` (P@1, NMI, MAP@R, R-Prec.)", t_pml, c_pml, m_pml, ("PML ", t_pml, c_pml)))
    print(row(f"dml_book `evaluate`, as above", t_ours, c_ours, m_ours, ("floor ", t_fl, c_fl)))
    print(row(f"floor: faiss k-means + bare `IndexFlatL2.search`, k={depth}+1", t_fl, c_fl, m_fl, ("floor ", t_fl, c_fl)))
    print(row("  part: faiss k-means alone", t_km, c_km, m_km, ("floor ", t_fl, c_fl)))
    print(row(f"  part: bare faiss search alone, k={depth}+1", t_s, c_s, m_s, ("floor ", t_fl, c_fl)))
    print(row(f"  part: dml_book retrieval metrics alone (R@{ks}, MAP@R, R-Prec.)", t_r, c_r, m_r, ("search ", t_s, c_s)))
    print(row("  part: the same, two steps as before (counts first, then lists)", t_2, c_2, m_2, ("search ", t_s, c_s)))
    print(row("  part: dml_book `count_ahead`, every query (R@K for every K)", t_c, c_c, m_c, ("search ", t_s, c_s)))
    print(row(f"  part: dml_book `count_ahead_knn`, every query (counts + lists of {depth}, one pass)", t_ck, c_ck, m_ck,
              ("search ", t_s, c_s)))
    print(f"\nratios: evaluate / PML = {t_ours / t_pml:.2f} wall, {c_ours / c_pml:.2f} CPU (target <= 0.4); "
          f"evaluate / floor = {t_ours / t_fl:.2f} wall, {c_ours / c_fl:.2f} CPU (target <= 1.3); "
          f"retrieval metrics, evaluate's choice / two steps = {t_r / t_2:.2f} wall, {c_r / c_2:.2f} CPU "
          f"(same numbers: {one == two_out})")
    print("\n| metric | dml_book | PML |\n| --- | ---: | ---: |")
    for ours_key, pml_key in (("R@1", "precision_at_1"), ("NMI", "NMI"), ("MAP@R", "mean_average_precision_at_r"),
                              ("R-Precision", "r_precision")):
        print(f"| {ours_key} | {ours[ours_key]:.4f} | {pml[pml_key]:.4f} |")
    print("| " + " | ".join(f"{key} {val:.4f}" for key, val in ours.items() if key not in ("R@1", "NMI", "MAP@R", "R-Precision")) + " | | |")


if __name__ == "__main__":
    main()
