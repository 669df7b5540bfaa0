"Every method under torchrun: one step of two gloo processes x batch B against one process x batch 2B."
from types import SimpleNamespace
import numpy as np, pytest, torch, torch.nn as nn
from dml_book.distributed import DistContext, run_local
from dml_book.losses import TripletLoss
from dml_book.miners import SemiHardMiner
from dml_book.models import EmbeddingNet
from dml_book.train import Trainer, precision_view
from dml_book.methods.base import TrainerView
from dml_book.methods.ala import ALA
from dml_book.methods.hdml import HDML
from dml_book.methods.dcml import DCML
from dml_book.methods.pads import PADS, init_probs
from dml_book.methods.dmml import DMML, ClassShare

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py: one thread, dtype restored after each test
N_CLASSES, PER_CLASS = 4, 4   # the global batch: 4 classes x 4 images


def stand_in(method, rank: int, world: int, loss_fn, miner=None):
    "A `TrainerView` of the methods' hooks, wired with the real `Trainer` code for gather, groups, sync and the step."
    torch.manual_seed(0)
    model = EmbeddingNet(nn.Sequential(nn.Linear(8, 10), nn.Tanh()), 10, 6)
    cfg = SimpleNamespace(seed=0, lr_backbone=0.3, lr_head=0.5, embedding_dim=6, m_per_class=PER_CLASS)
    tr = SimpleNamespace(cfg=cfg, device=torch.device("cpu"), model=model, loss_fn=loss_fn, miner=miner, method=method,
                         train_ds=SimpleNamespace(labels=np.arange(N_CLASSES).repeat(PER_CLASS)), dist=DistContext(rank, world),
                         optimizer=None, epoch=1, step=0, steps_per_epoch=1)
    tr.gather = lambda z, l: Trainer.gather(tr, z, l)
    precision_view(tr)
    tr.embed_dataset = lambda ds, batch_size=256: Trainer.embed_dataset(tr, ds, batch_size)
    method.setup(tr)
    return tr


def finish(tr, world):
    "The main optimiser (plain SGD: Adam's first step is sign-like and would magnify rounding) and, with >1 rank, the sync."
    tr.optimizer = torch.optim.SGD(Trainer.param_groups(tr))
    assert isinstance(tr, TrainerView)   # every member a method may use
    if world > 1: Trainer._synchronise(tr)   # broadcast rank 0's state; hook the main and the method's optimisers
    tr.start = params_of(tr)


def params_of(tr):
    params = {f"model.{k}": v.detach().clone() for k, v in tr.model.state_dict().items()}
    return params | {f"method.{k}": v.detach().clone() for k, v in tr.method.state_dict().items() if torch.is_tensor(v)}


def data(rank: int, world: int):
    "Rank `rank`'s contiguous share of a fixed global batch (rank order = the single process's order)."
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(N_CLASSES * PER_CLASS, 8, generator=g), torch.arange(N_CLASSES).repeat_interleave(PER_CLASS)
    share = slice(rank * len(y) // world, (rank + 1) * len(y) // world)
    return x[share], y[share]


def save(tr, logs, path, **extra):
    torch.save(dict(logs=logs, params=params_of(tr), start=tr.start, **extra), path)


def hdml_step(rank: int, world: int, out: str):
    "Two HDML steps (window 1: the second step uses lambda and the eq. (11) weight from the first)."
    torch.set_num_threads(1); torch.set_default_dtype(torch.float64)
    tr = stand_in(HDML(hidden=12, window=1, lr_gen=0.2, lr_softmax=0.2), rank, world, TripletLoss(margin=0.2))
    m = tr.method   # its own optimisers, swapped for SGD like the main one; still attributes, so the trainer hooks them
    m.opt_gen, m.opt_softmax = torch.optim.SGD(m.generator.parameters(), lr=0.2), torch.optim.SGD(m.classifier.parameters(), lr=0.2)
    finish(tr, world)
    x, y = data(rank, world)
    logs = [Trainer.training_step(tr, x, y) for _ in range(2)]
    save(tr, logs, f"{out}/hdml-{world}-{rank}.pt", avgs=(m.j_avg.value, m.j_gen_avg.value), rng=m.rng.get_state())


def dcml_step(rank: int, world: int, out: str):
    "One DCML step with a semi-hard miner for J_dis and every subtask."
    torch.set_num_threads(1); torch.set_default_dtype(torch.float64)
    tr = stand_in(DCML(n_learners=2, n_compositors=3), rank, world, TripletLoss(margin=0.2), SemiHardMiner(margin=0.2))
    finish(tr, world)
    x, y = data(rank, world)
    save(tr, [Trainer.training_step(tr, x, y)], f"{out}/dcml-{world}-{rank}.pt")


def pads_step(rank: int, world: int, out: str):
    "One PADS step with a fixed distribution (the sampling and the loss; the policy is tested on a real Trainer below)."
    torch.set_num_threads(1); torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)   # the (unused) policy network's initialisation
    class FixedPADS(PADS):   # the stand-in has no dataset to hold a reward split out of: the initial distribution only
        def setup(self, trainer): self.distribution.set_probs(init_probs("uniform_low", self.distribution.centers))
    tr = stand_in(FixedPADS(adapt=False), rank, world, TripletLoss(margin=0.2))
    finish(tr, world)
    x, y = data(rank, world)
    save(tr, [Trainer.training_step(tr, x, y)], f"{out}/pads-{world}-{rank}.pt", generator=tr.method.generator.get_state())


def pads_policy_steps(rank: int, out: str):
    "Three PADS iterations with a policy step after each, on a real Trainer (digits) in 2 processes."
    torch.set_num_threads(1)
    tr = Trainer(dataset="digits", method="pads", embedding_dim=8, batch_size=8, m_per_class=4, out=out,
                 method_kwargs=dict(update_every=1, hidden=(16,), n_bins=10))
    m, batches = tr.method, iter(tr.loader)
    start = params_of(tr)
    logs = [tr.training_step(*next(batches)) for _ in range(3)]
    torch.save(dict(logs=logs, params=params_of(tr), start=start, trajectory=m.trajectory, s_prev=m.s_prev,
                    hooked=any(o is m.learner.optimizer for o in m.optimizers())),
               f"{out}/policy-{rank}.pt")


def dmml_step(rank: int, world: int, out: str):
    "One DMML step on an episode of 4 classes x (2 support + 2 query), split by class across the ranks."
    torch.set_num_threads(1); torch.set_default_dtype(torch.float64)
    tr = stand_in(DMML(n_classes=4, n_support=2, n_query=2, feature_penalty=0.01), rank, world, TripletLoss())
    finish(tr, world)
    x, y = data(rank, world)
    save(tr, [Trainer.training_step(tr, x, y)], f"{out}/dmml-{world}-{rank}.pt")


def ala_step(rank: int, world: int, out: str, same_episode: bool):
    "One ALA iteration; each rank gets its own episode, or both the same one."
    torch.set_num_threads(1); torch.set_default_dtype(torch.float64)
    tr = stand_in(ALA(n_train=8, n_val=4, meta_steps=2, max_tuples=20, hidden_size=5, num_layers=1), rank, world,
                  TripletLoss(margin=0.5))
    finish(tr, world)
    g = torch.Generator().manual_seed(10 + (0 if same_episode else rank))
    x = torch.randn(12, 8, generator=g)
    y = torch.cat([torch.arange(2).repeat_interleave(4), 2 + torch.arange(2).repeat_interleave(2)])
    logs = Trainer.training_step(tr, x, y)
    save(tr, [logs], f"{out}/ala{int(same_episode)}-{world}-{rank}.pt", state=tr.method.state,
         generator=tr.method.generator.get_state(), assessor_opt=tr.method.assessor_opt.state_dict()["state"])


def load(path): return torch.load(path, weights_only=False)


def assert_same_params(a, b, atol):
    assert a.keys() == b.keys()
    for k in a: torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=lambda m: f"{k}: {m}")


def moved(res, prefix):
    "The largest change of a parameter whose name starts with `prefix` during the step."
    return max((res["params"][k] - res["start"][k]).abs().max().item() for k in res["params"] if k.startswith(prefix))


def single_process(fn, *args):
    "Run `fn(0, 1, *args)` here (it switches to float64; the `one_thread` fixture restores the default dtype)."
    fn(0, 1, *args)


@pytest.mark.parametrize("name,fn", [("hdml", hdml_step), ("dcml", dcml_step), ("pads", pads_step), ("dmml", dmml_step)])
def test_two_processes_take_the_single_process_step_with_the_doubled_batch(name, fn, tmp_path):
    single_process(fn, str(tmp_path))
    run_local(fn, 2, 2, str(tmp_path))
    single, ranks = load(tmp_path/f"{name}-1-0.pt"), [load(tmp_path/f"{name}-2-{r}.pt") for r in range(2)]
    assert_same_params(ranks[0]["params"], ranks[1]["params"], atol=0)   # bitwise identical across ranks
    for multi in ranks:
        for ls, lm in zip(single["logs"], multi["logs"]):
            for k in ls: assert abs(ls[k] - lm[k]) < 1e-5, (k, ls[k], lm[k])
        assert_same_params(multi["params"], single["params"], atol=1e-5)
    assert moved(single, "model.") > 1e-3   # the step did move the model
    if name in ("hdml", "dcml"): assert moved(single, "method.") > 1e-3   # ... and the method's own modules
    if name == "hdml":
        for multi in ranks:
            assert multi["avgs"] == pytest.approx(single["avgs"], abs=1e-6) and np.isfinite(single["avgs"]).all()
            assert torch.equal(multi["rng"], single["rng"])
    if name == "pads":   # the same triplet draws, from the method's own generator
        for multi in ranks: assert torch.equal(multi["generator"], single["generator"])


def test_pads_policy_is_one_policy_on_every_rank(tmp_path):
    run_local(pads_policy_steps, 2, str(tmp_path))
    r0, r1 = (load(tmp_path/f"policy-{r}.pt") for r in range(2))
    assert r0["hooked"]   # the policy's optimiser is an attribute of the method: the trainer averages its gradients
    # batch-norm running statistics follow each rank's own batches (the trainer does not synchronise buffers); the rest:
    same = lambda r: {k: v for k, v in r["params"].items() if not k.split(".")[-1] in ("running_mean", "running_var", "num_batches_tracked")}
    assert_same_params(same(r0), same(r1), atol=0)            # model, policy, old policy, distribution p
    assert r0["trajectory"] == r1["trajectory"] and len(r0["trajectory"]) == 4
    assert r0["trajectory"][-1] != r0["trajectory"][0]       # the policy did act on p
    torch.testing.assert_close(r0["s_prev"], r1["s_prev"], atol=0, rtol=0)
    assert [l["val_R@1"] for l in r0["logs"]] == [l["val_R@1"] for l in r1["logs"]]
    assert "reward" in r0["logs"][-1] and r0["logs"][-1]["policy_loss"] == r1["logs"][-1]["policy_loss"]
    assert moved(r0, "method.learner.policy.") > 0           # the policy was updated (the same update on both ranks)


def test_ala_ranks_stay_identical_with_their_own_episodes(tmp_path):
    run_local(ala_step, 2, 2, str(tmp_path), False)
    r0, r1 = (load(tmp_path/f"ala0-2-{r}.pt") for r in range(2))
    assert r0["logs"][0]["loss"] != r1["logs"][0]["loss"]                 # really different episodes
    assert_same_params(r0["params"], r1["params"], atol=0)                 # model and assessor
    for a, b in zip(r0["state"], r1["state"]): assert torch.equal(a, b)    # the carried LSTM state
    assert torch.equal(r0["generator"], r1["generator"])
    for k in r0["assessor_opt"]:
        for n in ("exp_avg", "exp_avg_sq"): assert torch.equal(r0["assessor_opt"][k][n], r1["assessor_opt"][k][n])


def test_ala_two_ranks_on_one_episode_take_the_single_process_step(tmp_path):
    single_process(ala_step, str(tmp_path), True)
    run_local(ala_step, 2, 2, str(tmp_path), True)
    single = load(tmp_path/"ala1-1-0.pt")
    for r in range(2):
        multi = load(tmp_path/f"ala1-2-{r}.pt")
        assert abs(multi["logs"][0]["loss"] - single["logs"][0]["loss"]) < 1e-12
        assert_same_params(multi["params"], single["params"], atol=1e-10)
        for a, b in zip(multi["state"], single["state"]): torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    assert moved(single, "model.") > 1e-4 and moved(single, "method.") > 1e-6


def test_dmml_ranks_share_each_episode_by_class():
    "ClassShare: the ranks' blocks of classes, in rank order, are the single process's episodes."
    labels = np.repeat(np.arange(12), 5)
    make = lambda r, w: DMML(n_classes=4, n_support=2, n_query=1).batch_sampler(SimpleNamespace(
        train_ds=SimpleNamespace(labels=labels), cfg=SimpleNamespace(seed=3), dist=DistContext(r, w)))
    single, shares = make(0, 1), [make(r, 2) for r in range(2)]
    assert isinstance(shares[0], ClassShare) and len(shares[0]) == len(single)
    for s in (single, *shares): s.set_epoch(2)
    for task, *parts in zip(single, *shares):
        assert sum(parts, []) == task and len(task) == 4 * 3
        assert not set(labels[parts[0]]) & set(labels[parts[1]])   # each class on one rank, with all its images
    with pytest.raises(ValueError, match="n_classes=4 must be divisible by the 3 processes"): make(0, 3)
