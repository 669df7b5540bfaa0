"""What a command reads, it bounds (issue 51): reads that reach outside their folder, reads that stall or explode, a
checkpoint with a right checksum and the wrong content, settings checked before work, runs that cannot learn.
Every case that could hang runs under an alarm (in this process) or a subprocess timeout."""
import contextlib, io, json, os, shutil, signal, subprocess, sys
from pathlib import Path
from types import SimpleNamespace
import numpy as np
import pytest, torch
from PIL import Image

from dml_book.cli import main
from dml_book.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from dml_book.files import FileError
from dml_book.train import TrainConfig, Trainer

GLYPHS = dict(dataset="glyphs", dataset_kwargs={"size": 16, "per_font": 1}, embedding_dim=16, batch_size=32,
              m_per_class=4, max_steps_per_epoch=2, ks=(1, 2))
OWN = ["--embedding-dim", "8", "--batch-size", "8", "--m-per-class", "2", "--epochs", "1", "--max-steps-per-epoch", "1",
       "--ks", "1", "--no-umap", "--no-progress", "--device", "cpu"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def alarm():
    "Fail, rather than hang, a test whose read blocks: SIGALRM after 120 s interrupts the blocked call."
    def ring(*_): raise TimeoutError("the read blocked (a FIFO waited on?)")
    old = signal.signal(signal.SIGALRM, ring); signal.alarm(120)
    try: yield
    finally: signal.alarm(0); signal.signal(signal.SIGALRM, old)


def cli(*argv, fresh: bool = False):
    "`dml-book ARGV`: exit code, stdout, stderr; in this process, or in a fresh one with a timeout."
    if fresh: return subprocess.run([sys.executable, "-m", "dml_book.cli", *map(str, argv)], capture_output=True, text=True,
                                    env=ENV, timeout=300)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): code = main(list(map(str, argv)))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def one_line_error(r, *fragments: str, code: int = 2):
    "`r` failed with `code` and one line on stderr, no traceback, holding every fragment."
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1 and all(f in r.stderr for f in fragments), r.stderr


def make_tree(root: Path, classes: int = 4, per_class: int = 4) -> Path:
    "A folder dataset: `classes` class folders of small PNGs."
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root/f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(root/f"c{c}"/f"{i}.png")
    return root


def write_csv(root: Path, extra_rows=()) -> Path:
    "dataset.csv listing the tree's images by relative path, plus `extra_rows` (path, label)."
    rows = [(p.relative_to(root).as_posix(), p.parent.name[1:]) for p in sorted(root.glob("c*/*.png"))]
    (root/"dataset.csv").write_text("path,label\n" + "".join(f"{p},{l}\n" for p, l in [*rows, *extra_rows]))
    return root/"dataset.csv"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    "A one-epoch run on 16-pixel glyphs."
    d = tmp_path_factory.mktemp("reads")
    Trainer(TrainConfig(**GLYPHS, epochs=1, out=str(d/"run"))).fit()
    return d/"run"


def copy_run(run, tmp_path) -> Path:
    return Path(shutil.copytree(run, tmp_path/"run"))


def rewrite_json(path: Path, change):
    obj = json.loads(path.read_text()); change(obj); path.write_text(json.dumps(obj))


# --- reads that reach outside ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("row, fragment", [("../outside.png", "is outside the CSV file's folder"),
                                           ("{tmp}/outside.png", "is outside the CSV file's folder"),
                                           ("c0/../c0/0.png", "is listed twice (rows 2 and 18)")])
def test_a_csv_row_outside_its_folder_or_repeated_is_one_line(tmp_path, row, fragment):
    root = make_tree(tmp_path/"data"); Image.new("RGB", (8, 8)).save(tmp_path/"outside.png")
    write_csv(root, [(row.format(tmp=tmp_path), "0")])
    one_line_error(cli("train", "--dataset", "csv", "--data-root", root, *OWN, "--out", tmp_path/"run"), fragment)
    assert not (tmp_path/"run"/"checkpoint.pt").exists()


def test_a_csv_row_with_an_absolute_path_inside_its_folder_is_read(tmp_path):
    from dml_book.data import ImageCSV
    root = make_tree(tmp_path/"data"); csv = write_csv(root)
    csv.write_text(csv.read_text().replace("c0/0.png", str(root/"c0"/"0.png")))
    assert root/"c0"/"0.png" in ImageCSV(csv).paths


def test_a_csv_not_in_utf8_is_one_line_quoting_nothing(tmp_path):
    root = make_tree(tmp_path/"data"); csv = write_csv(root)
    csv.write_bytes(csv.read_bytes() + "c0/caf\xe9.png,0\n".encode("latin-1"))
    one_line_error(cli("train", "--dataset", "csv", "--data-root", root, *OWN, "--out", tmp_path/"run"), "is not UTF-8 text (byte")


def test_a_file_that_is_not_a_csv_is_not_quoted(tmp_path):
    secret = tmp_path/"secret.txt"; secret.write_text("root:x:0:0:the-secret-line:/root:/bin/bash\n")
    r = cli("train", "--dataset", "csv", "--data-root", secret, *OWN, "--out", tmp_path/"run")
    one_line_error(r, "needs a header with the columns path and label (has: none)")
    assert "the-secret-line" not in r.stderr


@pytest.mark.parametrize("link", ["image", "class folder"])
def test_a_link_out_of_a_dataset_folder_is_refused(tmp_path, link):
    root, outside = make_tree(tmp_path/"data"), make_tree(tmp_path/"outside", classes=1)
    if link == "image": (root/"c1"/"9.png").symlink_to(outside/"c0"/"0.png")
    else: (root/"c9").symlink_to(outside/"c0", target_is_directory=True)
    one_line_error(cli("train", "--dataset", "folder", "--data-root", root, *OWN, "--out", tmp_path/"run"),
                   "leads outside", str(root))


def test_a_link_inside_a_dataset_folder_is_read(tmp_path):
    from dml_book.data import ImageFolder
    root = make_tree(tmp_path/"data"); (root/"c1"/"9.png").symlink_to(root/"c0"/"0.png")
    assert root/"c1"/"9.png" in ImageFolder(root).paths


def test_a_split_file_outside_the_dataset_is_refused_unread(tmp_path):
    root = make_tree(tmp_path/"data"); secret = tmp_path/"secret.txt"; secret.write_text("the-secret-line\n")
    for name in ("../secret.txt", str(secret)):
        r = cli("train", "--dataset", "folder", "--data-root", root, "--dataset-kwargs", json.dumps({"split_file": name}), *OWN,
                "--out", tmp_path/"run")
        one_line_error(r, "leads outside"); assert "the-secret-line" not in r.stderr
    (root/"split.txt").symlink_to(secret)   # a link inside that leads out
    r = cli("train", "--dataset", "folder", "--data-root", root, "--dataset-kwargs", '{"split_file": "split.txt"}', *OWN, "--out", tmp_path/"run")
    one_line_error(r, "leads outside"); assert "the-secret-line" not in r.stderr


def test_a_runs_json_chooses_no_folder_to_write(run, tmp_path, monkeypatch):
    "metrics.json naming another data_root for built-in data, or download for a benchmark: evaluate creates nothing there."
    from dml_book.inference import recorded_paths_only
    monkeypatch.setenv("DML_BOOK_CACHE", str(tmp_path/"cache"))
    r = copy_run(run, tmp_path); elsewhere = tmp_path/"elsewhere"/"deep"
    rewrite_json(r/"metrics.json", lambda m: m["config"].update(data_root=str(elsewhere)))
    res = cli("evaluate", r, "--json", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert not (tmp_path/"elsewhere").exists() and any((tmp_path/"cache").glob("glyphs-*.npz"))
    cub = TrainConfig(dataset="cub200", data_root=str(elsewhere), dataset_kwargs={"download": True})
    assert recorded_paths_only(cub).dataset_kwargs == {"download": False}
    assert recorded_paths_only(cub, dataset_kwargs={"download": True}).dataset_kwargs == {"download": True}   # the user's own flag


# --- reads that stall or explode -----------------------------------------------------------------------------------------

def test_a_fifo_as_checkpoint_is_refused_at_once(run, tmp_path):
    r = copy_run(run, tmp_path); (r/"checkpoint.pt").unlink(); os.mkfifo(r/"checkpoint.pt")
    one_line_error(cli("evaluate", r, "--device", "cpu", fresh=True), f"checkpoint {r/'checkpoint.pt'} is a FIFO (named pipe), not a regular file")
    with pytest.raises(CheckpointError, match="is a FIFO"): Trainer(TrainConfig(**GLYPHS, epochs=2, out=str(r))).fit()   # a resume


def test_a_fifo_listed_as_an_image_is_refused_before_training(tmp_path):
    root = make_tree(tmp_path/"data"); os.mkfifo(root/"c1"/"pipe.png"); write_csv(root)   # the glob lists the FIFO too
    one_line_error(cli("train", "--dataset", "csv", "--data-root", root, *OWN, "--out", tmp_path/"run", fresh=True),
                   f"{root/'c1'/'pipe.png'} (listed in the CSV file) is a FIFO (named pipe), not an image file")


def test_a_fifo_or_a_device_given_to_embed_is_one_line(run, tmp_path):
    os.mkfifo(tmp_path/"pipe.png")
    one_line_error(cli("embed", run, tmp_path/"pipe.png", "--out", tmp_path/"e.npz", "--device", "cpu", fresh=True), "pipe.png")
    from dml_book.data.core import load_image, ImageReadError
    with pytest.raises(ImageReadError, match="is a FIFO"): load_image(tmp_path/"pipe.png")
    with pytest.raises(ImageReadError, match="is a character device"): load_image("/dev/zero")


def test_a_huge_sparse_checkpoint_is_refused_by_its_size_unread(tmp_path):
    p = tmp_path/"checkpoint.pt"
    with open(p, "wb") as f: f.truncate(6 << 30)   # 6 GiB of holes: no disk space, and a read would take minutes
    with pytest.raises(CheckpointError, match=f"holds {6 << 30} bytes, more than the {4 << 30} it may"): read_checkpoint(p)


@pytest.mark.parametrize("file, change, fragment", [
    ("data.json", lambda d: d.update(shape=[3, 65536, 65536]), "shape=[3, 65536, 65536] is invalid"),
    ("data.json", lambda d: d.update(eval_size=1 << 40), "eval_size=1099511627776 is invalid"),
    ("data.json", lambda d: d.update(class_names=d["class_names"] * 50), "classes for"),
    ("metrics.json", lambda m: m["config"].update(embedding_dim=1 << 30), "embedding_dim=1073741824 is invalid"),
    ("metrics.json", lambda m: m["config"].update(ks=[1, 10 ** 9]), "Recall@1000000000 needs a gallery"),
])
def test_sizes_in_a_runs_json_are_bounded(run, tmp_path, file, change, fragment):
    r = copy_run(run, tmp_path); rewrite_json(r/file, change)
    one_line_error(cli("evaluate", r, "--device", "cpu"), fragment)


# --- a right checksum, the wrong content -------------------------------------------------------------------------------

def _tamper(path: Path, change):
    "Change a checkpoint's state and write it back with a valid checksum."
    state = read_checkpoint(path); change(state); write_checkpoint(state, path)


@pytest.mark.parametrize("change, fragment", [
    (lambda s: s["model"].update({"head.fc.weight": torch.zeros(3, 3)}), "model.head.fc.weight has shape [3, 3] (torch.float32) where the network has [16, 128]"),
    (lambda s: s["model"].pop("head.fc.bias"), "model.head.fc.bias is missing"),
    (lambda s: s["model"].update(stray=torch.zeros(1)), "model.stray is not in the network"),
    (lambda s: s["model"].update({"head.fc.bias": 0.5}), "model.head.fc.bias is a float where the network has a Tensor"),
    (lambda s: s.pop("model"), "model is not a mapping of tensors"),
    (lambda s: s["method"].update(_extra_state={"nothing": 1}), "method"),
])
def test_a_checkpoint_with_a_right_checksum_and_wrong_content_is_one_line(run, tmp_path, change, fragment):
    r = copy_run(run, tmp_path); _tamper(r/"checkpoint.pt", change)
    one_line_error(cli("evaluate", r, "--device", "cpu"), f"checkpoint {r/'checkpoint.pt'}", fragment)


def test_a_resume_from_a_checkpoint_of_another_shape_is_one_line(run, tmp_path):
    r = copy_run(run, tmp_path)
    _tamper(r/"checkpoint.pt", lambda s: s["model"].update({k: torch.zeros(1) for k in list(s["model"])[:1]}))
    with pytest.raises(CheckpointError, match="has shape \\[1\\]"): Trainer(TrainConfig(**GLYPHS, epochs=2, out=str(r))).fit()


@pytest.mark.parametrize("field, value", [("embedding_dim", 32), ("backbone", "resnet18"), ("normalize", False)])
def test_a_runs_json_that_disagrees_with_its_checkpoint_is_one_line(run, tmp_path, field, value):
    r = copy_run(run, tmp_path); rewrite_json(r/"metrics.json", lambda m: m["config"].update({field: value}))
    one_line_error(cli("evaluate", r, "--device", "cpu"), f"{r/'metrics.json'}: config.{field}=", f"{r/'checkpoint.pt'} was trained with {field}=")


def test_a_preprocessing_of_another_colour_mode_is_one_line(run, tmp_path):
    r = copy_run(run, tmp_path); rewrite_json(r/"preprocessing.json", lambda p: p.update(mode="RGB"))
    one_line_error(cli("evaluate", r, "--device", "cpu"), f"{r/'preprocessing.json'}: mode=RGB makes 3-channel images", "takes 1 channel")


# --- settings checked before work ---------------------------------------------------------------------------------------

def usage_error(argv, capsys) -> str:
    "The one line argparse writes for a bad value (`UsageParser`), after checking the exit code 2."
    with pytest.raises(SystemExit) as e: main(list(map(str, argv)))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("flags, fragment", [
    (["--hnsw-m", "0", "--approximate", "hnsw"], "argument --hnsw-m: must be an integer from 1 to 1024, not 0"),
    (["--hnsw-m", "100000", "--approximate", "hnsw"], "argument --hnsw-m: must be an integer from 1 to 1024, not 100000"),
    (["--nlist", "0", "--approximate", "ivf"], "argument --nlist: must be an integer from 1 to 1048576, not 0"),
    (["--nprobe", "-3", "--approximate", "ivf"], "argument --nprobe: must be an integer from 1 to 1048576, not -3"),
    (["--batch-size", "0"], "argument --batch-size: must be an integer from 1 to 65536, not 0"),
    (["--batch-size", "x"], "argument --batch-size: not an integer: 'x'")])
def test_index_values_faiss_would_abort_on_are_refused_first(run, tmp_path, capsys, flags, fragment):
    assert fragment in usage_error(["index", run, tmp_path, "--out", tmp_path/"ix", *flags], capsys)
    assert not (tmp_path/"ix").exists()


def test_embed_batch_size_is_checked(run, tmp_path, capsys):
    assert "must be an integer from 1 to 65536, not -1" in usage_error(["embed", run, tmp_path, "--out", tmp_path/"e.npz", "--batch-size", "-1"], capsys)


@pytest.mark.parametrize("settings", [dict(kind="hnsw", hnsw_m=0), dict(kind="ivf", nlist=0), dict(kind="ivf", nprobe=0), dict(kind="flat", nprobe=True)])
def test_the_index_api_refuses_what_faiss_would_abort_on(settings):
    from dml_book.index import Index
    from dml_book.registry import ConfigError
    with pytest.raises(ConfigError, match="is invalid: expected an integer from 1 to"): Index(8, **settings)


@pytest.mark.parametrize("dataset, kwargs, fragment", [
    ("glyphs", {"size": 100000}, "takes size from 8 to 256"), ("glyphs", {"size": 0}, "takes size from 8 to 256"),
    ("glyphs", {"per_font": 0}, "takes per_font from 1 to 64"), ("glyphs", {"seed": -1}, "takes seed from 0 to"),
    ("glyphs", {"size": "big"}, "expects an integer"), ("glyphs_xl", {"n_classes": 99999}, "n_classes must be between 2 and"),
    ("glyphs_xl", {"min_images": 5, "max_images": 2}, "need 1 <= min_images <= max_images"),
    ("glyphs_xl", {"strength": -1}, "takes strength from 0 to 4"), ("glyphs_pretrain", {"images": 0}, "takes images from 1 to 256"),
    ("digits", {"download": 3}, "expects true or false")])
def test_built_in_datasets_keyword_arguments_are_one_line(tmp_path, dataset, kwargs, fragment):
    one_line_error(cli("train", "--dataset", dataset, "--dataset-kwargs", json.dumps(kwargs), "--no-umap", "--no-progress",
                       "--out", tmp_path/"run"), fragment)
    assert not (tmp_path/"run"/"checkpoint.pt").exists()


def test_evaluate_checks_its_dataset_kwargs(run, tmp_path):
    one_line_error(cli("evaluate", run, "--dataset-kwargs", '{"size": 4}', "--device", "cpu"), "takes size from 8 to 256")


# --- training that cannot learn -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, fragment", [
    (["--batch-size", "8", "--m-per-class", "8"], "batches of 1 class(es) x 8 image(s): the triplet loss finds no negative"),
    (["--batch-size", "8", "--m-per-class", "1"], "batches of 8 class(es) x 1 image(s): the triplet loss finds no positive"),
    (["--loss", "contrastive", "--batch-size", "4", "--m-per-class", "4"], "the contrastive loss finds no negative"),
    (["--loss", "margin", "--batch-size", "6", "--m-per-class", "1"], "the margin loss finds no positive"),
    # issue 62: before, these passed and trained at a loss of exactly 0 (pairs), or on one class per batch (proxies, rows)
    *[(["--loss", loss, "--batch-size", "8", "--m-per-class", "8"], f"batches of 1 class(es) x 8 image(s): the {loss} loss finds no negative")
      for loss in ("npair", "angular", "lifted", "multisimilarity", "proxyanchor", "proxynca", "normsoftmax")],
    *[(["--loss", loss, "--batch-size", "8", "--m-per-class", "1"], f"the {loss} loss finds no positive") for loss in ("npair", "angular", "lifted", "multisimilarity")],
    (["--method", "ala", "--m-per-class", "1"], "method ALA draws batches of 120 class(es) x 1 image(s): the triplet loss finds no positive"),
    (["--method", "dmml", "--method-kwargs", '{"n_classes": 1}'], "method DMML draws batches of 1 class(es)"),
    (["--method", "episodes", "--method-kwargs", '{"n_classes": 1}'], "method EpisodeBaseline draws batches of 1 class(es)")])
def test_a_batch_plan_without_negatives_or_positives_is_refused_before_the_run(tmp_path, flags, fragment):
    one_line_error(cli("train", "--dataset", "digits", *flags, "--no-umap", "--no-progress", "--out", tmp_path/"run"), fragment)
    assert not (tmp_path/"run").exists()


def test_a_batch_plan_proxies_learn_from_is_accepted():
    from dml_book.config import check_batch_plan
    check_batch_plan(TrainConfig(loss="proxyanchor", batch_size=4, m_per_class=1))   # one image per class: its proxy is the positive
    check_batch_plan(TrainConfig(loss="normsoftmax", batch_size=8, m_per_class=1))


COLLAPSING = ["--dataset", "digits", "--optimizer", "sgd", "--lr-backbone", "0.01", "--lr-head", "0.01", "--weight-decay", "100",
              "--epochs", "2", "--max-steps-per-epoch", "20", "--embedding-dim", "8", "--no-umap", "--no-progress"]   # w <- w - 0.01 * 100 w = 0


def test_a_collapsed_embedding_stops_the_run_like_a_nan(tmp_path):
    r = cli("train", *COLLAPSING, "--out", tmp_path/"run")
    one_line_error(r, "training stopped learning at epoch 1, step 20: the test embeddings collapsed to one point", "--allow-collapse")
    assert not (tmp_path/"run"/"checkpoint.pt").exists()   # stopped before the epoch's checkpoint, as a NaN is
    losses = [json.loads(l)["loss"] for l in (tmp_path/"run"/"log.jsonl").read_text().splitlines() if '"step"' in l and '"loss"' in l]
    assert len(losses) == 20 and losses[-2] == losses[-1] and abs(losses[-1] - 0.2) < 1e-6   # the triplet loss sits at its margin
    r = cli("train", *COLLAPSING, "--allow-collapse", "--out", tmp_path/"run2")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("steps", ["1", "3"])
def test_a_short_run_that_collapsed_does_not_finish_successfully(tmp_path, steps):
    "Issue 62: before, a run of fewer than 20 logged steps was never judged, so this one (weights decayed to 0) ended with exit 0."
    short = [a if b != "--max-steps-per-epoch" else steps for a, b in zip(COLLAPSING, ["", *COLLAPSING])]
    one_line_error(cli("train", *short, "--out", tmp_path/"run"),
                   f"training stopped learning at epoch 1, step {steps}: the test embeddings collapsed to one point")
    assert not (tmp_path/"run"/"metrics.json").exists()


def test_a_short_run_near_one_point_that_ranks_well_is_not_stopped():
    "The embedding alone judges a short run only at chance: a few steps of a large network can sit near one point and rank well."
    from dml_book.learning import collapse_reason
    labels = np.repeat(np.arange(10), 5)
    near = torch.ones(1, 10) + 1e-5 * torch.nn.functional.one_hot(torch.as_tensor(labels), 10).float()   # spread about 1e-6
    assert collapse_reason([0.2] * 3, near, labels, recall=0.9) is None
    assert collapse_reason([0.2] * 3, near, labels, recall=0.08).startswith("the test embeddings collapsed")


def test_a_loss_pinned_at_chance_recall_is_named():
    from dml_book.learning import collapse_reason, chance_recall
    labels = np.repeat(np.arange(10), 5); emb = torch.randn(50, 8, generator=torch.Generator().manual_seed(0))
    why = collapse_reason([0.2] * 25, emb, labels, recall=chance_recall(labels))
    assert why.startswith("the loss stayed at 0.2 for 20 logged steps while Recall@1 is 0.082, near chance (0.082)"), why
    assert collapse_reason([0.2] * 25, emb, labels, recall=0.9) is None   # satisfied triplets in a run that learned


def test_a_benchmarks_list_and_archive_are_read_through_the_reading_layer(tmp_path):
    "CUB's images.txt as a FIFO, or as a link out of the dataset folder; an archive that is a FIFO: each one line, none waited on."
    from dml_book.data.replicas import write_cub
    from dml_book.data.download import file_hash
    write_cub(tmp_path/"data", classes=(1, 2, 101, 102), per_class=2)
    images = tmp_path/"data"/"CUB_200_2011"/"images.txt"; text = images.read_text()
    argv = ["train", "--dataset", "cub200", "--data-root", tmp_path/"data", "--batch-size", "4", "--m-per-class", "2", "--ks", "1",
            "--no-umap", "--no-progress", "--out", tmp_path/"run"]
    images.unlink(); os.mkfifo(images)
    one_line_error(cli(*argv, fresh=True), f"index file {images} is a FIFO (named pipe), not a regular file")
    images.unlink(); (tmp_path/"list.txt").write_text(text); images.symlink_to(tmp_path/"list.txt")
    one_line_error(cli(*argv), f"index file {images} leads outside")
    os.mkfifo(tmp_path/"a.tgz")
    with pytest.raises(FileError, match="archive .*a.tgz is a FIFO"): file_hash(tmp_path/"a.tgz")


@pytest.mark.parametrize("named", ["folder", "file"])
def test_a_dataset_csv_linked_out_of_its_folder_is_refused_quoting_nothing(tmp_path, named):
    root = make_tree(tmp_path/"data"); write_csv(root)
    (root/"dataset.csv").unlink()
    secret = tmp_path/"secret.csv"; secret.write_text("the_secret_column,other\n1,2\n")
    (root/"dataset.csv").symlink_to(secret)
    r = cli("train", "--dataset", "csv", "--data-root", root if named == "folder" else root/"dataset.csv", *OWN, "--out", tmp_path/"run")
    one_line_error(r, "leads outside", str(root))
    assert "the_secret_column" not in r.stderr and "secret.csv" not in r.stderr
