"glyphs_xl (GlyphProducts): determinism, class counts, images per class, label-disjoint split, clear errors."
import numpy as np
import pytest
from dml_book.data.glyph_products import GlyphProducts, code_points, render_class, font_coverage
from dml_book.registry import DATASETS


@pytest.fixture(scope="module")
def cache(tmp_path_factory): return tmp_path_factory.mktemp("glyphs_xl")


def test_candidates_many_distinct_classes(cache):
    cps = code_points(cache)
    assert len(cps) >= 1000 and len(set(cps.tolist())) == len(cps)
    cats = {__import__("unicodedata").category(chr(c))[0] for c in cps}
    assert cats <= set("LNPS") and len(cats) == 4   # letters, numbers, punctuation and symbols


def test_split_counts_and_images_per_class(cache):
    tr, te = (GlyphProducts(cache, s, n_classes=60) for s in ("train", "test"))
    assert len(tr.class_names) == 30 and len(te.class_names) == 30
    assert set(tr.class_names).isdisjoint(te.class_names) and set(tr.code_points).isdisjoint(te.code_points)
    for ds in (tr, te):
        counts = np.bincount(ds.labels)
        assert len(counts) == 30 and counts.min() >= 2 and counts.max() <= 12
        assert ds.images.shape[1:] == (32, 32) and ds.images.dtype == np.uint8
    assert DATASETS.get("glyphs_xl") is GlyphProducts


def test_deterministic_and_seeded_per_class(cache, tmp_path):
    a = GlyphProducts(cache, "train", n_classes=20)
    b = GlyphProducts(tmp_path, "train", n_classes=20)      # a fresh cache renders again
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    big = GlyphProducts(cache, "train", n_classes=60)       # more classes: the first ones' images unchanged
    assert np.array_equal(big.images[:len(a)], a.images)
    other = GlyphProducts(cache, "train", n_classes=20, seed=1)
    assert not np.array_equal(other.images[:2], a.images[:2])
    cov = font_coverage()
    x = render_class(ord("ж"), cov, strength=1.0); y = render_class(ord("ж"), cov, strength=0.0)
    assert len(x) == len(y) and not np.array_equal(x, y)


def test_errors(cache):
    with pytest.raises(ValueError, match="unknown split 'val'; choose from: train, test"): GlyphProducts(cache, "val", n_classes=20)
    with pytest.raises(ValueError, match="n_classes must be"): GlyphProducts(cache, "train", n_classes=1)
    with pytest.raises(ValueError, match="min_images <= max_images"): GlyphProducts(cache, "train", n_classes=20, min_images=5, max_images=3)
