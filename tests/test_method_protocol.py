"The method protocol: a method object trains through `Trainer(cfg, method=...)`, methods declare their optimisers, every method chapter is registered and listed."
import json, re
from pathlib import Path
import numpy as np, torch, yaml
from dml_book.methods import Baseline, HDML, PADS, ALA
from dml_book.registry import METHODS
from dml_book.train import Trainer, TrainConfig

NBS = Path(__file__).resolve().parents[1]/"nbs"
TINY = dict(dataset="digits", embedding_dim=8, batch_size=20, m_per_class=4, epochs=1, max_steps_per_epoch=2, ks=(1,))

class Counting(Baseline):
    "The baseline, counting its steps: a class no registry knows."
    def __init__(self): super().__init__(); self.steps = 0
    def training_step(self, trainer, images, labels):
        self.steps += 1; return super().training_step(trainer, images, labels)

def test_trainer_trains_the_method_object_it_is_given(tmp_path):
    m = Counting()
    tr = Trainer(TrainConfig(**TINY, out=str(tmp_path)), method=m)
    assert tr.method is m
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.fit()
    assert m.steps == 2 and any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    assert Trainer(TrainConfig(**TINY, out=str(tmp_path/"b")), method="pads").cfg.method == "pads"   # a name still works

def test_methods_declare_their_optimisers(tmp_path):
    assert Baseline().optimizers() == []
    tr = Trainer(TrainConfig(**TINY, method="hdml", out=str(tmp_path)))
    assert tr.method.optimizers() == [tr.method.opt_gen, tr.method.opt_softmax]
    p = PADS(); assert p.optimizers() == [p.learner.optimizer]
    a = ALA(); assert a.optimizers() == []   # the assessor's optimiser is built in setup

def test_every_method_chapter_is_registered_in_the_sidebar_and_on_the_home_page():
    sidebar = (NBS/"sidebar.yml").read_text()
    index = "".join("".join(c["source"]) for c in json.loads((NBS/"index.ipynb").read_text())["cells"])
    chapters = sorted(p for p in NBS.glob("2*_methods.*.ipynb"))
    assert len(chapters) >= 6
    for p in chapters:
        assert p.name in sidebar, f"{p.name} is not in nbs/sidebar.yml"
        module = p.stem.split("_", 1)[1]   # e.g. methods.pads
        if module.endswith("_policy"): continue   # a part of the PADS chapter, not a method of its own
        name = module.split(".")[1]
        assert name in METHODS.names(), f"{p.name}: method {name!r} is not registered (dml_book/methods/__init__.py)"
        assert f"]({module}.html)" in index, f"{p.name} is not in the methods table of nbs/index.ipynb"
