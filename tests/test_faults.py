"Faults a careful user or a hostile file meets: crafted, damaged and half-written checkpoints, bad settings, NaN, a shared output folder."
import errno, hashlib, io, json, os, subprocess, sys
from pathlib import Path
import pytest, torch
from dml_book.checkpoint import MAGIC, CheckpointError, read_checkpoint, write_checkpoint

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
