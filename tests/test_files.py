"""Files the project writes and reads, and the errors that stay short (issue 41; issue 38's index that knows its model):
a link in an output folder, a kill between open and write, tampered run and index files, an alias bomb, a bomb PNG through
each decoder, a line break in a file name, evaluation splits that mean nothing, Ctrl-C and a closed pipe."""
import contextlib, hashlib, io, json, os, signal, struct, subprocess, sys, time, zlib
from pathlib import Path
from types import SimpleNamespace
import numpy as np
import pytest
from PIL import Image

from dml_book.cli import main
from dml_book.files import MANIFEST, write_json
from dml_book.train import TrainConfig, Trainer

GLYPHS = dict(dataset="glyphs", dataset_kwargs={"size": 16, "per_font": 1}, embedding_dim=16, batch_size=32,
              m_per_class=4, max_steps_per_epoch=2, ks=(1, 2))
FAST = ["--dataset", "digits", "--embedding-dim", "8", "--batch-size", "40", "--m-per-class", "8", "--epochs", "1",
        "--max-steps-per-epoch", "2", "--no-umap", "--no-progress"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*argv, fresh: bool = False):
    "`dml-book ARGV`: its exit code, stdout and stderr; in this process (a traceback fails the test), or a fresh one."
    if fresh: return subprocess.run([sys.executable, "-m", "dml_book.cli", *map(str, argv)], capture_output=True, text=True, env=ENV)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): code = main(list(map(str, argv)))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def one_line_error(r, fragment: str, code: int = 2):
    "`r` failed with `code` and one line on stderr (no traceback) that holds `fragment`."
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1 and fragment in r.stderr, r.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    "A one-epoch run on 16-pixel glyphs, some of its test glyphs as PNG files, and an index of them."
    d = tmp_path_factory.mktemp("files")
    trainer = Trainer(TrainConfig(**GLYPHS, epochs=1, out=str(d/"run"))); trainer.fit()
    (d/"pngs").mkdir()
    for i in range(12): Image.fromarray(trainer.test_ds.images[i]).save(d/"pngs"/f"{i:02d}.png")
    assert main(["index", str(d/"run"), str(d/"pngs"), "--out", str(d/"index")]) == 0
    return d


def copy_run(run, tmp_path) -> Path:
    import shutil
    return Path(shutil.copytree(run/"run", tmp_path/"run"))


# --- links in an output folder ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["log.jsonl", ".lock", "metrics.json", "checkpoint.pt"])
def test_a_link_in_the_run_folder_is_refused_and_its_target_untouched(tmp_path, name):
    out, target = tmp_path/"run", tmp_path/"target.txt"
    out.mkdir(); target.write_text("precious"); (out/name).symlink_to(target)
    one_line_error(cli("train", *FAST, "--out", out, fresh=name == ".lock"), f"{out/name} is a symbolic link")
    assert target.read_text() == "precious" and (out/name).is_symlink()
    assert sorted(p.name for p in out.iterdir()) == [name]   # nothing else written


def test_a_stale_temporary_link_is_never_written_through(tmp_path):
    "The old fixed temporary name `checkpoint.pt.tmp` as a link: the run trains, and neither the link nor its target changes."
    out, target = tmp_path/"run", tmp_path/"target.txt"
    out.mkdir(); target.write_text("precious"); (out/"checkpoint.pt.tmp").symlink_to(target)
    r = cli("train", *FAST, "--out", out)
    assert r.returncode == 0, r.stderr
    assert target.read_text() == "precious" and (out/"checkpoint.pt.tmp").is_symlink()
    assert not (out/"checkpoint.pt").is_symlink() and (out/"checkpoint.pt").stat().st_size > 1000


def test_appending_and_locking_do_not_follow_links(tmp_path):
    from dml_book.files import FileError, append_line, open_lock
    target = tmp_path/"target"; target.write_text("precious")
    (tmp_path/"log.jsonl").symlink_to(target); (tmp_path/".lock").symlink_to(target)
    with pytest.raises(FileError, match="log.jsonl is a symbolic link"): append_line(tmp_path/"log.jsonl", "{}")
    with pytest.raises(FileError, match=".lock is a symbolic link"): open_lock(tmp_path/".lock")
    assert target.read_text() == "precious"


# --- nothing half-written ----------------------------------------------------------------------------------------------

KILL_AFTER_OPENING = """
import builtins, io, os, signal
def killing(opener):
    def opened(path, *a, **k):
        r = opener(path, *a, **k)
        if "metrics.json" in str(path): os.kill(os.getpid(), signal.SIGKILL)   # opened, not yet written
        return r
    return opened
os.open = killing(os.open); builtins.open = io.open = killing(io.open)
"""

def test_a_kill_between_open_and_write_keeps_metrics_json_whole(tmp_path):
    "SIGKILL right after the file is opened: the old metrics.json is intact (a plain write_text leaves it empty)."
    for writer, left in [("from dml_book.files import write_json; write_json('metrics.json', {'R@1': 0.9})", '{"R@1": 0.5}\n'),
                         ("from pathlib import Path; Path('metrics.json').write_text('{}')", "")]:
        write_json(tmp_path/"metrics.json", {"R@1": 0.5})
        r = subprocess.run([sys.executable, "-c", KILL_AFTER_OPENING + writer], cwd=tmp_path, env=ENV)
        assert r.returncode == -signal.SIGKILL and (tmp_path/"metrics.json").read_text() == left


def test_a_run_killed_as_it_opens_metrics_json_stays_readable(run, tmp_path):
    "A finished run started again rewrites metrics.json; killed as it opens the file, the run still evaluates."
    out = copy_run(run, tmp_path); before = (out/"metrics.json").read_text()
    code = f"from dml_book.train import Trainer, TrainConfig\n{KILL_AFTER_OPENING}\nTrainer(TrainConfig(**{GLYPHS!r}, epochs=1, out={str(out)!r})).fit()"
    r = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert (out/"metrics.json").read_text() == before
    assert cli("evaluate", out, "--json").returncode == 0


def test_preprocessing_json_is_rewritten_at_every_start(run, tmp_path):
    out = copy_run(run, tmp_path); good = json.loads((out/"preprocessing.json").read_text())
    (out/"preprocessing.json").write_text("")   # left empty by an interrupted write of an older version
    r = cli("train", "--dataset", "glyphs", "--dataset-kwargs", json.dumps(GLYPHS["dataset_kwargs"]), "--embedding-dim", 16,
            "--batch-size", 32, "--m-per-class", 4, "--max-steps-per-epoch", 2, "--ks", 1, 2, "--epochs", 1,
            "--no-umap", "--no-progress", "--out", out)
    assert r.returncode == 0, r.stderr
    assert json.loads((out/"preprocessing.json").read_text()) == good


# --- tampered run and index files ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, fragment", [
    ("", "preprocessing.json is empty"),
    ('{"mode": "RGB", "resize": [40000, 40000], "center_crop": null, "mean": null, "std": null, "interpolation": "bilinear"}',
     "resize=[40000, 40000] is invalid"),
    ('{"mode": "L", "resize": [16, 16], "center_crop": null, "mean": [0.5], "std": [0.0], "interpolation": "bilinear"}',
     "std=[0.0] is invalid")])
def test_a_tampered_preprocessing_json_is_one_line(run, tmp_path, text, fragment):
    out = copy_run(run, tmp_path); (out/"preprocessing.json").write_text(text)
    one_line_error(cli("embed", out, run/"pngs", "--out", tmp_path/"e.npz"), fragment)
    assert not (tmp_path/"e.npz").exists()


def test_a_truncated_metrics_json_is_one_line(run, tmp_path):
    out = copy_run(run, tmp_path); (out/"metrics.json").write_text((out/"metrics.json").read_text()[:200])
    one_line_error(cli("evaluate", out), "metrics.json is not valid JSON")


def remanifest(folder: Path):
    "Make the manifest match the files, as a crafted folder would."
    write_json(folder/MANIFEST, dict(version=1, files={n: dict(bytes=len(b := (folder/n).read_bytes()), sha256=hashlib.sha256(b).hexdigest())
                                                       for n in ("index.faiss", "index.json")}))


def _index_copy(run, tmp_path) -> Path:
    import shutil
    return Path(shutil.copytree(run/"index", tmp_path/"index"))


def test_a_tampered_index_is_one_line(run, tmp_path):
    idx = _index_copy(run, tmp_path); meta = json.loads((idx/"index.json").read_text())
    q = sorted((run/"pngs").iterdir())[0]
    (idx/"index.json").write_text(json.dumps({**meta, "paths": meta["paths"][::-1]}))
    one_line_error(cli("search", idx, q), "index.json does not match")
    (idx/"index.json").write_text(json.dumps({**meta, "metric": "ip"})); remanifest(idx)   # edited with its manifest
    one_line_error(cli("search", idx, q), "index.faiss holds metric 'l2' but")
    (idx/"index.json").write_text(json.dumps({**meta, "dim": 10**9})); remanifest(idx)
    one_line_error(cli("search", idx, q), "dim=1000000000 is invalid")


def test_a_faiss_header_that_asks_for_16_gib_is_refused(run, tmp_path):
    idx = _index_copy(run, tmp_path); raw = bytearray((idx/"index.faiss").read_bytes())
    assert raw[:4] == b"IxF2"
    struct.pack_into("<q", raw, 8, 1 << 30); struct.pack_into("<Q", raw, 37, 1 << 32)   # ntotal and the vector's size
    (idx/"index.faiss").write_bytes(bytes(raw[:3000])); remanifest(idx)
    t = time.perf_counter()
    one_line_error(cli("search", idx, sorted((run/"pngs").iterdir())[0], fresh=True), "index.faiss cannot be read by faiss (MemoryError)")
    assert time.perf_counter() - t < 60


def test_an_index_written_halfway_is_refused(run, tmp_path):
    idx = _index_copy(run, tmp_path); (idx/MANIFEST).unlink()   # killed between the files and the manifest
    one_line_error(cli("search", idx, sorted((run/"pngs").iterdir())[0]), "has no manifest.json")


def test_search_refuses_another_checkpoint_and_takes_a_moved_run(run, tmp_path):
    "The index records its checkpoint's SHA-256: a changed checkpoint is refused in one line; --run DIR finds a moved run."
    import shutil
    idx = _index_copy(run, tmp_path); out = copy_run(run, tmp_path)
    meta = json.loads((idx/"index.json").read_text())
    assert len(meta["run"]["sha256"]) == 64
    (idx/"index.json").write_text(json.dumps({**meta, "run": {**meta["run"], "dir": str(out)}})); remanifest(idx)
    q = sorted((run/"pngs").iterdir())[3]
    assert json.loads(cli("search", idx, q, "--json").stdout)[0]["neighbours"][0]["path"] == str(q.resolve())
    Trainer(TrainConfig(**GLYPHS, epochs=2, out=str(out))).fit()   # trained one epoch more: another checkpoint
    one_line_error(cli("search", idx, q), "(trained further, or another run)")
    shutil.move(out, tmp_path/"moved")
    one_line_error(cli("search", idx, q), "if it moved, give its new place: --run DIR")
    one_line_error(cli("search", idx, q, "--run", tmp_path/"moved"), "(trained further, or another run)")
    r = cli("search", idx, q, "--run", run/"run", "--json")   # the run whose checkpoint embedded the gallery, given explicitly
    assert r.returncode == 0 and json.loads(r.stdout)[0]["neighbours"][0]["path"] == str(q.resolve()), r.stderr


def test_index_does_not_overwrite_another_runs_index(run, tmp_path):
    idx = _index_copy(run, tmp_path); other = copy_run(run, tmp_path)
    before = (idx/"index.json").read_text()
    one_line_error(cli("index", other, run/"pngs", "--out", idx), "holds the index of another run")
    assert (idx/"index.json").read_text() == before
    assert cli("index", other, run/"pngs", "--out", idx, "--force").returncode == 0
    assert json.loads((idx/"index.json").read_text())["run"]["dir"] == str(other.resolve())
    (tmp_path/"notes").mkdir(); (tmp_path/"notes"/"mine.txt").write_text("x")
    one_line_error(cli("index", other, run/"pngs", "--out", tmp_path/"notes"), "holds files that are not an index")


# --- values that stay short, settings checked up front ----------------------------------------------------------------

def test_a_yaml_alias_bomb_is_one_short_line_at_once(tmp_path, capsys):
    "376 bytes of YAML whose aliases make a billion leaves under dataset_kwargs: refused in a line of a few hundred characters."
    nine = lambda p: "[" + ", ".join([f"*{p}"] * 9) + "]"
    text = "dataset_kwargs:\n  a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(f"  {c}: &{c} {nine(p)}\n" for p, c in zip("abcdefgh", "bcdefghi"))
    (tmp_path/"bomb.yaml").write_text(text); assert len(text) < 700
    t = time.perf_counter()
    assert main(["train", "--config", str(tmp_path/"bomb.yaml"), "--out", str(tmp_path/"run")]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - t < 5 and err.count("\n") == 1 and len(err) < 600, err
    assert err.startswith("dml-book: error: dataset_kwargs={") and "is too large" in err


@pytest.mark.parametrize("argv, fragment", [
    (["--dataset-kwargs", "[" * 100_000], "argument --dataset-kwargs: not JSON (nested too deeply): '[[[["),
    (["--epochs", "x" * 100_000], "argument --epochs: not an integer: 'xxxx"),
    (["--method", "dcml", "--method-kwargs", '{"lr_compositor": "fast"}'], "lr_compositor='fast': method 'dcml' expects a number or None"),
    (["--config", "{tmp}/deep.yaml"], "nested too deeply"),
    (["--config", "{tmp}/huge.yaml"], "a configuration file is at most 1 MiB"),
    (["--epochs", "1", "--dataset", "x" * 10**5], "unknown dataset 'xxxxx")])
def test_settings_are_refused_up_front_in_one_short_line(tmp_path, capsys, argv, fragment):
    (tmp_path/"deep.yaml").write_text("dataset_kwargs: " + "[" * 100_000)
    (tmp_path/"huge.yaml").write_text("epochs: 1\n" + "#" * (2 << 20))
    try: code = main(["train", *[a.replace("{tmp}", str(tmp_path)) for a in argv], "--out", str(tmp_path/"run")])
    except SystemExit as e: code = e.code   # argparse's usage errors: one line too (`UsageParser`)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and fragment in err and len(err) < 1000, err
    assert not (tmp_path/"run").exists()


# --- images and names ---------------------------------------------------------------------------------------------------

def png_bomb(path: Path, side: int = 20000):
    "A 1-bit PNG of side x side black pixels: a few KB that decode to side**2 pixels."
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\0" * ((side // 8 + 1) * side), 9)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("decoder", ["pil", "torchvision"])
def test_a_bomb_png_is_refused_by_each_decoder(tmp_path, decoder):
    from dml_book.data.core import DECODERS, ImageReadError
    png_bomb(tmp_path/"bomb.png"); assert (tmp_path/"bomb.png").stat().st_size < 100_000
    with pytest.raises(ImageReadError, match="exceeds limit of 178956970 pixels"): DECODERS[decoder](tmp_path/"bomb.png")


def test_a_bomb_png_is_one_line_from_embed(run, tmp_path):
    png_bomb(tmp_path/"bomb.png")
    one_line_error(cli("embed", run/"run", tmp_path/"bomb.png", "--out", tmp_path/"e.npz"), "exceeds limit")


def test_a_line_break_in_a_file_name(run, tmp_path):
    "Refused for .npy (one path per line of e.paths.txt) before any work, nothing written; stored by .npz."
    (tmp_path/"imgs").mkdir()
    for name in ("a.png", "two\nlines.png"): Image.open(sorted((run/"pngs").iterdir())[0]).save(tmp_path/"imgs"/name)
    one_line_error(cli("embed", run/"run", tmp_path/"imgs", "--out", tmp_path/"e.npy"), "holds a line break")
    assert not (tmp_path/"e.npy").exists() and not (tmp_path/"e.paths.txt").exists()
    assert cli("embed", run/"run", tmp_path/"imgs", "--out", tmp_path/"e.npz").returncode == 0
    with np.load(tmp_path/"e.npz") as z: assert [Path(p).name for p in z["paths"]] == ["a.png", "two\nlines.png"]


@pytest.mark.parametrize("out, fragment", [("e.csv", "the output must end in .npz or .npy"), ("adir.npz", "is a folder, not a file"),
                                           ("afile/e.npz", "afile is a file, not a folder")])
def test_embed_outputs_are_checked_before_any_work(run, tmp_path, out, fragment):
    (tmp_path/"adir.npz").mkdir(); (tmp_path/"afile").write_text("")
    one_line_error(cli("embed", run/"run", run/"pngs", "--out", tmp_path/out), fragment)


def test_a_file_in_place_of_the_output_folder(tmp_path):
    (tmp_path/"run").write_text("")
    one_line_error(cli("train", *FAST, "--out", tmp_path/"run"), "is a file, not a folder")


# --- evaluation splits that cannot mean anything ------------------------------------------------------------------------

def test_a_one_class_test_split_is_refused(tmp_path, capsys):
    from dml_book.data.replicas import write_cub
    write_cub(tmp_path/"data", classes=(1, 2, 3, 101), per_class=4)
    assert main(["train", "--dataset", "cub200", "--data-root", str(tmp_path/"data"), "--batch-size", "6", "--m-per-class", "2",
                 "--ks", "1", "--no-umap", "--no-progress", "--out", str(tmp_path/"run")]) == 2
    err = capsys.readouterr().err
    assert "the test split has 1 class (['101.Bird_101']): every metric would read 1.0" in err and err.count("\n") == 1, err


def test_a_test_list_that_repeats_training_images_is_refused(tmp_path, capsys):
    from dml_book.data.replicas import write_sop
    base = write_sop(tmp_path/"data", n_train=3, n_test=3, per_class=2)
    repeated = [f"{100 + i} {row.split(maxsplit=1)[1]}" for i, row in enumerate((base/"Ebay_train.txt").read_text().splitlines()[1:3])]
    (base/"Ebay_test.txt").write_text("\n".join([*(base/"Ebay_test.txt").read_text().splitlines(), *repeated]) + "\n")
    assert main(["train", "--dataset", "sop", "--data-root", str(tmp_path/"data"), "--batch-size", "4", "--m-per-class", "2",
                 "--ks", "1", "--no-umap", "--no-progress", "--out", str(tmp_path/"run")]) == 2
    err = capsys.readouterr().err
    assert "the test split shares 2 image(s) with the training split" in err, err


def test_duplicate_ids_and_paths_outside_the_dataset_are_refused(tmp_path, capsys):
    from dml_book.data.replicas import write_cub
    write_cub(tmp_path/"data", classes=(1, 2, 101, 102), per_class=2)
    images = tmp_path/"data"/"CUB_200_2011"/"images.txt"; lines = images.read_text()
    argv = ["train", "--dataset", "cub200", "--data-root", str(tmp_path/"data"), "--batch-size", "4", "--m-per-class", "2",
            "--ks", "1", "--no-umap", "--no-progress", "--out", str(tmp_path/"run")]
    images.write_text(lines + "3 001.Bird_1/again.jpg\n")
    assert main(argv) == 2 and "images.txt lists id '3' twice" in capsys.readouterr().err
    images.write_text(lines.replace("001.Bird_1/", "/etc/", 1))
    assert main(argv) == 2 and "a path outside the dataset folder" in capsys.readouterr().err


# --- Ctrl-C and a closed pipe -------------------------------------------------------------------------------------------

def _as_in_a_terminal():
    "A child of a shell without job control (CI's `cmd &`, nohup) inherits SIGINT ignored; a terminal's Ctrl-C is not."
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_one_line_with_the_resume_hint(tmp_path):
    out = tmp_path/"run"
    p = subprocess.Popen([sys.executable, "-m", "dml_book.cli", "train", *FAST[:-6], "--epochs", "500", "--max-steps-per-epoch", "2",
                          "--no-umap", "--no-progress", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=ENV, preexec_fn=_as_in_a_terminal)
    try:
        for _ in range(3000):   # until the first epoch's checkpoint is written (minutes on a loaded machine)
            if (out/"checkpoint.pt").exists() or p.poll() is not None: break
            time.sleep(0.1)
        assert (out/"checkpoint.pt").exists(), "the run wrote no checkpoint: " + (p.communicate()[1] if p.poll() is not None else "still starting")
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)   # a guard against a hang, not a timing
    finally:
        if p.poll() is None: p.kill()
    assert p.returncode == 130, err
    assert err.count("\n") == 1 and "Traceback" not in err and "dml-book: interrupted; " in err and "resume" in err, err
    for line in (out/"log.jsonl").read_text().splitlines(): json.loads(line)   # whole lines only


def test_a_closed_pipe_ends_quietly():
    p = subprocess.Popen([sys.executable, "-m", "dml_book.cli", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    p.stdout.close()   # the reader is gone before the first line is written
    err = p.stderr.read(); p.wait(timeout=60)
    assert p.returncode == 141 and err == b"", err


# --- a full disk keeps the previous good output (issue 62) -----------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    "A 512 KiB tmpfs of its own (mounting needs root: the test is skipped where it cannot mount one)."
    d = tmp_path/"disk"; d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode: pytest.skip(f"cannot mount a small tmpfs here: {(r.stderr or 'not permitted').strip()[:100]}")
    try: yield d
    finally: subprocess.run(["umount", "-l", str(d)], check=False)


def fill(disk: Path, leave: int):
    "Fill `disk` until it is full, then free `leave` bytes: room for a small file, not for a large one."
    fd = os.open(disk/"filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096): pass
    except OSError: pass
    finally: os.close(fd)
    os.truncate(disk/"filler", max(0, (disk/"filler").stat().st_size - leave))


def files_of(folder: Path) -> dict:
    "{name: bytes} of every file in `folder` (temporary ones included), the filler aside."
    return {p.name: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "filler"}


def test_an_index_rebuilt_in_place_on_a_full_disk_keeps_the_old_one(small_disk):
    "Before: the manifest went first, so a full disk while the new files were written left no index at all."
    from dml_book.index import Index
    from dml_book.files import FileError
    rng = np.random.default_rng(0)
    Index.build(rng.normal(size=(20, 8)), [f"old{i}" for i in range(20)]).save(small_disk/"ix")
    before = files_of(small_disk); fill(small_disk, 16 << 10)
    big = Index.build(rng.normal(size=(4000, 8)), [f"new{i}" for i in range(4000)])   # some 200 KB of vectors and paths
    with pytest.raises(FileError, match="no space was left on the device"): big.save(small_disk/"ix", force=True)
    assert files_of(small_disk) == before   # every old file, byte for byte, and no temporary file left
    assert Index.load(small_disk/"ix").paths == [f"old{i}" for i in range(20)]


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_embeddings_rewritten_on_a_full_disk_keep_the_old_ones(small_disk, suffix):
    "Before: the .npy was deleted first, then the paths file failed to fit: the old embeddings were gone."
    from dml_book.inference import save_embeddings
    from dml_book.files import FileError
    save_embeddings(small_disk/f"e{suffix}", np.ones((4, 8), np.float32), [f"old{i}" for i in range(4)])
    before = files_of(small_disk); fill(small_disk, 16 << 10)
    with pytest.raises(FileError, match="no space was left"):
        save_embeddings(small_disk/f"e{suffix}", np.zeros((2000, 8), np.float32), [f"new-{i:04d}" * 4 for i in range(2000)])
    assert files_of(small_disk) == before


def test_a_checkpoint_and_a_metrics_file_on_a_full_disk_are_kept(small_disk):
    from dml_book.checkpoint import write_checkpoint, read_checkpoint, CheckpointError
    from dml_book.files import FileError, write_text
    import torch
    write_checkpoint(dict(epoch=1, w=torch.ones(4)), small_disk/"checkpoint.pt"); write_json(small_disk/"metrics.json", {"R@1": 0.5})
    before = files_of(small_disk); fill(small_disk, 16 << 10)
    with pytest.raises(CheckpointError, match="no space was left on the device; the previous checkpoint is intact"):
        write_checkpoint(dict(epoch=2, w=torch.ones(100_000)), small_disk/"checkpoint.pt")
    with pytest.raises(FileError, match="no space"): write_text(small_disk/"metrics.json", "x" * 100_000)
    assert files_of(small_disk) == before and read_checkpoint(small_disk/"checkpoint.pt")["epoch"] == 1


def test_pretrain_out_on_a_full_disk_keeps_the_old_copy(small_disk, tmp_path):
    "`dml-book pretrain --out`: the backbone and its record copied beside the old pair, then swapped in (before: shutil.copy over it)."
    from dml_book.pretrain import PretrainConfig, backbone_path
    cached = backbone_path(PretrainConfig(), tmp_path/"cache"); cached.parent.mkdir()
    cached.write_bytes(b"w" * 100_000); cached.with_suffix(".json").write_text(json.dumps({"config": {"skip": 1000}}))
    (small_disk/"b.pth").write_bytes(b"old weights"); (small_disk/"b.json").write_text('{"old": 1}')
    before = files_of(small_disk); fill(small_disk, 16 << 10)
    one_line_error(cli("pretrain", "--cache", tmp_path/"cache", "--out", small_disk/"b.pth", "--no-progress"), "no space was left")
    assert files_of(small_disk) == before
    (small_disk/"filler").unlink()
    assert cli("pretrain", "--cache", tmp_path/"cache", "--out", small_disk/"b.pth", "--no-progress").returncode == 0
    assert (small_disk/"b.pth").read_bytes() == cached.read_bytes() and (small_disk/"b.json").read_text() == cached.with_suffix(".json").read_text()


def test_an_experiment_that_fails_keeps_the_previous_executed_notebook(tmp_path, monkeypatch):
    "Before: papermill wrote over train_eval.ipynb as it ran, so a failed rerun (a full disk, a bad cell) lost the good one."
    import errno, papermill
    from dml_book.results import run_experiment
    (tmp_path/"train_eval.ipynb").write_text('{"good": true}')
    def fails_halfway(src, dest, **kw):
        Path(dest).write_text('{"cells": [')   # the cells run so far, then the disk fills up
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(papermill, "execute_notebook", fails_halfway)
    with pytest.raises(OSError, match="No space left"): run_experiment("train_eval", out_dir=str(tmp_path), progress=False)
    assert (tmp_path/"train_eval.ipynb").read_text() == '{"good": true}' and (tmp_path/"train_eval.failed.ipynb").read_text() == '{"cells": ['
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_eval.failed.ipynb", "train_eval.ipynb"]
    monkeypatch.setattr(papermill, "execute_notebook", lambda src, dest, **kw: Path(dest).write_text('{"new": true}'))
    assert run_experiment("train_eval", out_dir=str(tmp_path), progress=False).read_text() == '{"new": true}'


def test_a_file_that_already_holds_the_bytes_is_not_rewritten(tmp_path):
    "A command with nothing to change writes nothing: the same bytes leave the file's time (and inode) as they were; other bytes replace it."
    import time
    from dml_book.files import write_text
    p = write_text(tmp_path/"trials.csv", "a,b\n1,2\n"); st = os.stat(p); time.sleep(0.01)
    write_text(p, "a,b\n1,2\n")
    assert (os.stat(p).st_mtime_ns, os.stat(p).st_ino) == (st.st_mtime_ns, st.st_ino) and sorted(os.listdir(tmp_path)) == ["trials.csv"]
    write_text(p, "a,b\n1,3\n")
    assert p.read_text() == "a,b\n1,3\n" and os.stat(p).st_ino != st.st_ino
