"The speed options of a run: channels-last memory order, torch.compile of the backbone, the DataLoader settings, torchvision.io decoding."
from dataclasses import replace
import numpy as np
import pytest
import torch

from dml_book.train import Trainer, TrainConfig
from dml_book.config import check_config, ConfigError

SMALL = dict(dataset="glyphs", dataset_kwargs=dict(size=16, per_font=1), embedding_dim=32, epochs=2, max_steps_per_epoch=10)


def _conv_weight(model):
    return next(p for p in model.parameters() if p.dim() == 4 and p.shape[1] > 1)


def test_channels_last_trains_like_channels_first(tmp_path, one_thread):
    "Same network, same batches, other memory order: equal first-step outputs; final metrics within seed-to-seed noise."
    first, last = Trainer(**SMALL, out=str(tmp_path/"cf")), Trainer(**SMALL, out=str(tmp_path/"cl"), channels_last=True)
    assert not _conv_weight(first.model).is_contiguous(memory_format=torch.channels_last)
    assert _conv_weight(last.model).is_contiguous(memory_format=torch.channels_last)
    x, _ = next(iter(last.loader))
    assert x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] == 1   # the collate step; same values as NCHW
    test_x = torch.stack([last.test_ds[i][0] for i in range(8)])
    with torch.no_grad():
        torch.testing.assert_close(last.model(test_x.contiguous(memory_format=torch.channels_last)), first.model(test_x), atol=1e-5, rtol=1e-4)
    a, b = first.fit(), last.fit()
    # seeds 0, 1, 2 of this run give R@1 0.28, 0.32, 0.31: a 0.03 band is well inside seed noise; rounding alone moves it ~0.005
    for k in ("R@1", "R@8", "NMI", "MAP@R"): assert abs(a[k] - b[k]) <= 0.03, (k, a[k], b[k])
    assert _conv_weight(last.model).is_contiguous(memory_format=torch.channels_last)   # still after the optimiser's steps


def test_compile_compiles_the_backbone_in_place(tmp_path, monkeypatch, one_thread):
    "compile=True hands the backbone to torch.compile (here its eager backend: inductor takes a minute on this CPU), same run."
    import torch._dynamo
    real, calls = torch.compile, []
    def eager_compile(fn, **kw):
        calls.append(fn); return real(fn, backend="eager", dynamic=False)
    monkeypatch.setattr(torch, "compile", eager_compile)
    kw = dict(SMALL, epochs=1, max_steps_per_epoch=4)
    plain, compiled = Trainer(**kw, out=str(tmp_path/"p")), Trainer(**kw, out=str(tmp_path/"c"), compile=True)
    assert len(calls) == 1 and calls[0].__self__ is compiled.model.backbone    # the backbone, nothing else
    assert list(plain.model.state_dict()) == list(compiled.model.state_dict())  # checkpoints keep their parameter names
    try: a, b = plain.fit(), compiled.fit()
    finally: torch._dynamo.reset()
    assert a == pytest.approx(b, abs=1e-6)   # the eager backend computes what the module computes


def test_loader_options_follow_the_config(tmp_path):
    t = Trainer(**SMALL, out=str(tmp_path), device="cpu")
    assert t.loader_options() == dict(num_workers=0, pin_memory=False)              # auto: in the training process on a CPU
    t.cfg = replace(t.cfg, num_workers=2, persistent_workers=True, prefetch_factor=3, channels_last=True)
    o = t.loader_options()
    assert (o["num_workers"], o["prefetch_factor"], o["persistent_workers"]) == (2, 3, True)
    assert o["collate_fn"].__name__ == "channels_last_collate" and o["pin_memory"] is False   # no CUDA: nothing to pin
    assert t.loader_options(train=False)["persistent_workers"] is False              # evaluation loaders are short-lived


def test_workers_give_the_run_of_the_main_process_on_in_memory_data(tmp_path, one_thread):
    "Built-in data have no random augmentation: two workers must train exactly what the main process trains."
    kw = dict(SMALL, epochs=1, max_steps_per_epoch=4)
    a = Trainer(**kw, out=str(tmp_path/"0"), num_workers=0).fit()
    b = Trainer(**kw, out=str(tmp_path/"2"), num_workers=2, persistent_workers=True).fit()
    assert a == b


@pytest.mark.parametrize("field, value, says", [
    ("num_workers", "many", "num_workers='many' is invalid: expected a non-negative integer or 'auto'"),
    ("num_workers", -2, "num_workers=-2 is invalid"),
    ("pin_memory", "yes", "pin_memory='yes' is invalid: expected true or false"),
    ("persistent_workers", 1, "persistent_workers=1 is invalid"),
    ("prefetch_factor", 0, "prefetch_factor=0 is invalid: expected a positive integer"),
    ("decoder", "cv2", "decoder='cv2' is invalid: expected pil or torchvision"),
    ("channels_last", "true", "channels_last='true' is invalid: expected true or false"),
    ("compile", None, "compile=None is invalid: expected true or false"),
])
def test_bad_speed_settings_are_one_line_errors(field, value, says):
    with pytest.raises(ConfigError) as e: check_config(replace(TrainConfig(), **{field: value}))
    assert str(e.value) == says or (str(e.value).startswith(says) and "\n" not in str(e.value))


def test_cli_takes_the_speed_flags():
    from dml_book.cli import parser
    a = parser().parse_args(["train", "--num-workers", "auto", "--channels-last", "--compile", "--decoder", "torchvision",
                             "--prefetch-factor", "4", "--persistent-workers", "--no-pin-memory"])
    assert (a.num_workers, a.channels_last, a.compile, a.decoder, a.prefetch_factor, a.persistent_workers, a.pin_memory) == \
           ("auto", True, True, "torchvision", 4, True, False)
    assert parser().parse_args(["train", "--num-workers", "3"]).num_workers == 3


def test_torchvision_decoder_reads_a_replica_like_pil(tmp_path):
    "decoder='torchvision': the same images and labels, tensors within about one grey level of the PIL pipeline's."
    from dml_book.data.replicas import write_cub
    from dml_book.data.core import build_split, ImageReadError
    import dml_book.data  # noqa: F401  (registers cub200)
    write_cub(tmp_path)
    cfg = TrainConfig(dataset="cub200", data_root=str(tmp_path))
    pil, tv = build_split(cfg, "test", False), build_split(replace(cfg, decoder="torchvision"), "test", False)
    assert (pil.decoder, tv.decoder) == ("pil", "torchvision") and list(pil.labels) == list(tv.labels)
    for i in range(len(pil)):
        torch.testing.assert_close(tv[i][0], pil[i][0], atol=2.5 / 255 / 0.224, rtol=0)
    tv.paths[0].write_bytes(tv.paths[0].read_bytes()[:100])                          # a truncated file
    with pytest.raises(ImageReadError, match=str(tv.paths[0])): tv[0]
    train = build_split(replace(cfg, decoder="torchvision"), "train", True)
    assert train[0][0].shape == (3, 224, 224) and train[0][0].dtype == torch.float32


def test_bf16_run_lands_near_the_fp32_run(tmp_path, one_thread):
    "bf16 autocast with channels-last: trains, and lands within seed-to-seed noise (0.03, as above) of the fp32 run."
    a = Trainer(**SMALL, out=str(tmp_path/"fp32")).fit()
    b = Trainer(**SMALL, out=str(tmp_path/"bf16"), precision="bf16", channels_last=True)
    with b.autocast(): assert b.model(b.test_ds[0][0][None]).dtype == torch.bfloat16   # the forward is in bf16 ...
    b = b.fit()
    for k in ("R@1", "R@8", "NMI", "MAP@R"): assert abs(a[k] - b[k]) <= 0.03, (k, a[k], b[k])


def test_losses_compute_in_fp32_under_autocast():
    from dml_book.losses import TripletLoss
    z, y = torch.randn(8, 16, requires_grad=True), torch.arange(4).repeat_interleave(2)
    with torch.autocast("cpu", dtype=torch.bfloat16): l = TripletLoss()(z.bfloat16(), y)
    assert l.dtype == torch.float32 and l.item() == pytest.approx(TripletLoss()(z.bfloat16().float(), y).item(), rel=1e-6)


@pytest.mark.parametrize("method, kw", [("hdml", dict(method_kwargs=dict(hidden=32))), ("ala", dict(batch_size=60, method_kwargs=dict(n_train=40, n_val=20)))])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_methods_with_their_own_optimisers_step_under_mixed_precision(method, kw, precision, tmp_path, one_thread):
    t = Trainer(**{**SMALL, **kw}, method=method, precision=precision, out=str(tmp_path))
    x, y = next(iter(t.loader))
    before = [p.detach().clone() for p in t.model.parameters()]
    logs = t.training_step(x, y)
    assert all(np.isfinite(v) for v in logs.values() if isinstance(v, float)), logs
    moved = any(not torch.equal(p, q) for p, q in zip(before, t.model.parameters()))
    skipped = t.scaler.is_enabled() and t.scaler.get_scale() < 2.0**16   # fp16's first scale (2**16) may overflow: skipped, halved
    assert moved or skipped, (moved, skipped)   # per optimiser: one may step while another overflowed
    assert t.scaler.is_enabled() == (precision == "fp16")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_resume_under_mixed_precision_is_exact(tmp_path, precision, one_thread):
    from dml_book.train import train
    from dml_book.checkpoint import read_checkpoint
    kw = dict(SMALL, max_steps_per_epoch=4, precision=precision)
    full = train(**{**kw, "epochs": 2}, out=str(tmp_path/"full"))
    train(**{**kw, "epochs": 1}, out=str(tmp_path/"split"))
    state = read_checkpoint(tmp_path/"split"/"checkpoint.pt")
    assert bool(state["scaler"]) == (precision == "fp16")   # fp16: the loss scale rides in the checkpoint
    assert train(**{**kw, "epochs": 2}, out=str(tmp_path/"split")) == full


def test_fp16_scaler_skips_an_overflowed_step_and_resumes_its_scale(tmp_path):
    t = Trainer(**SMALL, precision="fp16", out=str(tmp_path))
    w = torch.nn.Parameter(torch.ones(3)); opt = torch.optim.SGD([w], lr=0.5)
    t.backward_and_step((w * 2.0).sum(), opt)
    torch.testing.assert_close(w.detach(), torch.zeros(3))     # unscaled gradient 2, lr 0.5
    t.backward_and_step((w * float("inf")).sum(), opt)
    assert w.grad is None and torch.equal(w.detach(), torch.zeros(3)) and t.scaler.get_scale() == 2.0**15
    with pytest.raises(ConfigError, match="differs in: precision"):
        t.save_checkpoint(); Trainer(**SMALL, out=str(tmp_path)).load_checkpoint(tmp_path/"checkpoint.pt")
