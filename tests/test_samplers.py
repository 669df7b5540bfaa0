"Structure of every batch, episode and task; determinism; disjoint DDP shares."
import numpy as np, pytest, torch
from torch.utils.data import DataLoader, TensorDataset
from dml_book.distributed import run_local
from dml_book.samplers import ClassBalancedBatchSampler, EpisodeSampler, TaskSampler, class_index, ddp_share

def uneven_labels(n_classes=40, seed=0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 12, n_classes)
    return rng.permutation(np.repeat(np.arange(n_classes), sizes))  # shuffled, like a real index file

def test_class_index_matches_loop():
    labels = uneven_labels()
    groups = class_index(labels)
    for c in range(labels.max() + 1):
        assert groups[c].tolist() == [i for i, l in enumerate(labels) if l == c]

@pytest.mark.parametrize("batch_size,m", [(16, 4), (12, 2), (10, 5)])
def test_class_balanced_structure(batch_size, m):
    labels = uneven_labels()
    s = ClassBalancedBatchSampler(labels, batch_size, m, seed=3)
    assert len(s) == len(labels) // batch_size
    batches = list(s)
    assert len(batches) == len(s)
    for b in batches:
        lab = labels[b].reshape(batch_size // m, m)
        assert (lab == lab[:, :1]).all() and len(set(lab[:, 0])) == batch_size // m
        for row, idx in zip(lab[:, 0], np.array(b).reshape(-1, m)):
            if (labels == row).sum() >= m: assert len(set(idx)) == m   # without replacement when possible
    # every class appears, and about equally often (shuffled passes over the classes)
    counts = np.bincount(labels[np.concatenate(batches)] , minlength=40) // m
    assert counts.min() >= 1 and counts.max() - counts.min() <= 2

def test_class_balanced_epochs_and_seeds():
    labels = uneven_labels()
    s = ClassBalancedBatchSampler(labels, 16, 4, seed=0)
    e0 = list(s); assert list(s) == e0
    s.set_epoch(1); e1 = list(s); assert e1 != e0
    s2 = ClassBalancedBatchSampler(labels, 16, 4, seed=0); s2.set_epoch(1); assert list(s2) == e1
    assert list(ClassBalancedBatchSampler(labels, 16, 4, seed=1)) != e0

@pytest.mark.parametrize("world_size", [2, 3])
def test_class_balanced_ddp_shares(world_size):
    labels = uneven_labels()
    shards = [ClassBalancedBatchSampler(labels, 8, 4, seed=5, rank=r, world_size=world_size) for r in range(world_size)]
    for s in shards: s.set_epoch(2)
    assert {len(s) for s in shards} == {len(labels) // (8 * world_size)}
    whole = ClassBalancedBatchSampler(labels, 8 * world_size, 4, seed=5); whole.set_epoch(2)
    for step in zip(*shards, whole):
        parts, full = step[:-1], step[-1]
        assert sum(parts, []) == full                                  # shares tile the global batch
        cls = [set(labels[p]) for p in parts]
        assert all(not (cls[i] & cls[j]) for i in range(world_size) for j in range(i))

def test_class_balanced_errors():
    labels = np.repeat(np.arange(5), 4)
    with pytest.raises(ValueError, match="needs 6 classes but the labels have only 5"): ClassBalancedBatchSampler(labels, 12, 2)
    with pytest.raises(ValueError, match="needs 6 classes but the labels have only 5"):
        ClassBalancedBatchSampler(labels, 6, 2, rank=1, world_size=2)
    with pytest.raises(ValueError, match="multiple of m_per_class 4"): ClassBalancedBatchSampler(labels, 10, 4)
    with pytest.raises(ValueError, match="rank 2 is not in range"): ClassBalancedBatchSampler(labels, 4, 2, rank=2, world_size=2)

def test_class_balanced_dataloader():
    labels = uneven_labels()
    ds = TensorDataset(torch.arange(len(labels)), torch.as_tensor(labels))
    dl = DataLoader(ds, batch_sampler=ClassBalancedBatchSampler(labels, 16, 4))
    n = 0
    for x, y in dl:
        assert y.tolist() == labels[x.numpy()].tolist() and sorted(torch.bincount(y).unique().tolist()) in ([0, 4], [4])
        n += 1
    assert n == len(labels) // 16

def test_episode_structure_and_ddp():
    labels = uneven_labels(60)
    s = EpisodeSampler(labels, n_train=30, n_val=10, m_per_class=5, seed=1)
    assert len(s) == len(labels) // 40
    for ep in s:
        assert len(ep) == 40
        tr, va = labels[ep[:30]], labels[ep[30:]]
        assert not set(tr) & set(va)
        assert sorted(np.unique(tr, return_counts=True)[1]) == [5] * 6
        assert sorted(np.unique(va, return_counts=True)[1]) == [5] * 2
    shards = [list(EpisodeSampler(labels, 30, 10, 5, episodes_per_epoch=4, seed=1, rank=r, world_size=3)) for r in range(3)]
    flat = [tuple(e) for sh in shards for e in sh]
    assert len(flat) == 12 and len(set(flat)) == 12
    default = EpisodeSampler(np.repeat(np.arange(30), 8))
    assert len(next(iter(default))) == 120 and len(default) == 240 // 120
    with pytest.raises(ValueError, match="needs 30 classes but the labels have only 24"):
        EpisodeSampler(np.repeat(np.arange(24), 8), 100, 50, 5)

def test_task_structure_and_ddp():
    labels = np.repeat(np.arange(20), [10] * 18 + [1, 3])
    s = TaskSampler(labels, n_classes=8, n_support=4, n_query=2, tasks_per_epoch=30, seed=2)
    assert (s.n_classes, s.n_support, s.n_query, s.n_labels, len(s)) == (8, 4, 2, 20, 30)
    short = {18: set(np.flatnonzero(labels == 18)), 19: set(np.flatnonzero(labels == 19))}
    for task in s:
        idx = np.array(task).reshape(8, 6); lab = labels[idx]
        assert (lab == lab[:, :1]).all() and len(set(lab[:, 0])) == 8
        for c, row in zip(lab[:, 0], idx):
            if c in short: assert set(row) <= short[c]                 # with replacement
            else: assert len(set(row)) == 6                            # support and query disjoint
    assert len(TaskSampler(np.repeat(np.arange(40), 6))) == 240 // 192
    a, b = [list(TaskSampler(labels, 8, 4, 2, 5, seed=2, rank=r, world_size=2)) for r in (0, 1)]
    whole = list(TaskSampler(labels, 8, 4, 2, 10, seed=2))
    assert a == whole[0::2] and b == whole[1::2]

def test_ddp_share_from_torch_distributed(tmp_path):
    import torch.distributed as dist
    assert ddp_share() == (0, 1)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try: assert ClassBalancedBatchSampler(np.repeat(np.arange(4), 2), 4, 2).world_size == 1 and ddp_share() == (0, 1)
    finally: dist.destroy_process_group()

def _ddp_draws(rank, labels, out):
    "In a gloo process of `run_local`: each sampler's rank, as read from torch.distributed, and its draws at epoch 3."
    samplers = [ClassBalancedBatchSampler(labels, 8, 4, seed=7), EpisodeSampler(labels, 8, 4, 4, seed=7),
                TaskSampler(labels, 3, 2, 1, seed=7)]
    for s in samplers: s.set_epoch(3)
    torch.save(([s.rank for s in samplers], [list(s) for s in samplers]), f"{out}/{rank}.pt")

def test_shares_under_real_process_group(tmp_path):
    "Two processes in a gloo group: ranks come from torch.distributed, shares are those of explicit ranks and disjoint."
    labels, world = uneven_labels(), 2
    run_local(_ddp_draws, world, labels, str(tmp_path))   # spawned: a fork of a threaded pytest worker can hang in gloo
    got = {r: torch.load(tmp_path/f"{r}.pt") for r in range(world)}
    for r in range(world):
        ranks, draws = got[r]
        assert ranks == [r] * 3
        explicit = [ClassBalancedBatchSampler(labels, 8, 4, seed=7, rank=r, world_size=world),
                    EpisodeSampler(labels, 8, 4, 4, seed=7, rank=r, world_size=world),
                    TaskSampler(labels, 3, 2, 1, seed=7, rank=r, world_size=world)]
        for s in explicit: s.set_epoch(3)
        assert draws == [list(s) for s in explicit]
    for b0, b1 in zip(got[0][1][0], got[1][1][0]): assert not set(labels[b0]) & set(labels[b1])
