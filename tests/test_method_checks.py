"""Each method refuses the settings it cannot train with in its `check` hook, before any data is loaded, in one line that
names the method and the fix; a method that breaks the protocol (a `batch_loss` dict without "loss") and a name registered
twice are one line each, and a duplicate leaves `dml-book list` working.

The runs name CUB-200-2011 in an empty folder: a configuration that got past the checks would stop at the missing
dataset, so an error about the setting itself was raised before any data was looked at."""
import json
import pytest, torch
import dml_book.methods  # noqa: F401  (fills METHODS)
from dml_book.cli import main
from dml_book.config import check_config
from dml_book.methods import HDML, Baseline
from dml_book.methods.base import Method, MethodError
from dml_book.registry import METHODS, ConfigError
from dml_book.train import Trainer, TrainConfig

# (method, flags, the refusal): a setting of the run that each method cannot train with
WRONG = [
    ("ala", ["--optimizer", "adam"], "method 'ala': optimizer='adam': the look-ahead of eq. (10) models a plain gradient step"),
    ("ala", ["--m-per-class", "3"], "method 'ala': n_train=100 is not a multiple of m_per_class=3"),
    ("ala", ["--loss", "proxynca"], "method 'ala': the assessor weighs triplets or pairs; loss 'proxynca' forms neither: use contrastive, margin, triplet"),
    ("hdml", ["--loss", "contrastive"], "method 'hdml': HDML synthesises triplet or N-pair tuples; loss='contrastive' is neither"),
    ("hdml", ["--method-kwargs", '{"triplet_batches": true}', "--batch-size", "64"], "method 'hdml': triplet_batches: batch_size=64 is not a multiple of 3"),
    ("dcml", ["--embedding-dim", "30"], "method 'dcml': embedding_dim=30 is not divisible by n_learners=4"),
    ("pads", ["--miner", "semihard"], "method 'pads': PADS samples each anchor's negative itself; miner='semihard' would be ignored"),
    ("pads", ["--loss", "proxyanchor"], "method 'pads': loss 'proxyanchor' forms no triplets or pairs and would ignore the sampled negatives"),
    ("dmml", ["--miner", "batchhard"], "method 'dmml' trains with its own meta-cell loss, eq. (7); miner='batchhard' would be ignored"),
    ("dmml", ["WORLD_SIZE=3"], "method 'dmml': n_classes=32 is not a multiple of the 3 processes (WORLD_SIZE)"),
]

def _run(argv, capsys) -> tuple[int, list[str]]:
    rc = main(argv)
    return rc, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("method,flags,says", WRONG, ids=[f"{m}-{f[0].lstrip('-')}" for m, f, _ in WRONG])
def test_a_wrong_setting_is_one_line_before_the_data_loads(method, flags, says, tmp_path, capsys, monkeypatch):
    env = [f for f in flags if "=" in f and not f.startswith("-")]
    for kv in env: monkeypatch.setenv(*kv.split("=", 1))
    flags = [f for f in flags if f not in env]
    base = ["train", "--method", method, "--dataset", "cub200", "--data-root", str(tmp_path/"empty"), "--device", "cpu",
            "--out", str(tmp_path/"run")]
    rc, err = _run(base + flags, capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"dml-book: error: {says}"), err
    assert not (tmp_path/"run").exists()                                   # nothing written either
    for kv in env: monkeypatch.delenv(kv.split("=", 1)[0])
    rc, err = _run(base, capsys)                                           # the method's defaults pass the checks:
    assert rc == 2 and len(err) == 1 and "CUB_200_2011" in err[0], err    # the run stops at the missing data


def test_every_method_of_the_book_declares_a_check():
    "The five methods override the hook; the baseline keeps the default, which accepts everything."
    own = {m for m in METHODS.names() if METHODS.get(m).check is not Method.check}
    assert own == {"ala", "dcml", "dmml", "hdml", "pads"}
    check_config(TrainConfig(loss="proxynca"))   # the baseline takes any loss


def test_a_method_object_is_checked_too(tmp_path):
    "`Trainer(cfg, method=obj)` asks the object's own `check`, whatever `cfg.method` names."
    with pytest.raises(ConfigError, match=r"^method 'HDML': HDML synthesises triplet or N-pair tuples; loss='contrastive'"):
        Trainer(TrainConfig(dataset="cub200", data_root=str(tmp_path), loss="contrastive", out=str(tmp_path/"run")), method=HDML())


class NoLoss(Baseline):
    "A method whose `batch_loss` forgets the key the trainer steps on."
    def batch_loss(self, trainer, images, labels):
        return {"total": super().batch_loss(trainer, images, labels)}

def test_a_batch_loss_without_loss_is_one_line(tmp_path, capsys, monkeypatch, one_thread):
    monkeypatch.setitem(METHODS._items, "noloss", NoLoss)
    rc, err = _run(["train", "--method", "noloss", "--dataset", "digits", "--epochs", "1", "--max-steps-per-epoch", "1",
                    "--ks", "1", "--device", "cpu", "--no-umap", "--no-progress", "--out", str(tmp_path/"run")], capsys)
    assert rc == 2 and err == ['dml-book: error: NoLoss.batch_loss returned a dict without "loss" (keys: total): '
                               'put the loss to minimise under "loss"'], err
    assert issubclass(MethodError, TypeError)


class Other(Method):
    "Another method that claims the name hdml."

def test_a_duplicate_name_is_one_line_and_list_still_works(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(METHODS, "_twice", {})      # restored after the test
    METHODS.register("hdml")(Other)                # no error at registration: every other command keeps working
    rc, err = _run(["train", "--method", "hdml", "--out", str(tmp_path/"run")], capsys)
    assert rc == 2 and err == [f"dml-book: error: method 'hdml' is registered twice, by dml_book.methods.hdml.HDML and {__name__}.Other: "
                               "give one of them another name in its register(...) decorator"], err
    assert main(["list", "methods"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [l.split()[0] for l in out[1:]] == ["ala", "baseline", "dcml", "dmml", "episodes", "pads", "hdml"]   # the others usable, the duplicate named
    assert out[-1].split(None, 1)[1].startswith("unusable: method 'hdml' is registered twice")
    assert main(["train", "--method", "pads", "--miner", "semihard", "--out", str(tmp_path/"b")]) == 2   # other methods still checked
