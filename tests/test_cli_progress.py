"`dml-book train` piped to a log prints one line per epoch as it goes: the epoch, the mean loss, the metrics when evaluated, the seconds."
import json, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_piped_train_prints_one_line_per_epoch(tmp_path):
    out = tmp_path/"run"
    r = subprocess.run([sys.executable, "-m", "dml_book.cli", "train", "--dataset", "digits", "--epochs", "3", "--eval-every", "2",
                        "--max-steps-per-epoch", "3", "--no-umap", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("epoch ")]
    epochs = json.loads((out/"metrics.json").read_text())["epochs"]
    assert [l.split()[1] for l in lines] == [f"{e['epoch']}/3" for e in epochs] == ["0/3", "1/3", "2/3", "3/3"]
    for line, rec in zip(lines, epochs):
        said = dict(re.findall(r"(\S+) (\d+\.\d+)", line))
        if rec["epoch"]: assert float(said["loss"]) == round(rec["train_loss"], 4) and line.endswith(f"{rec['seconds']:.1f} s"), line
        evaluated = "R@1" in rec
        assert ("R@1" in said) == evaluated, line   # epochs 0, 2 and 3 are evaluated, epoch 1 is not
        if evaluated: assert float(said["R@1"]) == round(rec["R@1"], 4) and float(said["NMI"]) == round(rec["NMI"], 4)
    assert "\r" not in r.stdout and r.stdout.index("epoch 3/3") < r.stdout.index("untrained  trained")   # before the final table


def test_a_resumed_run_says_it_resumed_and_a_fresh_one_does_not(tmp_path):
    "Run one epoch, then the same command with two: the second says where it resumed from before its epoch line."
    out = tmp_path/"run"
    def train(epochs):
        r = subprocess.run([sys.executable, "-m", "dml_book.cli", "train", "--dataset", "digits", "--epochs", str(epochs), "--embedding-dim", "8",
                            "--max-steps-per-epoch", "2", "--no-umap", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        return r.stdout
    first, second = train(1), train(2)
    assert not any(l.startswith("resumed") for l in first.splitlines()) and "epoch 0/1" in first
    said = [l for l in second.splitlines() if l.startswith(("resumed", "epoch "))]
    assert said[0] == f"resumed from {out/'checkpoint.pt'}: epoch 1/2 done (step 2); 1 epoch to go", said
    assert [l.split()[1] for l in said[1:]] == ["2/2"]   # the epochs it trains now, not the ones it resumed past
