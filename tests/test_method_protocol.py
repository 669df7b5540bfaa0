"""The method protocol: a method object trains through `Trainer(cfg, method=...)`, the trainer owns the step, methods see a
`TrainerView`, declare their optimisers, and every method chapter is registered under its module name; 08a's toy trains under torchrun."""
import ast, inspect, json, re, subprocess, sys
from pathlib import Path
import numpy as np, pytest, torch, yaml
import dml_book.methods
from dml_book.methods import Baseline, HDML, PADS, ALA
from dml_book.methods.base import Method, TrainerView
from dml_book.registry import METHODS
from dml_book.train import Trainer, TrainConfig, precision_view

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/"nbs"
TINY = dict(dataset="digits", embedding_dim=8, batch_size=20, m_per_class=4, epochs=1, max_steps_per_epoch=2, ks=(1,))

class Counting(Baseline):
    "The baseline on the first anchor's triplets only, counting its steps: a class no registry knows."
    def __init__(self): super().__init__(); self.steps, self.seen = 0, []
    def tuples(self, trainer, embeddings, labels):
        a, p, n = trainer.miner(embeddings, labels); keep = a == a[0]
        self.seen.append(int(keep.sum())); return a[keep], p[keep], n[keep]
    def after_step(self, trainer, logs):
        self.steps += 1; return {"n_steps": self.steps}

def test_trainer_trains_the_method_object_it_is_given(tmp_path):
    m = Counting()
    tr = Trainer(TrainConfig(**TINY, miner="semihard", out=str(tmp_path)), method=m)
    assert tr.method is m
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.fit()
    assert m.steps == 2 and any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    assert [r["n_steps"] for r in tr.history if r["kind"] == "step"] == [1, 2]   # after_step's values are logged
    assert len(m.seen) == 2 and 0 < max(m.seen)                                   # the loss saw the `tuples` hook's choice
    assert Trainer(TrainConfig(**TINY, out=str(tmp_path/"b")), method="pads").cfg.method == "pads"   # a name still works

def test_methods_declare_their_optimisers(tmp_path):
    assert Baseline().optimizers() == []
    tr = Trainer(TrainConfig(**TINY, method="hdml", out=str(tmp_path)))
    assert tr.method.optimizers() == [tr.method.opt_gen, tr.method.opt_softmax]
    p = PADS(); assert p.optimizers() == [p.learner.optimizer]
    a = ALA(); assert a.optimizers() == []   # the assessor's optimiser is built in setup

def test_every_method_chapter_is_registered_under_its_module_name():
    "The chapters that register a method (tools/navigation.py reads them, and checks the naming rule) are in `METHODS`."
    sys.path.insert(0, str(ROOT/"tools"))
    import navigation
    chapters = navigation.method_chapters(navigation.chapters()[0])
    assert len(chapters) >= 5
    for c in chapters:
        assert c.methods[0] in METHODS.names(), (f"nbs/{c.path}: method {c.methods[0]!r} is not registered: run nbdev-export "
                                                 f"(dml_book/methods/__init__.py imports every module of the package's methods)")


def test_the_trainer_takes_the_step_on_the_tuples_a_method_chooses():
    "`Trainer.training_step` == zero_grad, backward and step of the configured loss on the hook's tuples."
    torch.manual_seed(0)
    from types import SimpleNamespace
    from dml_book.losses import TripletLoss
    model, ref = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    ref.load_state_dict(model.state_dict())
    class Fixed(Baseline):
        def tuples(self, trainer, embeddings, labels): return torch.tensor([0, 2]), torch.tensor([1, 3]), torch.tensor([4, 5])
    tr = precision_view(SimpleNamespace(model=model, loss_fn=TripletLoss(margin=1.0, normalize=False), miner=None, gather=lambda z, y: (z, y), method=Fixed(),
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.1)))
    x, y = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    logs = Trainer.training_step(tr, x, y)
    z = ref(x); d = lambda i, j: (z[i] - z[j]).norm(dim=1)
    want = torch.relu(d([0, 2], [1, 3]) - d([0, 2], [4, 5]) + 1.0)
    want = want.sum() / max(1, int((want > 0).sum()))   # the mean over the non-zero terms (the library's default)
    want.backward()
    with torch.no_grad():
        for p in ref.parameters(): p -= 0.1 * p.grad
    assert logs == {"loss": pytest.approx(want.item(), rel=1e-6)}
    torch.testing.assert_close(model.weight, ref.weight)


VIEW = {n for n in TrainerView.__annotations__} | {n for n, v in vars(TrainerView).items() if inspect.isfunction(v)}

def test_the_trainer_is_a_trainer_view_and_methods_use_nothing_else(tmp_path):
    tr = Trainer(TrainConfig(**TINY, out=str(tmp_path)))
    assert isinstance(tr, TrainerView) and tr.steps_per_epoch == 2
    used = {}
    for path in sorted((ROOT/"dml_book"/"methods").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
                used.setdefault(node.attr, set()).add(path.name)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") and \
               isinstance(node.args[0], ast.Name) and node.args[0].id == "trainer":
                used.setdefault("getattr(trainer, ...)", set()).add(path.name)
    outside = {k: v for k, v in used.items() if k not in VIEW}
    assert not outside, f"methods use trainer members outside TrainerView: {outside}"
    assert {"model", "loss_fn", "gather", "optimizer", "steps_per_epoch"} <= set(used)   # the walk does see the methods


def test_only_the_documented_custom_steps_step_an_optimiser():
    "Every `.step()`/`.backward()` in dml_book/methods sits in a `custom_step` (HDML, ALA), PADS's policy learner, or the plain loop's stand-in for the trainer."
    found = []
    for path in sorted((ROOT/"dml_book"/"methods").glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)): continue
            calls = {n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
            if calls & {"step", "backward", "backward_and_step", "step_optimizers"}: found.append(f"{path.stem}.{fn.name}")   # the last two: the trainer's scaler-aware steps
    loop = ["base.backward_and_step", "base.method_step", "base.step_optimizers"]   # `LoopView`/`method_step`: the trainer's step for a plain loop
    assert sorted(found) == sorted(["ala.custom_step", "hdml.custom_step", "pads_policy.update", *loop]), found
    for cls in (Baseline, PADS):   # the trainer's step for these: no custom step of their own
        assert cls.custom_step is Method.custom_step


TOY = """
import json, sys, torch
from pathlib import Path
import dml_book.methods.base as base
from dml_book.train import Trainer, TrainConfig
cells = json.loads(Path(sys.argv[1]).read_text())["cells"]
src = next("".join(c["source"]) for c in cells if "class SpreadOut(Method)" in "".join(c["source"]))
ns = {"torch": torch, "Method": base.Method, "TrainerView": base.TrainerView}
exec(src, ns)   # the chapter's cell as it stands
cfg = TrainConfig(dataset="glyphs", dataset_kwargs=dict(size=16, per_font=1), embedding_dim=16, batch_size=8, m_per_class=4,
                  epochs=1, max_steps_per_epoch=3, ks=(1,), out=sys.argv[2])
tr = Trainer(cfg, method=ns["SpreadOut"](weight=0.1))
start = {k: v.clone() for k, v in tr.model.state_dict().items()}
tr.fit()
torch.save(dict(start=start, params=tr.model.state_dict(), generator=tr.method.generator.get_state(), world=tr.dist.world_size,
                steps=[r for r in tr.history if r["kind"] == "step"]), f"{sys.argv[2]}/rank{tr.dist.rank}.pt")
"""

@pytest.mark.slow
def test_the_toy_method_of_08a_trains_under_torchrun(tmp_path):
    "The toy of 08a's last section, exactly as the chapter defines it, in two gloo processes: one model, the same triplets."
    script = tmp_path/"toy.py"; script.write_text(TOY)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
                        str(NBS/"08a_methods.base.ipynb"), str(tmp_path/"run")], capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path/"run"/f"rank{k}.pt", weights_only=False) for k in range(2))
    assert r0["world"] == 2 and len(r0["steps"]) == 3
    stats = ("running_mean", "running_var", "num_batches_tracked")   # batch norm: each rank's own batches
    for k, v in r0["params"].items():
        if k.split(".")[-1] in stats: continue
        assert torch.equal(v, r1["params"][k]), k                      # gradients averaged: one model on both ranks
    assert any(not torch.equal(v, r0["start"][k]) for k, v in r0["params"].items())   # and it trained
    assert torch.equal(r0["generator"], r1["generator"])              # the same negative draws on both ranks
    for a, b in zip(r0["steps"], r1["steps"]):                        # the global batch's loss and penalty on both
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6) and a["spread"] == pytest.approx(b["spread"], rel=1e-6)
        assert np.isfinite(a["loss"]) and 0 <= a["spread"] <= 1
    assert json.loads((tmp_path/"run"/"metrics.json").read_text())["final"]["R@1"] > 0


def test_the_plain_loop_view_is_a_trainer_view_and_nothing_more():
    "`LoopView` (the chapters' \"In your own loop\") holds every member of `TrainerView` and, besides them, only the method it embeds with."
    import dataclasses, torch
    from dml_book.methods.base import LoopView, TrainerView
    declared = set(TrainerView.__annotations__) | {n for n in vars(TrainerView) if not n.startswith("_") and callable(vars(TrainerView)[n])}
    view = LoopView(torch.nn.Linear(2, 2), torch.nn.MSELoss(), train_ds=None, cfg=None)
    assert isinstance(view, TrainerView)
    mine = {f.name for f in dataclasses.fields(LoopView)} | {n for n in vars(LoopView) if not n.startswith("_") and callable(vars(LoopView)[n])}
    assert mine - declared == {"method"} and declared <= mine, (mine - declared, declared - mine)
