"Faults a careful user or a hostile file meets: crafted, damaged and half-written checkpoints, bad settings, NaN, a shared output folder."
import errno, hashlib, io, json, os, subprocess, sys
from pathlib import Path
import numpy as np, pytest, torch
from dml_book.checkpoint import MAGIC, CheckpointError, read_checkpoint, write_checkpoint
import dml_book.losses, dml_book.miners  # noqa: F401  (fill the registries)
from dml_book.registry import LOSSES, MINERS

FAST = ["--dataset", "digits", "--embedding-dim", "8", "--batch-size", "40", "--m-per-class", "8", "--epochs", "1",
        "--max-steps-per-epoch", "2", "--no-umap", "--no-progress"]


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "dml_book.cli", *argv], capture_output=True, text=True)


class _Payload:
    "A pickle that, if unpickled, creates the file `marker`."
    def __init__(self, marker): self.marker = str(marker)
    def __reduce__(self): return (open, (self.marker, "w"))


def _crafted(path: Path, marker: Path):
    "A checkpoint with a valid header and checksum whose pickle would run code."
    buf = io.BytesIO(); torch.save({"epoch": 1, "model": _Payload(marker)}, buf); payload = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def test_crafted_checkpoint_runs_no_code_from_the_api(tmp_path):
    marker = tmp_path/"pwned"; _crafted(tmp_path/"checkpoint.pt", marker)
    with pytest.raises(CheckpointError, match=r"not loadable as weights only \(UnpicklingError\); choose another --out, or remove the file"):
        read_checkpoint(tmp_path/"checkpoint.pt")
    assert not marker.exists()


def test_crafted_checkpoint_runs_no_code_from_the_cli(tmp_path):
    out = tmp_path/"run"; marker = tmp_path/"pwned"; _crafted(out/"checkpoint.pt", marker)
    r = _cli("train", *FAST, "--out", str(out))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"checkpoint {out/'checkpoint.pt'} is not loadable" in r.stderr and not marker.exists()


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:len(b)//2], "checksum does not match"),
    (lambda b: b[:-30] + bytes([b[-30] ^ 0x10]) + b[-29:], "checksum does not match"),   # one flipped bit
    (lambda b: b"", "is empty"),
    (lambda b: b"PK\x03\x04 not ours", "not a dml_book checkpoint")])
def test_damaged_checkpoints_are_named(tmp_path, damage, message):
    p = tmp_path/"checkpoint.pt"; write_checkpoint({"epoch": 2, "w": torch.randn(50)}, p)
    p.write_bytes(damage(p.read_bytes()))
    with pytest.raises(CheckpointError, match=message) as e: read_checkpoint(p)
    assert str(p) in str(e.value) and "remove the file to start over" in str(e.value)


def test_damaged_checkpoint_from_the_cli(tmp_path):
    out = tmp_path/"run"; out.mkdir(); write_checkpoint({"epoch": 1}, out/"checkpoint.pt")
    raw = bytearray((out/"checkpoint.pt").read_bytes()); raw[-5] ^= 1; (out/"checkpoint.pt").write_bytes(bytes(raw))
    r = _cli("train", *FAST, "--out", str(out))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "checksum does not match" in r.stderr, r.stderr


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    "An injected ENOSPC: one clear error, no temp file left, the previous checkpoint still loads."
    p = tmp_path/"checkpoint.pt"; write_checkpoint({"epoch": 1, "w": torch.ones(3)}, p)
    def full(fd): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError, match="no space was left on the device; the previous checkpoint is intact"):
        write_checkpoint({"epoch": 2, "w": torch.zeros(3)}, p)
    monkeypatch.undo()
    assert [x.name for x in tmp_path.iterdir()] == ["checkpoint.pt"] and read_checkpoint(p)["epoch"] == 1


BAD_SETTINGS = {  # field: (command-line flags, a fragment of the one-line error)
    "dataset": (["--dataset", "mnist"], "unknown dataset 'mnist'"),
    "data_root": (["--dataset", "cub200"], "needs --data-root"),
    "dataset_kwargs": (["--dataset-kwargs", '{"sizee": 3}'], "does not take dataset_kwargs"),
    "transform": (["--transform", "retrieval227"], "leave transform unset"),
    "image_size": (["--image-size", "8"], "image_size=8 is invalid: expected a whole number of pixels from 16 to 8192, or None"),
    "backbone": (["--backbone", "resnet19"], "unknown backbone 'resnet19'"),
    "embedding_dim": (["--embedding-dim", "0"], "embedding_dim=0 is invalid"),
    "head": (["--head", "mlp"], "head='mlp' is invalid"),
    "last_stride": (["--last-stride", "3"], "last_stride=3 is invalid"),
    "freeze_bn": (["--config", "{tmp}/f.yaml"], "freeze_bn='yes' is invalid"),
    "normalize": (["--config", "{tmp}/c.yaml"], "normalize='yes' is invalid"),
    "pretrained": (["--pretrained"], "smallcnn backbone has no pretrained weights"),
    "weights_path": (["--backbone", "resnet18", "--weights-path", "{tmp}/none.pth"], "none.pth"),
    "loss": (["--loss", "arcfacee"], "unknown loss 'arcfacee'"),
    "loss_kwargs": (["--loss-kwargs", '{"margin": "x"}'], "loss_kwargs margin='x'"),
    "miner": (["--miner", "hardest"], "unknown miner 'hardest'"),
    "miner_kwargs": (["--miner-kwargs", '{"x": 1}'], "miner_kwargs {'x': 1} given without a miner"),
    "method": (["--method", "pad"], "unknown method 'pad'"),
    "method_kwargs": (["--method-kwargs", '{"x": 1}'], "method 'baseline' rejects method_kwargs"),
    "epochs": (["--epochs", "-3"], "epochs=-3 is invalid"),
    "batch_size": (["--batch-size", "0"], "batch_size=0 is invalid"),
    "m_per_class": (["--m-per-class", "0"], "m_per_class=0 is invalid"),
    "lr_backbone": (["--lr-backbone", "-0.1"], "lr_backbone=-0.1 is invalid"),
    "lr_head": (["--lr-head", "nan"], "lr_head=nan is invalid"),
    "weight_decay": (["--weight-decay", "-1"], "weight_decay=-1.0 is invalid"),
    "optimizer": (["--optimizer", "rmsprop"], "optimizer='rmsprop' is invalid"),
    "lr_schedule": (["--lr-schedule", "linear"], "lr_schedule='linear' is invalid"),
    "lr_step_size": (["--lr-step-size", "0"], "lr_step_size=0 is invalid"),
    "lr_milestones": (["--lr-milestones", "0"], "lr_milestones=[0] is invalid"),
    "lr_gamma": (["--lr-gamma", "0"], "lr_gamma=0.0 is invalid"),
    "lr_step_per": (["--lr-step-per", "batch"], "lr_step_per='batch' is invalid"),
    "lr_warmup_epochs": (["--lr-warmup-epochs", "-1"], "lr_warmup_epochs=-1 is invalid"),
    "lr_final_fraction": (["--lr-final-fraction", "2"], "lr_final_fraction=2.0 is invalid"),
    "max_steps_per_epoch": (["--max-steps-per-epoch", "0"], "max_steps_per_epoch=0 is invalid"),
    "eval_every": (["--eval-every", "0"], "eval_every=0 is invalid"),
    "val_fraction": (["--val-fraction", "1.5"], "val_fraction=1.5 is invalid"),
    "ks": (["--ks", "1", "5000"], "Recall@5000 needs a gallery of at least 5000 items"),
    "log_every": (["--log-every", "0"], "log_every=0 is invalid"),
    "seed": (["--seed", "-1"], "seed=-1 is invalid"),
    "out": (["--out", "/proc/no/such"], "not writable"),
    "device": (["--device", "cuda:9"], "device='cuda:9'"),
    "num_workers": (["--num-workers", "-1"], "num_workers=-1 is invalid"),
    "pin_memory": (["--config", "{tmp}/pin.yaml"], "pin_memory='yes' is invalid"),
    "persistent_workers": (["--config", "{tmp}/pw.yaml"], "persistent_workers=2 is invalid"),
    "prefetch_factor": (["--prefetch-factor", "0"], "prefetch_factor=0 is invalid"),
    "decoder": (["--decoder", "cv2"], "decoder='cv2' is invalid"),
    "channels_last": (["--config", "{tmp}/cl.yaml"], "channels_last='on' is invalid"),
    "compile": (["--config", "{tmp}/co.yaml"], "compile='max-autotune' is invalid"),
    "precision": (["--precision", "fp8"], "precision='fp8' is invalid: expected fp32, bf16, fp16 or auto"),
    "progress": (["--config", "{tmp}/p.yaml"], "progress=3 is invalid"),
    "umap": (["--config", "{tmp}/u.yaml"], "umap='no' is invalid"),
    "allow_collapse": (["--config", "{tmp}/ac.yaml"], "allow_collapse='yes' is invalid"),
    "plan_sha": (["--plan-sha", "abc"], "plan_sha='abc' is invalid"),
}


def test_every_field_has_a_bad_setting():
    from dataclasses import fields
    from dml_book.train import TrainConfig
    assert sorted(BAD_SETTINGS) == sorted(f.name for f in fields(TrainConfig))


@pytest.mark.parametrize("name", sorted(BAD_SETTINGS))
def test_a_bad_setting_is_one_line_and_exit_2(name, tmp_path, capsys):
    from dml_book.cli import main
    (tmp_path/"c.yaml").write_text("normalize: 'yes'\n"); (tmp_path/"p.yaml").write_text("progress: 3\n")
    (tmp_path/"u.yaml").write_text("umap: 'no'\n"); (tmp_path/"f.yaml").write_text("freeze_bn: 'yes'\n")
    for f, text in (("pin", "pin_memory: 'yes'"), ("pw", "persistent_workers: 2"), ("cl", "channels_last: 'on'"),
                    ("co", "compile: 'max-autotune'"), ("ac", "allow_collapse: 'yes'")): (tmp_path/f"{f}.yaml").write_text(text + "\n")
    flags, fragment = BAD_SETTINGS[name]
    out = [] if "--out" in flags else ["--out", str(tmp_path/"run")]
    quiet = [f for f in ("--no-umap", "--no-progress") if f[5:] != name]   # a flag would override the file's bad value
    argv = ["train", "--dataset", "digits", *quiet, "--batch-size", "20", *out, *[a.replace("{tmp}", str(tmp_path)) for a in flags]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dml-book: error: ") and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path/"run"/"checkpoint.pt").exists()


def test_a_config_file_syntax_error_names_line_and_column(tmp_path, capsys):
    from dml_book.cli import main
    (tmp_path/"bad.yaml").write_text("epochs: [1\nlr_head: 2\n")
    assert main(["train", "--config", str(tmp_path/"bad.yaml"), "--out", str(tmp_path/"run")]) == 2
    assert f"{tmp_path/'bad.yaml'}:2:" in capsys.readouterr().err


def test_a_loss_that_turns_nan_stops_the_run_where_it_starts(tmp_path):
    "NaN embeddings from step 3 of epoch 2: one error naming epoch, step and last finite loss; epoch 1's checkpoint intact."
    from dml_book.train import Trainer, TrainingDiverged
    t = Trainer(dataset="digits", embedding_dim=8, batch_size=40, m_per_class=8, epochs=2, max_steps_per_epoch=4, out=str(tmp_path))
    forward, calls = t.model.forward, [0]
    def poisoned(x):
        z = forward(x)
        if t.model.training: calls[0] += 1
        return z * float("nan") if calls[0] >= 7 else z     # the 7th training step is epoch 2, step 3
    t.model.forward = poisoned
    with pytest.raises(TrainingDiverged, match=r"at epoch 2, step 7: embeddings row 0 is not finite .* \(last finite loss: [0-9.]+\); checkpoint.pt still holds epoch 1"):
        t.fit()
    assert read_checkpoint(tmp_path/"checkpoint.pt")["epoch"] == 1
    for line in (tmp_path/"log.jsonl").read_text().splitlines(): json.loads(line)   # valid JSON throughout


def test_nan_in_a_log_record_is_written_as_null(tmp_path):
    from dml_book.train import to_json
    s = to_json({"loss": float("nan"), "R@1": [float("inf"), 0.5]})
    assert json.loads(s) == {"loss": None, "R@1": [None, 0.5]} and "NaN" not in s


@pytest.mark.parametrize("name", LOSSES.names())
def test_losses_refuse_a_nan_embedding(name):
    import dml_book.losses  # noqa: F401
    from dml_book.registry import LOSSES
    from dml_book.losses.base import NonFiniteError
    if name not in LOSSES: pytest.skip(f"no loss {name!r} registered")
    cls = LOSSES.get(name)
    loss = cls(num_classes=4, embedding_size=6) if getattr(cls, "uses_proxies", False) else cls()
    e = torch.randn(8, 6); e[5, 2] = float("nan"); y = torch.arange(4).repeat(2)
    with pytest.raises(NonFiniteError, match="row 5 is not finite"): loss(e, y)


@pytest.mark.parametrize("name", MINERS.names())
def test_miners_refuse_a_nan_embedding(name):
    import dml_book.miners  # noqa: F401
    from dml_book.registry import MINERS
    from dml_book.losses.base import NonFiniteError
    if name not in MINERS: pytest.skip(f"no miner {name!r} registered")
    e = torch.randn(8, 6); e[2, 0] = float("inf"); y = torch.arange(4).repeat(2)
    with pytest.raises(NonFiniteError, match="row 2 is not finite"): MINERS.get(name)()(e, y)


def test_two_runs_cannot_share_an_output_folder(tmp_path):
    "A second process while the first holds the lock: exit 2, naming the first's PID; the lock dies with its holder."
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; from dml_book.train import lock_out; "
                               "Path(sys.argv[1]).mkdir(); f = lock_out(Path(sys.argv[1])); print('locked', flush=True); time.sleep(60)",
                               str(tmp_path/"run")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = _cli("train", *FAST, "--out", str(tmp_path/"run"))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert f"is in use by another run (process {holder.pid})" in r.stderr, r.stderr
    finally: holder.kill(); holder.wait()
    from dml_book.train import lock_out
    lock_out(tmp_path/"run").close()                         # free again once the holder is gone (even by SIGKILL)


def test_a_missing_dataset_is_one_line_naming_where_it_looked_and_how_to_fetch(tmp_path, capsys):
    from dml_book.cli import main
    argv = ["train", "--dataset", "cub200", "--data-root", str(tmp_path/"nowhere"), "--no-umap", "--no-progress",
            "--out", str(tmp_path/"run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dml-book: error: CUB200: expected ") and err.count("\n") == 1, err
    assert str(tmp_path/"nowhere"/"CUB_200_2011"/"images.txt") in err and "the layout is: CUB_200_2011/{images.txt" in err
    assert """--dataset-kwargs '{"download": true}'""" in err


def test_one_line_joins_a_layout_after_its_colon():
    from dml_book.cli import one_line
    assert one_line("missing x; the layout is:\n  a/{b, c}\npass download=True") == "missing x; the layout is: a/{b, c}; pass download=True"


# --- the library checks its inputs as the CLI does (issue 62) -----------------------------------------------------------

def _float_params(cls) -> list[str]:
    "The constructor arguments of `cls` annotated as numbers (a margin, a scale, a cutoff)."
    import inspect
    return [n for n, p in inspect.signature(cls).parameters.items() if "float" in str(p.annotation)]


@pytest.mark.parametrize("kind, name", [("loss", n) for n in LOSSES.names()] + [("miner", n) for n in MINERS.names()])
def test_a_nan_or_infinite_number_argument_is_refused_by_the_library(kind, name):
    "Before: `TripletLoss(margin=nan)` was built and gave a NaN loss (the CLI refused it; the library did not)."
    cls = (LOSSES if kind == "loss" else MINERS).get(name)
    base = dict(num_classes=4, embedding_size=6) if getattr(cls, "uses_proxies", False) else {}
    params = _float_params(cls)
    if not params: pytest.skip(f"{kind} {name!r} takes no number")
    for p in params:
        unbounded = p in getattr(cls, "unbounded", ())   # a cutoff that may be +inf (no cutoff): -inf and NaN are still refused
        for bad in (float("nan"), -float("inf")) if unbounded else (float("nan"), float("inf")):
            with pytest.raises(ValueError, match=f"{p}={bad} is not a finite number"): cls(**base, **{p: bad})
        if unbounded: assert getattr(cls(**base, **{p: float("inf")}), p) == float("inf")


def test_margins_from_the_library_match_the_cli():
    "A finite margin still builds (the same loss as before), and the CLI's own check reads the same signature."
    from dml_book.config import check_kwargs, ConfigError
    assert LOSSES.get("triplet")(margin=0.3).margin == 0.3 and MINERS.get("semihard")(margin=0.1).margin == 0.1
    with pytest.raises(ConfigError, match="expects a number"): check_kwargs("loss", "triplet", LOSSES.get("triplet"), {"margin": float("nan")})


@pytest.mark.parametrize("weights, error, says", [
    ([1., float("nan"), 1., 1.], "NonFiniteError", "weights hold NaN or infinite values"),
    ([1., float("inf"), 1., 1.], "NonFiniteError", "weights hold NaN or infinite values"),
    ([1., -0.5, 1., 1.], "ValueError", "weights must be non-negative (got -0.5)")])
def test_bad_tuple_weights_are_refused(weights, error, says):
    "Before: NaN weights gave a NaN loss, negative ones a negative loss, without a word."
    from dml_book.losses.base import NonFiniteError
    e, y = torch.nn.functional.normalize(torch.randn(4, 6), dim=1), torch.tensor([0, 0, 1, 1])
    a, p, n = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2]), torch.tensor([2, 3, 0, 1])
    loss = LOSSES.get("triplet")(margin=0.2)
    good = loss(e, y, (a, p, n), weights=torch.tensor([1., 1., 1., 0.]))
    assert torch.isclose(good, loss(e, y, (a[:3], p[:3], n[:3])))   # weights still weigh: w=0 drops a triplet
    with pytest.raises(NonFiniteError if error == "NonFiniteError" else ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        loss(e, y, (a, p, n), weights=torch.tensor(weights))


def test_float_labels_are_refused_by_the_samplers():
    "Before: labels [0, 0.5, 1.7, ...] were cast to int64, so 0.5 joined class 0 and 1.7 class 1 without a word."
    from dml_book.samplers import ClassBalancedBatchSampler, class_index
    with pytest.raises(TypeError, match="labels must be integers .* got dtype float64"):
        ClassBalancedBatchSampler(np.array([0., 0.5, 1., 1.7] * 4), batch_size=4, m_per_class=2)
    with pytest.raises(TypeError, match="got dtype float32"): class_index(torch.tensor([0., 1.]))
    assert [g.tolist() for g in class_index(np.array([1, 0, 1], dtype=np.int32))] == [[1], [0, 2]]


HUGE_KMEANS = """
import numpy as np
from dml_book.metrics import kmeans_assign, evaluate
rng = np.random.default_rng(0)
x = np.r_[rng.normal(0, 1, (30, 4)), rng.normal(9, 1, (30, 4))].astype(np.float32); y = np.repeat([0, 1], 30)
c = kmeans_assign(x * np.float32(1e30), 2, gpus=None)
assert (c == kmeans_assign(x, 2, gpus=None)).all()
print(evaluate(x * np.float32(1e30), y, gpus=None) == evaluate(x, y, gpus=None))
"""

def test_huge_finite_embeddings_do_not_abort_faiss_kmeans():
    "Before: entries of 1e30 made faiss's k-means abort the process (SIGABRT, beyond any try); now the same clusters and metrics."
    r = subprocess.run([sys.executable, "-c", HUGE_KMEANS], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "True", (r.returncode, r.stderr[-500:])


def test_an_index_refuses_embeddings_whose_squares_overflow():
    "Before: an IVF index of such embeddings aborted the process in faiss's k-means; now a ValueError naming the bound."
    from dml_book.index import Index, MAX_NORM
    x = np.random.default_rng(0).normal(size=(80, 4)).astype(np.float32)
    with pytest.raises(ValueError, match="above 1e\\+18, their squared distances overflow"):
        Index.build(x * np.float32(1e30), list(map(str, range(80))), kind="ivf", nlist=2)
    assert len(Index.build(x * np.float32(MAX_NORM / 10), list(map(str, range(80))), kind="ivf", nlist=2)) == 80


# --- a checkpoint's content, checked as a whole (issue 62) ---------------------------------------------------------------

def _main(*argv):
    "`dml-book ARGV` in this process: exit code and stderr (a traceback fails the test)."
    import contextlib
    from dml_book.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()): code = main(list(map(str, argv)))
    return code, err.getvalue()


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory):
    "A finished two-epoch run on digits (its checkpoint.pt at epoch 2)."
    out = tmp_path_factory.mktemp("ckpt")/"run"
    assert _main("train", *FAST[:-5], "2", *FAST[-4:], "--out", out)[0] == 0
    return out


def _altered(run: Path, tmp_path: Path, change) -> Path:
    "A copy of `run` whose checkpoint.pt is rewritten by `change(state)`, with a valid checksum (as a hand that recomputes it)."
    import shutil
    out = Path(shutil.copytree(run, tmp_path/"run")); state = read_checkpoint(out/"checkpoint.pt"); change(state)
    write_checkpoint(state, out/"checkpoint.pt"); (out/"best.pt").unlink(missing_ok=True)
    return out


def _one_line(code_err, *fragments):
    code, err = code_err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and all(f in err for f in fragments), err


def test_nan_weights_are_refused_before_embedding(two_epochs, tmp_path):
    "Before: a checkpoint of NaN weights (valid checksum) evaluated and embedded to NaN with exit 0."
    def nan(s): s["model"][next(k for k, v in s["model"].items() if v.is_floating_point())].fill_(float("nan"))
    run = _altered(two_epochs, tmp_path, nan)
    _one_line(_main("evaluate", run, "--device", "cpu"), "holds NaN or infinite values")
    _one_line(_main("train", *FAST[:-5], "3", *FAST[-4:], "--out", run), "holds NaN or infinite values")


@pytest.mark.parametrize("change, says", [
    (lambda s: s.update(history=[1, 2, 3]), "history[0]=1 is not a record of the log"),
    (lambda s: s["history"][-1].update({"R@1": "high"}), "is not a record of the log"),
    (lambda s: s.update(history=s["history"][:1]), "its history records epochs [0], not 0 to 2"),
    (lambda s: s.update(epoch=7), "epoch 7 (step 4) lies outside its run of 2 epochs"),
    (lambda s: s.update(step=-1), "lies outside its run"),
    (lambda s: s["config"].update(epochs="2"), "config.epochs='2' is invalid: expected a positive integer"),
    (lambda s: s["config"].update(embedding_dim=2.5), "config.embedding_dim=2.5 is invalid"),
    (lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)), "optimizer.state[0].exp_avg has shape [3] where its parameter has"),
    (lambda s: s["optimizer"]["state"][0]["exp_avg_sq"].fill_(float("inf")), "optimizer.state[0].exp_avg_sq holds NaN or infinite values"),
    (lambda s: s["optimizer"].update(param_groups=[]), "optimizer does not hold 2 group(s) of [12, 2] parameters")])
def test_a_checkpoint_with_a_valid_checksum_and_bad_content_is_one_line(two_epochs, tmp_path, change, says):
    "Before: each of these resumed into a traceback (history, types, optimizer) or trained a mislabelled run."
    run = _altered(two_epochs, tmp_path, change)
    _one_line(_main("train", *FAST[:-5], "3", *FAST[-4:], "--out", run), says)
    assert json.loads((run/"metrics.json").read_text())["config"]["epochs"] == 2   # nothing rewritten


def test_progress_of_a_checkpoint_with_a_string_epoch_count_is_one_line(two_epochs, tmp_path):
    run = _altered(two_epochs, tmp_path, lambda s: s["config"].update(epochs="2")); (run/"metrics.json").unlink()
    _one_line(_main("evaluate", run, "--device", "cpu"), "epochs='2'")


def test_a_rerun_with_other_epochs_continues_or_is_refused(two_epochs, tmp_path):
    "Before: --epochs 1 on a finished 2-epoch run wrote metrics.json saying 1 epoch for weights trained 2."
    import shutil
    run = Path(shutil.copytree(two_epochs, tmp_path/"run"))
    _one_line(_main("train", *FAST[:-5], "1", *FAST[-4:], "--out", run), "holds epoch 2 of 2, past epochs=1", "set epochs to 2 or more")
    assert json.loads((run/"metrics.json").read_text())["config"]["epochs"] == 2
    assert _main("train", *FAST[:-5], "3", *FAST[-4:], "--out", run)[0] == 0   # more epochs: the run goes on
    m = json.loads((run/"metrics.json").read_text())
    assert m["config"]["epochs"] == 3 and [e["epoch"] for e in m["epochs"]] == [0, 1, 2, 3] and read_checkpoint(run/"checkpoint.pt")["epoch"] == 3


# --- counts and sizes held to what their consumer can take (issue 62) -----------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["train", *FAST, "--num-workers", "100000"], "num_workers=100000: this machine has"),
    (["train", *FAST, "--batch-size", "1000000"], "batch_size=1000000 is invalid: expected a positive integer, at most 65536"),
    (["train", *FAST, "--image-size", "100000"], "image_size=100000 is invalid: expected a whole number of pixels from 16 to 8192"),
    (["tune", "ala", "--jobs", "100000", "--yes"], "--jobs 100000: this machine has"),   # after the plan (printed before torch), before any trial
    (["pretrain", "--images", "100000", "--no-progress"], "dataset 'glyphs_pretrain' takes images from 1 to 256"),
    (["pretrain", "--held-out", "5000", "--no-progress"], "takes held_out from 0 to 256"),
    (["pretrain", "--size", "100000", "--no-progress"], "takes size from 8 to 256"),
    (["pretrain", "--strength", "1e9", "--no-progress"], "takes strength from 0 to 4"),
    (["pretrain", "--batch-size", "1000000000", "--no-progress"], "batch_size=1000000000: expected 1 to 65536")])
def test_a_count_past_its_consumer_is_one_line_before_any_work(argv, says, tmp_path):
    "Before: each was accepted, then forked until the machine gave out, or failed deep inside, or rendered for ever."
    out = ["--out", tmp_path/"run"] if argv[0] == "train" else ["--results", tmp_path/"results"] if argv[0] == "tune" else ["--cache", tmp_path/"cache"]
    _one_line(_main(*argv, *out), says)
    assert not any(tmp_path.iterdir())   # nothing written, nothing rendered


def test_a_batch_of_images_past_the_memory_is_refused():
    from dml_book.config import check_counts, available_memory, MAX_BATCH, ConfigError
    from dml_book.train import TrainConfig
    if available_memory() is None: pytest.skip("no /proc/meminfo here")
    with pytest.raises(ConfigError, match=r"batch_size=65536 images of image_size=8192: one batch needs 49152.0 GiB"):
        check_counts(TrainConfig(batch_size=MAX_BATCH, image_size=8192))
    check_counts(TrainConfig(batch_size=64, image_size=224))   # 38.5 MB: fine anywhere


def test_a_finite_gradient_too_large_for_adam_is_skipped_and_ordinary_updates_stay_bit_identical():
    "PADS's policy: an advantage of 3e38 gives a finite gradient whose square is inf in Adam's second moment (freezing every later step); it is skipped."
    import copy
    from dml_book.methods.pads_policy import PolicyLearner
    torch.manual_seed(0); s0, s1, acts = torch.randn(6), torch.randn(6), torch.tensor([0, 1, 2])
    agent = PolicyLearner(6, 3, hidden=(8,), baseline="ema"); twin = copy.deepcopy(agent)
    out = agent.update(s0, acts, 3e38, s1)
    assert out["skipped"] == 1.0 and agent.optimizer.state_dict()["state"] == {}
    assert all(torch.isfinite(p).all() for p in agent.policy.parameters())
    agent.reward_ema, agent.n_updates = twin.reward_ema, twin.n_updates
    for r in (1.0, -1.0, 1.0):   # ordinary updates: the same to the bit as those of a learner that never met the huge one
        a, b = agent.update(s0, acts, r, s1), twin.update(s0, acts, r, s1)
        assert a == b and a["skipped"] == 0.0
        assert all(torch.equal(x, y) for x, y in zip(agent.policy.state_dict().values(), twin.policy.state_dict().values()))
    moved = copy.deepcopy(agent.policy.state_dict()); agent.update(s0, acts, 1.0, s1)
    assert any(not torch.equal(moved[k], v) for k, v in agent.policy.state_dict().items())   # the policy still learns
