"""Benchmark: one epoch of class-balanced batches at Stanford Online Products scale, ours vs pytorch-metric-learning.

Labels shaped like SOP's training split (59,551 images, 11,318 classes of 2 to 12 images); batches of 120 images,
m_per_class = 2 (the SOP setting of most papers) and 4. Ours: `ClassBalancedBatchSampler` (yields batches);
PML: `MPerClassSampler` (yields the same number of indices, which a DataLoader then cuts into batches).
Both run in this process one after the other; the ratio is what to read, not the absolute times.

    .venv/bin/python benchmarks/samplers.py
"""
import time
import numpy as np
from pytorch_metric_learning.samplers import MPerClassSampler
from dml_book.samplers import ClassBalancedBatchSampler


def sop_like_labels(seed=0, n_classes=11_318, n_images=59_551):
    rng = np.random.default_rng(seed)
    sizes = 2 + rng.multinomial(n_images - 2 * n_classes, np.full(n_classes, 1 / n_classes))
    sizes = np.minimum(sizes, 12); sizes[: n_images - sizes.sum()] += 1
    return rng.permutation(np.repeat(np.arange(n_classes), sizes))


def best_of(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)


if __name__ == "__main__":
    labels = sop_like_labels()
    print(f"{len(labels)} images, {labels.max() + 1} classes")
    print(f"{'m':>3} {'batches':>8} {'ours (s)':>9} {'PML (s)':>8} {'PML/ours':>9}")
    for m in (2, 4):
        ours = ClassBalancedBatchSampler(labels, 120, m)
        n = len(ours) * 120
        pml = MPerClassSampler(labels, m, batch_size=120, length_before_new_iter=n)
        t_ours = best_of(lambda: sum(1 for _ in ours))
        t_pml = best_of(lambda: sum(1 for _ in pml))
        print(f"{m:>3} {len(ours):>8} {t_ours:>9.3f} {t_pml:>8.3f} {t_pml / t_ours:>9.2f}")
