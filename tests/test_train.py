"The training run as a user meets it: `dml-book train`, killed mid-epoch and resumed, and its one-line errors."
import json, os, signal, subprocess, sys, time
from pathlib import Path
import numpy as np, pytest

ARGS = ["--dataset", "digits", "--embedding-dim", "16", "--batch-size", "40", "--m-per-class", "8", "--epochs", "2",
        "--max-steps-per-epoch", "12", "--no-umap", "--no-progress"]


def _cli(*argv, **kw):
    return subprocess.Popen([sys.executable, "-m", "dml_book.cli", "train", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _steps_of_epoch(log: Path, epoch: int) -> int:
    if not log.exists(): return 0
    return sum(1 for line in log.read_text().splitlines() if line.strip() and (r := json.loads(line))["epoch"] == epoch and r["kind"] == "step")


def test_a_run_killed_mid_epoch_resumes_to_the_same_metrics(tmp_path):
    full = _cli(*ARGS, "--out", str(tmp_path/"full")); full.communicate()
    assert full.returncode == 0
    run = _cli(*ARGS, "--out", str(tmp_path/"killed"))
    deadline = time.time() + 600
    while _steps_of_epoch(tmp_path/"killed"/"log.jsonl", 2) < 3:   # in the middle of the second epoch
        assert run.poll() is None and time.time() < deadline, "the run ended before it could be interrupted"
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL); run.wait()
    assert json.loads((tmp_path/"killed"/"log.jsonl").read_text().splitlines()[-1])["epoch"] == 2
    assert not (tmp_path/"killed"/"metrics.json").exists()
    resumed = _cli(*ARGS, "--out", str(tmp_path/"killed")); out, err = resumed.communicate()
    assert resumed.returncode == 0, err
    a, b = (json.loads((tmp_path/d/"metrics.json").read_text()) for d in ("full", "killed"))
    assert a["final"] == b["final"] and a["untrained"] == b["untrained"]
    assert a["epochs"] == b["epochs"] or [dict(r, seconds=0) for r in a["epochs"]] == [dict(r, seconds=0) for r in b["epochs"]]
    strip = lambda p: [dict(json.loads(l), seconds=0) for l in p.read_text().splitlines()]
    assert strip(tmp_path/"full"/"log.jsonl") == strip(tmp_path/"killed"/"log.jsonl")   # no step lost or logged twice


def test_resuming_with_another_configuration_is_refused(tmp_path):
    p = _cli(*ARGS, "--epochs", "1", "--out", str(tmp_path)); p.communicate()
    p = _cli(*ARGS, "--lr-head", "0.5", "--out", str(tmp_path)); out, err = p.communicate()
    assert p.returncode == 2 and "different configuration (differs in: lr_head)" in err


def test_dataset_kwargs_reach_the_dataset_and_bad_ones_are_named(tmp_path):
    "`dataset_kwargs` are the dataset's constructor arguments (16-pixel glyphs); an unknown one lists those it accepts."
    from dml_book.train import Trainer, TrainConfig
    trainer = Trainer(TrainConfig(dataset="glyphs", dataset_kwargs={"size": 16, "per_font": 1}, out=str(tmp_path/"a")))
    assert trainer.train_ds[0][0].shape == (1, 16, 16) and trainer.test_ds[0][0].shape == (1, 16, 16)
    per_class = np.bincount(trainer.test_ds.labels)
    from dml_book.data.builtin import GLYPH_FONTS
    assert (per_class == len(GLYPH_FONTS)).all()                          # one copy of each class in each font
    p = _cli(*ARGS, "--dataset-kwargs", '{"sizee": 16}', "--out", str(tmp_path/"b")); out, err = p.communicate()
    assert p.returncode == 2 and "dataset 'digits' does not take dataset_kwargs {'sizee': 16}; it accepts: download" in err
    assert not (tmp_path/"b").exists() or not any((tmp_path/"b").iterdir())


def test_faiss_gpus_follow_the_run(monkeypatch):
    "faiss searches on the CPU for a CPU run or a CPU build, on this rank's GPU under torchrun, else on every GPU."
    from types import SimpleNamespace as NS
    import faiss, torch
    from dml_book.train import Trainer
    run = lambda device, ddp: NS(device=torch.device(device), dist=NS(enabled=ddp))
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)   # a GPU build of faiss, seeing 4 GPUs
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 4)
    assert Trainer.faiss_gpus(run("cpu", False)) is None and Trainer.faiss_gpus(run("cpu", True)) is None
    assert Trainer.faiss_gpus(run("cuda:2", True)) == [2] and Trainer.faiss_gpus(run("cuda", True)) == [0]
    assert Trainer.faiss_gpus(run("cuda:0", False)) == "all"
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0)
    assert Trainer.faiss_gpus(run("cuda:1", True)) is None and Trainer.faiss_gpus(run("cuda", False)) is None


SCHED = dict(dataset="glyphs", dataset_kwargs={"size": 16}, embedding_dim=8, batch_size=16, m_per_class=4, max_steps_per_epoch=3,
             lr_schedule="step", lr_step_size=2, lr_gamma=0.5, lr_step_per="iteration", device="cpu", progress=False)


def test_lr_schedule_follows_torch_and_resumes_exactly_mid_schedule(tmp_path, one_thread):
    from dml_book.train import Trainer
    full = Trainer(epochs=3, out=str(tmp_path/"full"), **SCHED); full.fit()
    lrs = [r["lr"][0] for r in full.history if r["kind"] == "epoch" and "lr" in r]
    assert lrs == [1e-3 * 0.5 ** (3 * (e - 1) // 2) for e in (1, 2, 3)]   # each epoch's first rate: StepLR after 0, 3, 6 iterations, halving every 2
    Trainer(epochs=1, out=str(tmp_path/"cut"), **SCHED).fit()          # interrupted after the first epoch ...
    cut = Trainer(epochs=3, out=str(tmp_path/"cut"), **SCHED); cut.fit()  # ... resumed from its checkpoint
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]
    assert strip(cut.history) == strip(full.history)                   # same learning rates, losses and metrics, bit for bit
    assert cut.scheduler.state_dict() == full.scheduler.state_dict()


def test_bad_lr_schedule_is_named(tmp_path):
    from dml_book.train import Trainer, ConfigError
    with pytest.raises(ConfigError, match="lr_schedule='linear' is invalid: expected constant, step, multistep, exponential, cosine or half_exp"):
        Trainer(**{**SCHED, "lr_schedule": "linear"}, out=str(tmp_path))


COSINE = {**SCHED, "lr_schedule": "cosine", "lr_warmup_epochs": 1, "lr_final_fraction": 0.01}


@pytest.mark.parametrize("per", ["epoch", "iteration"])
def test_cosine_schedule_ends_at_its_final_fraction_and_resumes_exactly(tmp_path, one_thread, per):
    from dml_book.train import Trainer
    cfg = {**COSINE, "lr_step_per": per}
    full = Trainer(epochs=4, out=str(tmp_path/"full"), **cfg); full.fit()
    lrs = [r["lr"][0] / 1e-3 for r in full.history if r["kind"] == "epoch" and "lr" in r]
    if per == "epoch":   # the rate each epoch trained with: warm-up to half the peak, the peak, then half a cosine to 1%
        np.testing.assert_allclose(lrs, [0.5, 1.0, 0.01 + 0.99 * 0.5 * (1 + np.cos(np.pi / 2)), 0.01])
    else:                # 3 iterations an epoch: epoch 1 starts the 3-iteration warm-up at 1/4, epoch 4 starts at the last third
        np.testing.assert_allclose(lrs[0], 0.25); assert lrs[1] == pytest.approx(1.0)
        assert lrs[-1] == pytest.approx(0.01 + 0.99 * 0.5 * (1 + np.cos(np.pi * 6 / 8)))
    class Stop(Exception): pass
    cut = Trainer(epochs=4, out=str(tmp_path/"cut"), **cfg)
    save = cut.save_checkpoint
    def save_then_stop():
        save()
        if cut.epoch == 2: raise Stop   # interrupted after epoch 2, mid-schedule
    cut.save_checkpoint = save_then_stop
    with pytest.raises(Stop): cut.fit()
    resumed = Trainer(epochs=4, out=str(tmp_path/"cut"), **cfg); resumed.fit()
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]
    assert strip(resumed.history) == strip(full.history)   # same rates, losses and metrics, bit for bit


def test_cosine_schedule_refuses_a_resume_with_another_length(tmp_path, one_thread):
    from dml_book.train import Trainer, ConfigError
    Trainer(epochs=1, out=str(tmp_path), **COSINE).fit()
    with pytest.raises(ConfigError, match="differs in: epochs, which sets the length of the lr_schedule"):
        Trainer(epochs=3, out=str(tmp_path), **COSINE).fit()


def test_frozen_batchnorm_keeps_a_resnet18s_statistics_and_affine_parameters(one_thread):
    import torch
    from dml_book.models import build_model
    torch.manual_seed(0)
    model = build_model("resnet18", 8, pretrained=False, in_channels=3, freeze_bn=True).train()
    frozen = {k: v.clone() for k, v in model.backbone.state_dict().items() if "bn" in k or "downsample.1" in k}
    assert frozen and not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    conv = model.backbone.conv1.weight.detach().clone(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 3, 32, 32)).pow(2).sum().backward(); opt.step()
    after = model.backbone.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in frozen.items())          # running stats, weight and bias untouched
    assert not torch.equal(model.backbone.conv1.weight, conv)                 # while the convolutions do train
    small = build_model("smallcnn", 8, freeze_bn=True)   # allowed, as for a torchvision backbone: a served run loads its statistics
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in small.modules())


@pytest.mark.parametrize("args,kw,says", [((), dict(method=object()), "Trainer's method must be a Method"),
                                          ((), dict(method=3), "or a registered name, got int"),
                                          (({"epochs": 1},), {}, "Trainer's cfg must be a TrainConfig (or None), got dict"),
                                          ((), dict(epoch=1), "Trainer got 'epoch', not a field of TrainConfig")])
def test_trainer_refuses_objects_of_the_wrong_type_in_one_line(args, kw, says):
    from dml_book.train import Trainer
    from dml_book.config import ConfigError
    with pytest.raises(ConfigError) as e: Trainer(*args, **kw)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_umap_phase_is_announced_before_it_starts(tmp_path, monkeypatch, capsys):
    "After the last epoch UMAP draws for minutes: `dml-book train` says so in one line before, not after."
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import dml_book.viz
    from dml_book.cli import main
    seen = []
    def fake_umap(embeddings, labels, title=""):
        seen.append(capsys.readouterr().out)   # what the user had read when the long phase began
        return plt.figure()
    monkeypatch.setattr(dml_book.viz, "plot_umap", fake_umap)
    args = [a for a in ARGS if a != "--no-umap"]
    assert main(["train", *args, "--epochs", "1", "--max-steps-per-epoch", "2", "--out", str(tmp_path/"run")]) == 0
    assert len(seen) == 1 and seen[0].rstrip().splitlines()[-1].startswith("drawing the UMAP of the test embedding ("), seen
    assert (tmp_path/"run"/"umap.png").exists()
