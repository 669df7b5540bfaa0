"Two gloo processes on this machine train exactly like one process with the doubled batch."
import json, subprocess, sys
from pathlib import Path
from types import SimpleNamespace
import numpy as np, pytest, torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from dml_book.distributed import (DistContext, gather_batch, gather_shards, sync_optimizer, broadcast_state, run_local,
                                  init_distributed, on_main)
from dml_book.losses import ContrastiveLoss, TripletLoss, ProxyAnchorLoss
from dml_book.miners import SemiHardMiner, DistanceWeightedMiner
from dml_book.methods.base import Baseline
from dml_book.train import Trainer, LabelledSubset, precision_view

SETUPS = {"pair": lambda: (ContrastiveLoss(pos_margin=0.1, neg_margin=0.6), None),
          "triplet+semihard": lambda: (TripletLoss(margin=0.2), SemiHardMiner(margin=0.2)),
          "triplet+distance_weighted": lambda: (TripletLoss(margin=0.2), DistanceWeightedMiner(cutoff=0.5, nonzero_loss_cutoff=1.4)),
          "proxy": lambda: (ProxyAnchorLoss(num_classes=4, embedding_size=6), None)}


class Net(nn.Module):
    def __init__(self): super().__init__(); self.fc = nn.Linear(8, 6)
    def forward(self, x): return F.normalize(self.fc(x), dim=1)


def one_step(rank: int, world: int, setup: str, out: str):
    "One Baseline step on rank `rank`'s share of a fixed global batch of 16 (4 classes x 4)."
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    x, y = torch.randn(16, 8), torch.arange(4).repeat_interleave(4)
    model = Net(); loss_fn, miner = SETUPS[setup]()
    if world > 1: broadcast_state(model); broadcast_state(loss_fn)
    start = [p.detach().clone() for p in [*model.parameters(), *loss_fn.parameters()]]
    opt = torch.optim.SGD([*model.parameters(), *loss_fn.parameters()], lr=0.5)
    if world > 1: sync_optimizer(opt)
    trainer = precision_view(SimpleNamespace(model=model, loss_fn=loss_fn, miner=miner, optimizer=opt, method=Baseline(),
                              gather=gather_batch if world > 1 else (lambda z, l: (z, l))))
    share = slice(rank * 16 // world, (rank + 1) * 16 // world)
    torch.manual_seed(1)   # the miner's draws
    logs = Trainer.training_step(trainer, x[share], y[share])
    torch.save(dict(loss=logs["loss"], start=start, params=[p.detach().clone() for p in [*model.parameters(), *loss_fn.parameters()]]),
               f"{out}/{setup}-{world}-{rank}.pt")


@pytest.mark.parametrize("setup", list(SETUPS))
def test_two_processes_take_the_same_step_as_one_with_twice_the_batch(setup, tmp_path):
    prev = torch.get_default_dtype()
    try: one_step(0, 1, setup, tmp_path)     # here, in float64
    finally: torch.set_default_dtype(prev)
    run_local(one_step, 2, 2, setup, str(tmp_path))
    single = torch.load(tmp_path/f"{setup}-1-0.pt")
    for rank in range(2):
        multi = torch.load(tmp_path/f"{setup}-2-{rank}.pt")
        assert abs(multi["loss"] - single["loss"]) < 1e-5
        for a, b in zip(multi["params"], single["params"]): torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert any((p - q).abs().max() > 1e-3 for p, q in zip(single["params"], single["start"]))  # the step did move them


def gathered_gradient(rank: int, out: str):
    z = (torch.arange(12.).reshape(4, 3) + 100 * rank).requires_grad_()
    g, labels = gather_batch(z, torch.full((4,), rank))
    (g ** 2).sum().backward()   # every rank: the same global loss
    torch.save(dict(grad=z.grad, labels=labels), f"{out}/grad-{rank}.pt")


def test_gathered_embeddings_carry_gradient_to_their_own_rank(tmp_path):
    run_local(gathered_gradient, 2, str(tmp_path))
    for rank in range(2):
        r = torch.load(tmp_path/f"grad-{rank}.pt")
        z = torch.arange(12.).reshape(4, 3) + 100 * rank
        torch.testing.assert_close(r["grad"], 2 * (2 * z))   # world_size x dL/dz; None with a plain all_gather
        torch.testing.assert_close(r["labels"], torch.tensor([0] * 4 + [1] * 4))


def rank_zero_result(rank: int, out: str):
    calls = []
    res = on_main(init_distributed(), lambda x, y: calls.append((x, y)) or {"rank": rank, "sum": x + y}, 3, y=4)
    torch.save(dict(res=res, calls=calls), f"{out}/on-main-{rank}.pt")


def test_on_main_computes_on_rank_zero_and_every_rank_receives_its_result(tmp_path):
    run_local(rank_zero_result, 2, str(tmp_path))
    for rank in range(2):
        r = torch.load(tmp_path/f"on-main-{rank}.pt")
        assert r["res"] == {"rank": 0, "sum": 7}                   # rank 0's result everywhere
        assert r["calls"] == ([(3, 4)] if rank == 0 else [])       # computed once, on rank 0


def test_on_main_in_one_process_is_a_plain_call():
    calls = []
    assert on_main(DistContext(), lambda x, y: calls.append((x, y)) or x * y, 3, y=4) == 12
    assert calls == [(3, 4)]


def sharded_eval(rank: int, out: str):
    t = Trainer(dataset="digits", embedding_dim=8, batch_size=8, m_per_class=4, out=out)
    t.test_ds = LabelledSubset(t.test_ds, np.arange(len(t.test_ds) - 1))   # odd size: 895
    emb, labels = t.embed_dataset(t.test_ds, batch_size=100)
    torch.save(dict(metrics=t.evaluate(), emb=emb), f"{out}/eval-{t.dist.world_size}-{rank}.pt")


def test_sharded_evaluation_equals_single_process_on_an_odd_sized_split(tmp_path):
    sharded_eval(0, str(tmp_path))
    run_local(sharded_eval, 2, str(tmp_path))
    single = torch.load(tmp_path/"eval-1-0.pt")
    assert len(single["emb"]) % 2 == 1
    for rank in range(2):
        multi = torch.load(tmp_path/f"eval-2-{rank}.pt")
        assert multi["metrics"] == single["metrics"]                  # rank 0's metrics, broadcast
    torch.testing.assert_close(torch.load(tmp_path/"eval-2-0.pt")["emb"], single["emb"], atol=1e-6, rtol=0)
    assert torch.load(tmp_path/"eval-2-1.pt")["emb"] is None          # gathered on rank 0 only


def gathered_shares(rank: int, out: str):
    x = torch.arange(3 * (rank + 2), dtype=torch.float32).reshape(-1, 3) + 100 * rank   # 2 rows, then 3: uneven
    torch.save(dict(all=gather_shards(x), to0=gather_shards(x, dst=0), to1=gather_shards(x, dst=1)), f"{out}/shares-{rank}.pt")


def test_gather_shards_everywhere_or_on_one_rank(tmp_path):
    run_local(gathered_shares, 2, str(tmp_path))
    whole = torch.cat([torch.arange(6.).reshape(2, 3), torch.arange(9.).reshape(3, 3) + 100])
    r0, r1 = (torch.load(tmp_path/f"shares-{r}.pt") for r in range(2))
    torch.testing.assert_close(r0["all"], whole); torch.testing.assert_close(r1["all"], whole)
    torch.testing.assert_close(r0["to0"], whole); assert r1["to0"] is None
    torch.testing.assert_close(r1["to1"], whole); assert r0["to1"] is None


def test_torchrun_training_resumes_in_a_single_process(tmp_path):
    args = ["train", "--dataset", "digits", "--embedding-dim", "8", "--batch-size", "8", "--m-per-class", "4",
            "--max-steps-per-epoch", "4", "--no-umap", "--no-progress", "--out", str(tmp_path)]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "dml_book.cli", *args, "--epochs", "1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("untrained  trained") == 1 and r.stdout.count("epoch 1/1") == 1   # rank 0 alone prints the table and the epoch lines
    log = [json.loads(l) for l in (tmp_path/"log.jsonl").read_text().splitlines()]
    assert [l["step"] for l in log if l["kind"] == "step"] == [1, 2, 3, 4]   # logged once, not once per rank
    r = subprocess.run([sys.executable, "-m", "dml_book.cli", *args, "--epochs", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path/"metrics.json").read_text())
    assert [e["epoch"] for e in m["epochs"]] == [0, 1, 2] and np.isfinite(m["final"]["R@1"])
