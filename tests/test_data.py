"Dataset loaders on tiny replicas of each archive layout; download, resume, checksum and extraction against 127.0.0.1."
import hashlib, shutil, tarfile
from pathlib import Path
import numpy as np, pytest, scipy.io, torch
from torch.utils.data import DataLoader
import dml_book.data as data
from dml_book.data import (CUB200, Cars196, SOP, Market1501, DukeMTMC, VeRi776, DatasetNotFoundError, ImageReadError,
                           DownloadError, Archive, download_url, extract_archive)
from dml_book.data.replicas import LocalServer, write_cub, write_cars, write_sop, write_market, write_duke, write_veri
from dml_book.registry import DATASETS
from dml_book.samplers import ClassBalancedBatchSampler

def contiguous(labels): return sorted(set(labels.tolist())) == list(range(labels.max() + 1))

def files_under(p): return sorted(str(q) for q in Path(p).rglob("*"))

# ---------------------------------------------------------------- retrieval

def test_cub_counts_split_names(tmp_path):
    classes = (1, 50, 100, 101, 150, 200)
    write_cub(tmp_path, classes=classes, per_class=4)
    tr, te = CUB200(tmp_path, "train"), CUB200(tmp_path/"CUB_200_2011", "test")
    assert (len(tr), len(te)) == (12, 12)
    assert contiguous(tr.labels) and contiguous(te.labels) and tr.labels.dtype == np.int64
    assert tr.class_names == ["001.Bird_1", "050.Bird_50", "100.Bird_100"]
    assert te.class_names == ["101.Bird_101", "150.Bird_150", "200.Bird_200"]
    assert not set(tr.class_names) & set(te.class_names)
    # every path's class folder agrees with its label (brute force over images.txt)
    for p, y in zip(te.paths, te.labels): assert p.parent.name == te.class_names[y]
    assert all(p.is_file() for p in tr.paths)

def test_cars_follows_mat_not_order(tmp_path):
    base = write_cars(tmp_path, classes=(1, 7, 98, 99, 120, 196), per_class=3, seed=4)
    tr, te = Cars196(tmp_path, "train"), Cars196(base, "test")
    assert (len(tr), len(te)) == (9, 9) and contiguous(tr.labels) and contiguous(te.labels)
    ann = scipy.io.loadmat(base/"cars_annos.mat", squeeze_me=True)["annotations"]
    truth = {str(r["relative_im_path"]): int(r["class"]) for r in ann}
    for ds in (tr, te):
        for p, y in zip(ds.paths, ds.labels):
            c = truth[f"car_ims/{p.name}"]
            assert ds.class_names[y] == f"Make Model {c} 2012"
            assert (c <= 98) == (ds.split == "train")                  # the `test` flag is ignored

def test_cars_bad_mat(tmp_path):
    base = write_cars(tmp_path)
    scipy.io.savemat(base/"cars_annos.mat", {"annotations": np.zeros((1, 2), dtype=[("class", object)]),
                                             "class_names": np.array([["a"]], dtype=object)})
    with pytest.raises(DatasetNotFoundError, match="no field 'relative_im_path'"): Cars196(tmp_path, "train")
    (base/"cars_annos.mat").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read .*cars_annos.mat"): Cars196(tmp_path, "train")

def test_sop_splits_from_files(tmp_path):
    base = write_sop(tmp_path, n_train=5, n_test=4, per_class=3)
    tr, te = SOP(tmp_path, "train"), SOP(base, "test")
    assert (len(tr), len(te), len(tr.class_names), len(te.class_names)) == (15, 12, 5, 4)
    assert contiguous(tr.labels) and contiguous(te.labels) and not set(tr.class_names) & set(te.class_names)
    rows = [l.split() for l in (base/"Ebay_test.txt").read_text().splitlines()[1:]]
    assert [str(base/r[3]) for r in rows] == [str(p) for p in te.paths]
    assert (np.diff(te.labels) >= 0).all()
    (base/"Ebay_test.txt").write_text("1 5 2 cabinet_final/x.JPG\n")              # header missing
    with pytest.raises(DatasetNotFoundError, match="should start with the header 'image_id class_id"): SOP(base, "test")

# ---------------------------------------------------------------- re-identification

def test_market_parsing_junk_distractors(tmp_path):
    base = write_market(tmp_path, train_ids=(2, 7, 10), test_ids=(1, 3, 4, 5), n_cams=3, per_cam=2, distractors=3, junk=4)
    tr, q, g = (Market1501(tmp_path, s) for s in ("train", "query", "gallery"))
    assert (len(tr), len(q), len(g)) == (18, 4, 4 * 6 + 3)
    assert -1 not in g.pids and (g.pids == 0).sum() == 3                       # junk out, distractors in
    assert all(p.suffix == ".jpg" for p in g.paths)                            # Thumbs.db ignored
    for ds in (tr, q, g):                                                      # parsing, checked against the names
        for p, pid, cam in zip(ds.paths, ds.pids, ds.camids):
            assert p.name.startswith(f"{pid:04d}_c{cam}s")
    assert not set(tr.pids.tolist()) & set(g.pids.tolist())
    assert contiguous(tr.labels) and contiguous(g.labels)
    # query and gallery share one numbering: equal labels <=> equal identities
    assert ((q.labels[:, None] == g.labels[None]) == (q.pids[:, None] == g.pids[None])).all()
    assert Market1501.protocol == "reid" and Market1501.default_transform(False)(g[0][0]).shape == (3, 256, 128)

def test_duke_and_veri(tmp_path):
    write_duke(tmp_path, train_ids=(1, 5, 9), test_ids=(2, 6), n_cams=4, per_cam=1)
    write_veri(tmp_path/"v", train_ids=(1, 2), test_ids=(3, 776), n_cams=2, per_cam=3)
    d = DukeMTMC(tmp_path, "train"); assert (len(d), d.pids.tolist()[:4], d.camids.tolist()[:4]) == (12, [1] * 4, [1, 2, 3, 4])
    v = VeRi776(tmp_path/"v"/"VeRi", "gallery")
    assert len(v) == 12 and sorted(set(v.pids.tolist())) == [3, 776] and v.class_names == ["0003", "0776"]
    assert VeRi776(tmp_path/"v", "query").pids.tolist() == [3, 776]

def test_registry_and_interface():
    for name, cls in [("cub200", CUB200), ("cars196", Cars196), ("sop", SOP), ("market1501", Market1501),
                      ("dukemtmc", DukeMTMC), ("veri776", VeRi776)]:
        assert DATASETS.get(name) is cls
        assert cls.protocol == ("reid" if name in ("market1501", "dukemtmc", "veri776") else "retrieval")
    assert data.DatasetNotFoundError is DatasetNotFoundError and issubclass(DatasetNotFoundError, FileNotFoundError)
    assert CUB200.default_transform(True).transforms[1].size == (224, 224)

def test_dataloader_with_sampler(tmp_path):
    write_cub(tmp_path, classes=tuple(range(1, 9)), per_class=4)
    ds = CUB200(tmp_path, "train", transform=CUB200.default_transform(True))
    dl = DataLoader(ds, batch_sampler=ClassBalancedBatchSampler(ds.labels, 8, 4))
    x, y = next(iter(dl))
    assert x.shape == (8, 3, 224, 224) and sorted(torch.bincount(y).tolist())[-2:] == [4, 4]

# ---------------------------------------------------------------- missing, incomplete, corrupt

def test_missing_and_incomplete(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=f"expected {tmp_path}/CUB_200_2011/images.txt.*layout is:\nCUB_200_2011/"):
        CUB200(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="Stanford_Online_Products/Ebay_train.txt"): SOP(tmp_path, "test")
    with pytest.raises(DatasetNotFoundError, match="Stanford no longer serves"): Cars196(tmp_path, "train", download=True)
    with pytest.raises(DatasetNotFoundError, match="withdrawn"): DukeMTMC(tmp_path, "train", download=True)
    base = write_cub(tmp_path)
    victim = sorted((base/"images").rglob("*.jpg"))[-1]
    victim.unlink()
    before = files_under(tmp_path)
    with pytest.raises(DatasetNotFoundError, match=f"expected {victim} \\(listed in images.txt\\).*incomplete \\(1 of 9"):
        CUB200(tmp_path, "test")
    assert files_under(tmp_path) == before                                    # nothing cached by a failed load
    CUB200(tmp_path, "train")                                                  # the other split is complete
    market = write_market(tmp_path)
    shutil.rmtree(market/"query")
    with pytest.raises(DatasetNotFoundError, match=f"expected {market/'query'}, which is missing"):
        Market1501(tmp_path, "query")
    with pytest.raises(DatasetNotFoundError, match="expected .*query"): Market1501(tmp_path, "gallery")

def test_corrupt_image_names_file(tmp_path):
    write_sop(tmp_path)
    ds = SOP(tmp_path, "train")
    ds.paths[1].write_bytes(ds.paths[1].read_bytes()[:100])
    ds[0]
    with pytest.raises(ImageReadError, match=f"cannot read image {ds.paths[1]}"): ds[1]
    market = write_market(tmp_path)
    (market/"query"/"junk_name.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match="junk_name.jpg.*is not a re-identification file name"): Market1501(tmp_path, "query")

# ---------------------------------------------------------------- download

def _archive(tmp_path, writer, fmt):
    src = tmp_path/"src"; folder = writer(src)
    return Path(shutil.make_archive(str(tmp_path/folder.name), fmt, src, folder.name)).read_bytes()

def test_download_resume_and_restart(tmp_path):
    blob = np.random.default_rng(0).bytes(200_000)
    md5 = hashlib.md5(blob).hexdigest()
    with LocalServer({"/f": blob}, truncate={"/f": 50_000}) as srv:
        with pytest.raises(DownloadError, match="truncated: 50000 of 200000 bytes"): download_url(srv.url + "/f", tmp_path/"f", md5, progress=False)
        assert download_url(srv.url + "/f", tmp_path/"f", md5, progress=False).read_bytes() == blob
        assert srv.requests[-1] == ("/f", "bytes=50000-")
        n = len(srv.requests)
        download_url(srv.url + "/f", tmp_path/"f", md5, progress=False)            # verified file: no request
        assert len(srv.requests) == n
    with LocalServer({"/f": blob}, truncate={"/f": 70_000}, ranges=False) as srv:   # server ignores Range: restart
        with pytest.raises(DownloadError, match="truncated"): download_url(srv.url + "/f", tmp_path/"g", md5, progress=False)
        assert download_url(srv.url + "/f", tmp_path/"g", md5, progress=False).read_bytes() == blob
    with LocalServer({"/f": blob}) as srv:                                          # stale partial of another file
        (tmp_path/"h.part").write_bytes(b"x" * 10)
        with pytest.raises(DownloadError, match="checksum mismatch"): download_url(srv.url + "/f", tmp_path/"h", md5, progress=False)
        assert not (tmp_path/"h.part").exists() and not (tmp_path/"h").exists()
        assert download_url(srv.url + "/f", tmp_path/"h", md5, progress=False).read_bytes() == blob

@pytest.mark.parametrize("cls,writer,fmt,name", [(CUB200, write_cub, "gztar", "CUB_200_2011.tgz"),
                                                  (SOP, write_sop, "zip", "Stanford_Online_Products.zip")])
def test_dataset_download(tmp_path, monkeypatch, cls, writer, fmt, name):
    arc = _archive(tmp_path, writer, fmt)
    root = tmp_path/"root"
    with LocalServer({"/" + name: arc}, truncate={"/" + name: len(arc) // 3}) as srv:
        monkeypatch.setattr(cls, "archives", (Archive(srv.url + "/" + name, name, md5="0" * 32),))
        with pytest.raises(DownloadError, match="truncated"): cls(root, "train", download=True)
        with pytest.raises(DownloadError, match="checksum mismatch"): cls(root, "train", download=True)
        assert [p.name for p in root.iterdir()] == []                             # nothing extracted, partial deleted
        with pytest.raises(DatasetNotFoundError, match=f"pass download=True to fetch {srv.url}"): cls(root, "train")
        monkeypatch.setattr(cls, "archives", (Archive(srv.url + "/" + name, name, sha256=hashlib.sha256(arc).hexdigest()),))
        (root/f".{name}.extracting").mkdir()                                       # leftover of an interrupted extraction
        ds = cls(root, "test", download=True)
    assert len(ds) > 0 and contiguous(ds.labels)
    assert sorted(p.name for p in root.iterdir()) == sorted([name, writer(tmp_path/"again").name])
    # resume after the truncation, afresh after the checksum failure
    assert [r[1] for r in srv.requests] == [None, f"bytes={len(arc) // 3}-", None]
    assert len(cls(root, "train", download=True)) > 0                           # present: no new request
    victim = cls(root, "train").paths[0]; victim.unlink()
    with pytest.raises(DatasetNotFoundError, match="incomplete"): cls(root, "train")
    assert len(cls(root, "train", download=True)) > 0 and victim.is_file()       # re-extracted from the archive
    assert len(srv.requests) == 3

def test_extract_rejects_corrupt(tmp_path):
    arc = _archive(tmp_path, write_veri, "gztar")
    (tmp_path/"cut.tgz").write_bytes(arc[: len(arc) // 2])
    with pytest.raises(DownloadError, match="corrupt or incomplete"): extract_archive(tmp_path/"cut.tgz", tmp_path/"out")
    assert list((tmp_path/"out").iterdir()) == []
    (tmp_path/"evil.tar").unlink(missing_ok=True)
    with tarfile.open(tmp_path/"evil.tar", "w") as t: t.add(tmp_path/"cut.tgz", arcname="../escape.tgz")
    with pytest.raises(DownloadError, match="unsafe member"): extract_archive(tmp_path/"evil.tar", tmp_path/"out2")
    assert not (tmp_path/"escape.tgz").exists()


def test_sop_reports_its_papers_recall_ks_on_the_command_line():
    "SOP's own default ks (1, 10, 100, 1000) apply where neither the user nor a preset set ks."
    from dml_book.cli import dataset_defaults
    from dml_book.train import TrainConfig
    cfg = TrainConfig(dataset="sop")
    assert dataset_defaults(cfg, {}, {}).ks == (1, 10, 100, 1000)
    assert dataset_defaults(cfg, {"ks": (1, 2)}, {}).ks == cfg.ks           # the user's flag wins
    assert dataset_defaults(cfg, {}, {"ks": (1, 5)}).ks == cfg.ks           # so does a preset's
    assert dataset_defaults(TrainConfig(dataset="cub200"), {}, {}).ks == TrainConfig().ks
