"""icons (dml_book.data.icons): the freedesktop layout on generated replicas (index.theme, sizes, links, SVG and PNG),
designs, aliases, duplicates, the class-disjoint split, links that lead outside refused; and the installed themes."""
import os, subprocess
from pathlib import Path
import numpy as np
import pytest

from dml_book.registry import DATASETS, ConfigError
from dml_book.data import icons as I
from dml_book.data.icons import (Icons, IconLinkError, build_icons, design_of, find_themes, index_icons, near_duplicates,
                                 drop_duplicates, write_icon_replica, replica_svg, REPLICA_NAMES, ICON_PACKAGES, ICON_ROOT)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    return write_icon_replica(tmp_path_factory.mktemp("icons")/"share-icons")


@pytest.fixture(scope="module")
def cache(tmp_path_factory): return tmp_path_factory.mktemp("icons-cache")


def test_registered_with_a_tensor_interface(replica, cache):
    assert DATASETS.get("icons") is Icons and "icons" in DATASETS.names()
    ds = Icons(replica, "train", min_images=3, cache=str(cache))
    x, y = ds[0]
    assert tuple(x.shape) == (3, 32, 32) and 0 <= float(x.min()) and float(x.max()) <= 1 and y == 0
    assert ds.labels.dtype == np.int64 and list(np.unique(ds.labels)) == list(range(len(ds.class_names)))
    assert all(type(n) is str for n in ds.class_names) and Icons.default_transform(True) is None


def test_the_lookup_takes_one_48_pixel_drawing_per_name_and_leaves_symbolic_icons_and_fallbacks_out(replica):
    themes, drawings = index_icons(replica)
    assert "hicolor" not in {t.name for t in themes}
    beta = {d.name: d for d in drawings if d.theme == "Beta"}
    assert Path(beta["printer"].path).parent.parent.name == "48x48"        # not the 16-pixel PNG
    alpha = {d.name: d for d in drawings if d.theme == "Alpha"}
    assert alpha["printer"].path.endswith(".svg") and set(alpha) == set(REPLICA_NAMES)
    assert not any("symbolic" in d.name or "symbolic" in d.path for d in drawings)
    assert len({(d.theme, d.name) for d in drawings}) == len(drawings)        # one drawing per theme and name


def test_an_alias_is_one_image_filed_under_its_files_name(replica, cache):
    d = build_icons(replica, cache=str(cache))
    beta = d["names"][d["designs"] == "Beta"].tolist()
    assert "go-up" in beta and "go-down" not in beta      # Beta's go-down.png is a link to go-up.png
    rows = (d["designs"] == "Beta") & (d["names"] == "go-up")
    assert d["paths"][rows][0].endswith("go-up.png")


def test_variants_links_and_forks_are_one_design(replica):
    themes, drawings = index_icons(replica)
    assert design_of(themes, drawings) == {"Alpha": "Alpha", "Alpha-Dark": "Alpha", "Beta": "Beta", "Delta": "Delta",
                                           "Gamma": "Delta", "Epsilon": "Epsilon", "Menta": "Menta"}
    # Alpha-Dark is joined to Alpha by its links alone, by its Inherits= line alone, and by neither without both
    unlinked = [d for d in drawings if not (d.theme == "Alpha-Dark" and d.owner != d.theme)]
    orphan = [t if t.name != "Alpha-Dark" else I.IconTheme(t.name, t.folder, (), t.dirs) for t in themes]
    assert design_of(orphan, drawings)["Alpha-Dark"] == "Alpha" and design_of(themes, unlinked)["Alpha-Dark"] == "Alpha"
    assert design_of(orphan, unlinked)["Alpha-Dark"] == "Alpha-Dark"


def test_no_class_holds_two_identical_or_near_identical_drawings(replica, cache):
    d = build_icons(replica, cache=str(cache))
    assert "Menta" not in set(d["designs"].tolist())     # its drawings are recolours of Delta's
    for n in set(d["names"].tolist()):
        imgs = d["images"][d["names"] == n]
        assert len({x.tobytes() for x in imgs}) == len(imgs)
        near = near_duplicates(imgs)
        assert not (near & ~np.eye(len(imgs), dtype=bool)).any(), n
        assert len(set(d["designs"][d["names"] == n].tolist())) == len(imgs)   # at most one image per design


def test_near_duplicates_match_a_loop_over_pairs():
    import io, cairosvg
    from PIL import Image
    svg = lambda *a: np.asarray(Image.open(io.BytesIO(cairosvg.svg2png(bytestring=replica_svg(*a).encode(), output_width=24,
                                                                         output_height=24))).convert("RGBA"))
    imgs = np.stack([svg("printer", "circle", "#3465a4", "#ffffff"), svg("printer", "circle", "#a40000", "#ffffff"),
                     svg("scanner", "circle", "#3465a4", "#ffffff"), svg("printer", "square", "#3465a4", "#ffffff")])
    loop = np.array([[np.abs(a[..., 3] / 255 - b[..., 3] / 255).mean() <= I.NEAR_ALPHA and
                      I._correlation(a, b) >= I.NEAR_CORRELATION for b in imgs] for a in imgs])
    assert (near_duplicates(imgs) == loop).all()
    assert drop_duplicates(imgs) == [0, 2, 3]   # the recolour goes; another drawing on the same plate, and another plate, stay


def test_train_and_test_classes_are_disjoint_and_do_not_move_when_a_theme_goes(replica, cache, tmp_path):
    tr, te = (Icons(replica, s, min_images=3, cache=str(cache)) for s in ("train", "test"))
    assert not set(tr.class_names) & set(te.class_names) and len(tr.class_names) >= 2 and len(te.class_names) >= 2
    fewer = write_icon_replica(tmp_path/"fewer", names=REPLICA_NAMES[1:])   # one name fewer, and a theme fewer
    import shutil; shutil.rmtree(fewer/"Epsilon")
    tr2, te2 = (Icons(fewer, s, min_images=3, cache=str(tmp_path/"c")) for s in ("train", "test"))
    assert set(tr2.class_names) <= set(tr.class_names) and set(te2.class_names) <= set(te.class_names)


def test_a_link_out_of_the_icon_folder_is_refused_without_quoting_its_target(tmp_path):
    root = write_icon_replica(tmp_path/"icons")
    target = tmp_path/"private-place"/"hidden-target.svg"; target.parent.mkdir(); target.write_text(replica_svg("x"))
    link = root/"Delta/scalable/apps/printer.svg"; link.unlink(); link.symlink_to(target)
    with pytest.raises(IconLinkError, match=r"Delta/scalable/apps/printer.svg is a link that leads outside its theme folder") as e:
        build_icons(root, cache=str(tmp_path/"c"))
    assert "private" not in str(e.value) and "hidden" not in str(e.value) and "\n" not in str(e.value)
    link.unlink(); (root/"Zeta").symlink_to(target.parent)
    with pytest.raises(IconLinkError, match="Zeta is a link that leads outside the icon folder"): find_themes(root)
    (root/"Zeta").unlink(); (root/"Delta/index.theme").unlink(); (root/"Delta/index.theme").symlink_to(target)
    with pytest.raises(IconLinkError, match="Delta/index.theme is a link that leads outside the icon folder") as e:
        find_themes(root)
    assert "hidden" not in str(e.value)


def test_bad_input_is_one_line(tmp_path, replica):
    root = write_icon_replica(tmp_path/"icons")
    (root/"Delta/index.theme").write_text("no section header\nDirectories=x\n")
    with pytest.raises(ConfigError, match=r"Delta/index.theme is not an index.theme file \(MissingSectionHeaderError\)") as e:
        find_themes(root)
    assert "no section header" not in str(e.value)
    (root/"Delta/index.theme").unlink()
    (root/"Epsilon/scalable/apps/printer.svg").write_text("<svg><unclosed")   # an unreadable drawing is counted, not fatal
    d = build_icons(root, cache=str(tmp_path/"c"))
    assert int(d["failed"]) == 1 and "Delta" not in set(d["themes"].tolist())
    with pytest.raises(ConfigError, match="Icons has no split 'val'"): Icons(replica, "val")
    with pytest.raises(FileNotFoundError, match=f"no icon themes in {tmp_path/'none'}: install the themes with: sudo apt-get install -y"):
        Icons(tmp_path/"none", cache=str(tmp_path/"c"))
    with pytest.raises(ConfigError, match="icons: 0 train class"): Icons(replica, min_images=5, cache=str(tmp_path/"c"))


def test_the_trainer_runs_on_icons(replica, cache, tmp_path):
    from dml_book.train import Trainer
    t = Trainer(dataset="icons", data_root=str(replica), dataset_kwargs={"min_images": 3, "cache": str(cache)}, embedding_dim=8,
                batch_size=8, m_per_class=2, epochs=1, max_steps_per_epoch=1, ks=(1,), umap=False, progress=False, out=str(tmp_path/"run"))
    assert 0 <= t.fit()["R@1"] <= 1
    from dml_book.config import check_dataset_kwargs
    with pytest.raises(ConfigError, match="takes size from 8 to 256"): check_dataset_kwargs("icons", Icons, {"size": 4})


def test_the_set_up_script_installs_the_themes():
    script = (ROOT/"tools"/"system_packages.sh").read_text()
    listed = script.split('PACKAGES="', 1)[1].split('"', 1)[0].split()
    assert set(ICON_PACKAGES) <= set(listed) and "libcairo2" in listed


def test_the_installed_themes():
    "On the themes Debian installs, where they are: a sample of classes, each of at least min_images designs, none repeated."
    if not find_themes(ICON_ROOT):
        r = subprocess.run(["sh", str(ROOT/"tools"/"system_packages.sh"), "--command"], capture_output=True, text=True)
        pytest.skip(f"no icon themes in {ICON_ROOT}: {r.stdout.strip() or I.install_hint()}")
    tr, te = (Icons(split=s, max_classes=160) for s in ("train", "test"))   # the chapter's sample: cached once it ran
    assert not set(tr.class_names) & set(te.class_names)
    for ds in (tr, te):
        per = np.bincount(ds.labels)
        assert per.min() >= 4 and len(per) >= 20
        for c in range(len(per)):
            rows = ds.labels == c
            assert len(set(ds.designs[rows].tolist())) == rows.sum()
            assert len({x.tobytes() for x in ds.rgba[rows]}) == rows.sum()
    assert len(set(tr.designs.tolist()) | set(te.designs.tolist())) >= 10
