"Tests of dml_book.metrics and dml_book.reid_metrics against brute-force references and peer libraries."
import warnings

import faiss
import numpy as np
import pytest
import torch
from sklearn.metrics import normalized_mutual_info_score

from dml_book import metrics
from dml_book.reid_metrics import reid_evaluate, flip_averaged_features
from dml_book.metrics import (evaluate, knn, knn_chunks, kmeans_assign, nmi, pairwise_f1, gpu_available, gpu_ids,
                              shard_gallery, search_shards, count_ahead, count_ahead_knn, first_hit, prepare,
                              average_precision_at_r)


# ---------------------------------------------------------------- brute-force references
def brute_distances(x, g, distance):
    x, g = np.asarray(x, np.float64), np.asarray(g, np.float64)
    if distance == "cosine":
        x, g = x / np.linalg.norm(x, axis=1, keepdims=True), g / np.linalg.norm(g, axis=1, keepdims=True)
        return 1 - x @ g.T
    return np.sqrt(((x[:, None] - g[None]) ** 2).sum(-1))


def brute_retrieval(x, y, ks, gx=None, gy=None, distance="euclidean"):
    "Recall@K, MAP@R, R-Precision with a full distance matrix, query by query."
    single = gx is None
    gx, gy = (x, y) if single else (gx, gy)
    d = brute_distances(x, gx, distance)
    out = {f"R@{k}": 0.0 for k in ks}
    aps, rps = [], []
    for i in range(len(x)):
        cand = [j for j in np.argsort(d[i], kind="stable") if not (single and j == i)]
        rel = [gy[j] == y[i] for j in cand]
        for k in ks:
            out[f"R@{k}"] += any(rel[:k]) / len(x)
        r = sum(rel)
        if r == 0:
            continue
        hits, s = 0, 0.0
        for pos in range(r):
            if rel[pos]:
                hits += 1
                s += hits / (pos + 1)
        aps.append(s / r)
        rps.append(hits / r)
    return {**out, "MAP@R": np.mean(aps), "R-Precision": np.mean(rps)}


def brute_pair_f1(y, c):
    tp = fp = fn = 0
    for i in range(len(y)):
        for j in range(i + 1, len(y)):
            same_y, same_c = y[i] == y[j], c[i] == c[j]
            tp += same_y and same_c
            fp += same_c and not same_y
            fn += same_y and not same_c
    p, r = tp / (tp + fp), tp / (tp + fn)
    return 2 * p * r / (p + r)


RETRIEVAL = ("R@K", "MAP@R", "R-Precision")


# ---------------------------------------------------------------- retrieval metrics
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("max_memory", [2_000, 256 * 2**20])  # many tiny chunks / one chunk
def test_single_set_matches_brute_force(distance, max_memory):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(150, 5)), rng.integers(0, 15, 150)
    got = evaluate(x, y, ks=(1, 2, 4, 8, 30), metrics=RETRIEVAL, distance=distance, max_memory=max_memory)
    want = brute_retrieval(x, y, (1, 2, 4, 8, 30), distance=distance)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-12), k


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_query_gallery_matches_brute_force(distance):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(80, 6)), rng.integers(0, 10, 80)
    gx, gy = rng.normal(size=(130, 6)), rng.integers(0, 10, 130)
    got = evaluate(torch.tensor(x), torch.tensor(y), ks=(1, 5, 130), metrics=RETRIEVAL, gallery=torch.tensor(gx),
                   gallery_labels=torch.tensor(gy), distance=distance, max_memory=5_000)
    want = brute_retrieval(x, y, (1, 5, 130), gx, gy, distance)
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-12), k
    assert got["R@130"] == 1.0  # every query class occurs in the gallery


def test_agrees_with_pytorch_metric_learning():
    "The metrics both libraries compute, on the same data, including PML's k-means seed."
    pml = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
    rng = np.random.default_rng(3)
    y = np.repeat(np.arange(40), rng.integers(2, 8, 40))
    x = (rng.normal(size=(40, 16))[y] + rng.normal(size=(len(y), 16))).astype(np.float32)
    calc = pml.AccuracyCalculator(include=("precision_at_1", "NMI", "mean_average_precision_at_r", "r_precision"),
                                  k="max_bin_count", device=torch.device("cpu"))
    theirs = calc.get_accuracy(torch.tensor(x), torch.tensor(y))
    ours = evaluate(x, y, ks=(1,), seed=1234)  # faiss' default seed, which PML leaves unchanged
    assert ours["R@1"] == pytest.approx(theirs["precision_at_1"], abs=1e-6)
    assert ours["MAP@R"] == pytest.approx(theirs["mean_average_precision_at_r"], abs=1e-6)
    assert ours["R-Precision"] == pytest.approx(theirs["r_precision"], abs=1e-6)
    assert ours["NMI"] == pytest.approx(theirs["NMI"], abs=1e-9)


def test_knn_removes_self_among_exact_duplicates():
    rng = np.random.default_rng(4)
    x = np.repeat(rng.normal(size=(30, 3)), 3, axis=0)  # triplets of identical rows
    _, idx = knn(x, 2, max_memory=400)
    assert not (idx == np.arange(90)[:, None]).any()
    assert (idx // 3 == np.arange(90)[:, None] // 3).all()  # the two twins come first


# ---------------------------------------------------------------- Recall@K by counting, with exact ties
def tied(rng, n, dim, distance):
    "Embeddings with many exactly tied distances: small integers (Euclidean), or +-1 (cosine: +-0.5 once normalised)."
    assert distance == "euclidean" or dim == 4, "+-1 in 4 dimensions: exact in float32 once normalised"
    x = rng.integers(-2, 3, (n, dim)).astype(np.float32)
    return x if distance == "euclidean" else np.where(x < 0, -1, 1).astype(np.float32)


def brute_rank(x, y, gx=None, gy=None, distance="euclidean"):
    "Rank of each query's first same-class item after a stable sort of float64 distances (itself left out)."
    single = gx is None
    gx, gy = (x, y) if single else (gx, gy)
    d = brute_distances(x, gx, distance)
    out = []
    for i in range(len(x)):
        order = [j for j in np.argsort(d[i], kind="stable") if not (single and j == i)]
        rel = gy[order] == y[i]
        out.append(int(rel.argmax()) if rel.any() else len(order))
    return np.array(out)


def our_rank(x, y, gx=None, gy=None, distance="euclidean", block=1024, rows=None):
    q = torch.as_tensor(prepare(x, distance))
    g = q if gx is None else torch.as_tensor(prepare(gx, distance))
    rows = np.arange(len(x)) if rows is None else rows
    return count_ahead(q[rows], g, y[rows], y if gx is None else gy, rows if gx is None else None,
                       distance == "cosine", block)


def retrieval_v1(q, ql, g, gl, ks, distance, max_memory):
    "The previous `_retrieval`: lists as long as the largest K or R, Recall@K read off them with `first_hit`."
    labs, counts = np.unique(gl, return_counts=True)
    pos = np.searchsorted(labs, ql).clip(max=len(labs) - 1)
    r = np.where(labs[pos] == ql, counts[pos], 0) - (g is None)
    hit, ap, rp = np.empty(len(ql), np.int64), np.full(len(ql), np.nan), np.full(len(ql), np.nan)
    for s, _, idx in knn_chunks(q, max(max(ks), r.max(), 1), g, distance, max_memory=max_memory, gpus=None):
        match, sl = gl[idx] == ql[s:s + len(idx), None], slice(s, s + len(idx))
        hit[sl] = first_hit(match)
        ok = r[sl] > 0
        if ok.any():
            ap[sl][ok], rp[sl][ok] = average_precision_at_r(match[ok], r[sl][ok])
    return {**{f"R@{k}": float((hit < k).mean()) for k in ks}, "MAP@R": float(np.nanmean(ap)),
            "R-Precision": float(np.nanmean(rp))}


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("block", [1, 7, 1024])
def test_count_ahead_equals_brute_force_with_ties(distance, block):
    rng = np.random.default_rng(20)
    x, y = tied(rng, 110, 4, distance), rng.integers(0, 35, 110)  # some classes of one image: no class mate
    gx, gy = tied(rng, 90, 4, distance), rng.integers(0, 28, 90)  # query classes 28-34 are not in the gallery
    want = brute_rank(x, y, distance=distance)
    assert (want == 109).any() and len(set(want)) > 10
    np.testing.assert_array_equal(our_rank(x, y, distance=distance, block=block), want)
    want_g = brute_rank(x, y, gx, gy, distance)
    assert (want_g == 90).any()
    np.testing.assert_array_equal(our_rank(x, y, gx, gy, distance, block), want_g)
    rows = np.array([5, 99, 0, 42])  # a few queries on their own, in any order
    np.testing.assert_array_equal(our_rank(x, y, distance=distance, block=block, rows=rows), want[rows])


@pytest.mark.parametrize("n", [60, 160])  # faiss keeps lists of k < 100 in a heap, longer ones in a reservoir
def test_count_ahead_equals_faiss_lists_with_ties(n):
    "The ranks the previous implementation read off faiss' L2 lists, ties included."
    rng = np.random.default_rng(21)
    x, y = tied(rng, n, 4, "euclidean"), rng.integers(0, n // 4, n)
    _, idx = knn(x, n - 1, gpus=None)
    np.testing.assert_array_equal(our_rank(x, y, block=16), first_hit(y[idx] == y[:, None]))


# 400 bytes: blocks of 80 items, chunks of 1 query; 2,000: the one pass's chunks of 1 query; 256 MB: one chunk
@pytest.mark.parametrize("first, max_memory", [(f, m) for f in ("lists", "counts", "auto") for m in (400, 256 * 2**20)]
                                             + [("both", 2_000), ("both", 256 * 2**20)])
def test_retrieval_equals_the_old_implementation_and_brute_force_with_ties(first, max_memory):
    rng = np.random.default_rng(22)
    ks = [1, 2, 5, 20, 100]
    for distance in ("euclidean", "cosine"):
        x, y = tied(rng, 150, 4, distance), rng.integers(0, 40, 150)
        gx, gy = tied(rng, 120, 4, distance), rng.integers(0, 32, 120)
        for g, gl in ((None, y), (gx, gy)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # lone queries
                new = metrics._retrieval(x, y, g, gl, ks, RETRIEVAL, distance, max_memory, [], False, first)
                brute = brute_retrieval(x, y, ks, g, None if g is None else gy, distance)
                assert new == pytest.approx(brute, abs=1e-12)
                if distance == "euclidean":  # faiss' inner-product lists order ties differently (see the chapter)
                    assert new == retrieval_v1(x, y, g, gl, ks, distance, max_memory)


def test_evaluate_with_ties_lone_queries_and_small_memory():
    rng = np.random.default_rng(23)
    x, y = tied(rng, 90, 3, "euclidean"), np.r_[rng.integers(0, 20, 85), 100, 101, 102, 103, 104]
    with pytest.warns(UserWarning, match="of 90 queries have no item of their class"):
        got = evaluate(x, y, ks=(1, 3, 10, 60, 89), metrics=RETRIEVAL, max_memory=300)  # blocks of 60
    assert got == pytest.approx(brute_retrieval(x, y, (1, 3, 10, 60, 89)), abs=1e-12)
    assert got["R@89"] < 1  # the five lone queries miss even with the whole gallery


# ---------------------------------------------------------------- counts and lists in one pass
def our_counts_and_lists(x, y, gx=None, gy=None, distance="euclidean", block=1024, k=12, rows=None):
    q = torch.as_tensor(prepare(np.asarray(x, np.float32), distance))
    g = q if gx is None else torch.as_tensor(prepare(np.asarray(gx, np.float32), distance))
    rows = np.arange(len(x)) if rows is None else rows
    return count_ahead_knn(q[rows], g, y[rows], y if gx is None else gy, rows if gx is None else None,
                           distance == "cosine", k, block)


@pytest.mark.parametrize("data", ["random", "tied"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("block", [1, 7, 80])  # lists filled across blocks (k = 12) and within one
def test_count_ahead_knn_equals_brute_force(data, distance, block):
    rng = np.random.default_rng(30)
    make = (lambda n: rng.normal(size=(n, 4)).astype(np.float32)) if data == "random" else (lambda n: tied(rng, n, 4, distance))
    x, y = make(80), rng.integers(0, 26, 80)  # some classes of one image: no class mate
    gx, gy = make(60), rng.integers(0, 20, 60)  # query classes 20-25 are not in the gallery
    for g, gl in ((None, None), (gx, gy)):
        count, d, idx = our_counts_and_lists(x, y, g, gl, distance, block)
        want_d, want_i = brute_knn(x, 12, g, distance)
        np.testing.assert_array_equal(idx, want_i)
        np.testing.assert_allclose(np.sqrt(np.maximum(d, 0)) if distance == "euclidean" else 1 - d, want_d, atol=1e-5)
        want_rank = brute_rank(x, y, g, gl, distance)
        assert (want_rank == (79 if g is None else 60)).any()  # lone queries: every item is ahead
        np.testing.assert_array_equal(count, want_rank)
        np.testing.assert_array_equal(count, our_rank(x, y, g, gl, distance, block))  # `count_ahead`'s counts
        hit = (y if g is None else gl)[idx] == y[:, None]
        np.testing.assert_array_equal(first_hit(hit), np.minimum(count, 12))  # lists and counts agree
        if g is None:
            assert not (idx == np.arange(80)[:, None]).any()  # the query itself is no neighbour
    rows = np.array([5, 79, 0, 42])  # a few queries on their own, in any order
    count, _, idx = our_counts_and_lists(x, y, distance=distance, block=block, rows=rows)
    np.testing.assert_array_equal(idx, brute_knn(x, 12, None, distance)[1][rows])
    np.testing.assert_array_equal(count, brute_rank(x, y, distance=distance)[rows])


@pytest.mark.parametrize("n", [60, 160])
def test_count_ahead_knn_lists_equal_faiss_lists_with_ties(n):
    "As deep as the gallery: the same neighbours and distances as faiss' L2 search (heap and reservoir), ties included."
    rng = np.random.default_rng(31)
    x, y = tied(rng, n, 4, "euclidean"), rng.integers(0, n // 4, n)
    d, idx = knn(x, n - 1, gpus=None)
    count, d1, idx1 = our_counts_and_lists(x, y, block=16, k=n - 1)
    np.testing.assert_array_equal(idx1, idx)
    np.testing.assert_array_equal(d1, d)  # small integers: exact in float32
    np.testing.assert_array_equal(count, first_hit(y[idx] == y[:, None]))


def test_count_ahead_knn_with_a_class_of_one_and_a_short_gallery():
    x = np.array([[0.0], [0.1], [0.35], [5.0], [0.22]])
    y = np.array([0, 0, 1, 1, 2])  # class 2 has one image
    count, d, idx = our_counts_and_lists(x, y, k=4)
    np.testing.assert_array_equal(count, [0, 0, 3, 0, 4])  # query 4 has no class mate: all 4 others are ahead
    np.testing.assert_array_equal(idx[4], [1, 2, 0, 3])
    np.testing.assert_allclose(d[4], [0.12**2, 0.13**2, 0.22**2, 4.78**2], rtol=1e-5)
    _, d, idx = our_counts_and_lists(x[:2], y[:2], x[2:], y[2:], k=4)  # a gallery of 3: the 4th slot is empty
    np.testing.assert_array_equal(idx[:, -1], [-1, -1])
    assert np.isinf(d[:, -1]).all()


def test_auto_takes_one_pass_for_poor_embeddings_and_lists_for_good_ones(monkeypatch):
    calls = []
    for name in ("count_ahead_knn", "_lists"):
        def spy(*args, _f=getattr(metrics, name), _name=name, **kwargs):
            calls.append((_name, len(args[2]) if _name == "_lists" else len(args[0])))
            return _f(*args, **kwargs)
        monkeypatch.setattr(metrics, name, spy)
    rng = np.random.default_rng(32)
    y = np.repeat(np.arange(30), 4)
    for spread, want in ((0.0, ["count_ahead_knn"] * 4), (10.0, ["count_ahead_knn", "_lists", "_lists", "_lists"])):
        x = (rng.normal(size=(30, 8))[y] * spread + rng.normal(size=(120, 8))).astype(np.float32)
        calls.clear()
        got = metrics._retrieval(x, y, None, y, [1, 10, 50], RETRIEVAL, "euclidean", 300_000, [], False)
        assert [name for name, _ in calls] == want  # chunks of 38 queries: the first in one pass, then by its hits
        assert [n for _, n in calls] == [38, 38, 38, 6]
        assert got == pytest.approx(brute_retrieval(x, y, (1, 10, 50)), abs=1e-12)


# ---------------------------------------------------------------- clustering metrics
def test_nmi_matches_sklearn_on_the_kmeans_assignment():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 12, 300)
    x = rng.normal(size=(12, 8))[y] * 3 + rng.normal(size=(300, 8))
    c = kmeans_assign(x, 12, seed=7)
    assert nmi(y, c) == pytest.approx(normalized_mutual_info_score(y, c), abs=1e-12)
    res = evaluate(x, y, metrics=("NMI", "F1"), seed=7)
    assert res["NMI"] == pytest.approx(normalized_mutual_info_score(y, c), abs=1e-12)
    assert res["F1"] == pytest.approx(brute_pair_f1(y, c), abs=1e-12)
    assert kmeans_assign(x, 12, seed=7).tolist() == c.tolist()  # fixed seed, same assignment


@pytest.mark.parametrize("n_classes,n_clusters", [(3, 3), (7, 20), (25, 4)])
def test_nmi_and_f1_on_random_labelings(n_classes, n_clusters):
    rng = np.random.default_rng(n_classes)
    y, c = rng.integers(0, n_classes, 150), rng.integers(0, n_clusters, 150) + 100
    assert nmi(y, c) == pytest.approx(normalized_mutual_info_score(y, c), abs=1e-12)
    assert pairwise_f1(y, c) == pytest.approx(brute_pair_f1(y, c), abs=1e-12)


def test_clustering_edge_cases():
    y = np.array([0, 0, 1, 1, 2, 2])
    assert nmi(y, np.zeros(6, int)) == pytest.approx(normalized_mutual_info_score(y, np.zeros(6, int)))
    assert nmi(np.zeros(4, int), np.zeros(4, int)) == normalized_mutual_info_score(np.zeros(4), np.zeros(4)) == 1.0
    assert pairwise_f1(y, [5, 5, 9, 9, 7, 7]) == 1.0
    assert np.isnan(pairwise_f1([0, 1, 2], [0, 1, 2]))  # no pair in either labeling: undefined, not 0 or 1
    with pytest.raises(ValueError, match="cannot make 5 clusters of 3 points"):
        kmeans_assign(np.eye(3), 5)


# ---------------------------------------------------------------- bad input
def test_bad_input_is_refused():
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(20, 4)), rng.integers(0, 4, 20)
    with pytest.raises(ValueError, match=r"one label per embedding \(20\)"):
        evaluate(x, y[:-1])
    for bad in (np.nan, np.inf, -np.inf):
        xb = x.copy()
        xb[3, 1] = bad
        with pytest.raises(ValueError, match=r"1 rows with NaN or infinite values \(first: row 3\)"):
            evaluate(xb, y)
    with pytest.raises(ValueError, match="between 1 and the gallery size 19"):
        evaluate(x, y, ks=(1, 20))  # single-set: the query itself is not in its gallery
    with pytest.raises(ValueError, match="between 1 and the gallery size 5"):
        evaluate(x, y, ks=(6,), gallery=x[:5], gallery_labels=y[:5])
    with pytest.raises(ValueError, match="query has dimension 4, gallery 3"):
        evaluate(x, y, gallery=x[:, :3], gallery_labels=y)
    with pytest.raises(ValueError, match="all-zero embeddings"):
        evaluate(np.zeros((4, 2)), [0, 0, 1, 1], ks=(1,), distance="cosine")
    with pytest.raises(ValueError, match="unknown distance 'l1'"):
        evaluate(x, y, distance="l1")
    with pytest.raises(TypeError, match="must be integers"):
        evaluate(x, y.astype(float))
    if not gpu_available():
        with pytest.raises(RuntimeError, match="gpus=1, but faiss has no GPU support or sees no GPU"):
            evaluate(x, y, gpus=1)


def test_single_image_class_is_a_miss_in_recall_and_left_out_of_map_r():
    # classes: 0 (2 images, mutual nearest neighbours), 1 (2 images, far apart), 2 (1 image)
    x = np.array([[0.0], [0.1], [0.35], [5.0], [0.22]])
    y = np.array([0, 0, 1, 1, 2])
    with pytest.warns(UserWarning, match="1 of 5 queries have no item of their class"):
        res = evaluate(x, y, ks=(1, 4), metrics=RETRIEVAL)
    # R@1: queries 0, 1 and 3 hit; 2 (nearest: 4) misses; the lone query 4 is a miss.
    assert res["R@1"] == pytest.approx(3 / 5)
    assert res["R@4"] == pytest.approx(4 / 5)  # every query but the lone one finds its class within 4
    assert res["MAP@R"] == pytest.approx(np.mean([1, 1, 0, 1]))  # over the 4 queries that have R >= 1
    assert res == pytest.approx({k: v for k, v in brute_retrieval(x, y, (1, 4)).items()})


def test_all_lone_queries_give_nan_map_r_with_a_warning():
    with pytest.warns(UserWarning, match="3 of 3 queries"):
        res = evaluate(np.eye(3), [0, 1, 2], ks=(1,), metrics=RETRIEVAL)
    assert res["R@1"] == 0.0 and np.isnan(res["MAP@R"]) and np.isnan(res["R-Precision"])


# ---------------------------------------------------------------- re-identification
def brute_reid(qf, qp, qc, gf, gp, gc, ranks):
    "The Market-1501 protocol literally: sort, delete same-camera matches and junk, read CMC and AP."
    firsts, aps = [], []
    d = brute_distances(qf, gf, "euclidean")
    for i in range(len(qf)):
        ranking = [j for j in np.argsort(d[i], kind="stable")
                   if gp[j] != -1 and not (gp[j] == qp[i] and gc[j] == qc[i])]
        hits = [pos for pos, j in enumerate(ranking) if gp[j] == qp[i]]
        if not hits:
            continue
        firsts.append(hits[0])
        aps.append(np.mean([(n + 1) / (pos + 1) for n, pos in enumerate(hits)]))
    return {"mAP": np.mean(aps), **{f"CMC@{r}": np.mean(np.array(firsts) < r) for r in ranks}}


def test_reid_hand_built_case():
    # gallery on a line; queries at -1 (person 1, cam 0), 10 (person 2, cam 1), 4.4 (person 3, cam 0)
    gf = np.arange(10.0)[:, None]
    gp = np.array([1, -1, 0, 1, 2, 1, 2, 0, 3, 2])   # -1 junk, 0 distractors
    gc = np.array([0, 1, 2, 1, 1, 2, 0, 0, 0, 1])
    qf, qp, qc = np.array([[-1.0], [10.0], [4.4]]), np.array([1, 2, 3]), np.array([0, 1, 0])
    # query 0: valid ranking 2(d) 3(hit) 4 5(hit) 6 7 8 9 -> first 1, AP (1/2 + 2/4)/2 = 0.5
    # query 1: 9 (same camera) and 4 ignored -> 8 7 6(hit) ... -> first 2, AP 1/3
    # query 2: person 3 only in camera 0, its own -> no valid match, left out with a warning
    with pytest.warns(UserWarning, match="1 of 3 queries have no valid match"):
        res = reid_evaluate(qf, qp, qc, gf, gp, gc, ranks=(1, 2, 3))
    assert res == pytest.approx({"mAP": (0.5 + 1 / 3) / 2, "CMC@1": 0.0, "CMC@2": 0.5, "CMC@3": 1.0})
    assert res == pytest.approx(brute_reid(qf, qp, qc, gf, gp, gc, (1, 2, 3)))


@pytest.mark.parametrize("max_memory", [80 * 200 * 3, 256 * 2**20])
def test_reid_matches_brute_force(max_memory):
    rng = np.random.default_rng(8)
    qf, gf = rng.normal(size=(60, 6)), rng.normal(size=(200, 6))
    qp, qc = rng.integers(1, 15, 60), rng.integers(0, 3, 60)
    gp, gc = rng.integers(-1, 15, 200), rng.integers(0, 3, 200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = reid_evaluate(torch.tensor(qf), qp, qc, gf, gp, gc, ranks=(1, 5, 10, 200), max_memory=max_memory)
    assert res == pytest.approx(brute_reid(qf, qp, qc, gf, gp, gc, (1, 5, 10, 200)), abs=1e-12)


def test_reid_bad_input():
    f, p = np.ones((3, 2)), np.array([1, 2, 3])
    with pytest.raises(ValueError, match="gallery_camids must be 1-D with one label per embedding"):
        reid_evaluate(f, p, p, f, p, p[:2])
    with pytest.raises(ValueError, match="between 1 and the gallery size 3"):
        reid_evaluate(f, p, p, f, p, p + 1, ranks=(5,))
    with pytest.raises(ValueError, match="no query has a valid match"):
        reid_evaluate(f, p, p, f, p, p, ranks=(1,))  # every match is in the query's own camera


def test_flip_averaged_features():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    imgs = torch.randn(5, 1, 3, 4)
    want = (model(imgs) + model(imgs.flip(-1))) / 2
    got = flip_averaged_features(model, imgs, batch_size=2)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(flip_averaged_features(model, [(imgs[:3], 0), (imgs[3:], 1)]), want, atol=1e-6)
    sym = imgs + imgs.flip(-1)  # mirror-symmetric images: averaging changes nothing
    assert torch.allclose(flip_averaged_features(model, sym), model(sym), atol=1e-6)


@pytest.mark.skipif(not gpu_available(), reason="needs a GPU build of faiss and a GPU")
def test_gpu_and_cpu_agree():
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(500, 16)).astype(np.float32), rng.integers(0, 20, 500)
    cpu = evaluate(x, y, ks=(1, 4, 16), gpus=None)
    gpu = evaluate(x, y, ks=(1, 4, 16), gpus=1)
    for k in ("R@1", "R@4", "R@16", "MAP@R", "R-Precision"):
        assert gpu[k] == pytest.approx(cpu[k], abs=1e-3)


def test_metric_selection():
    rng = np.random.default_rng(10)
    x, y = rng.normal(size=(40, 4)), np.r_[np.arange(39) % 13, 99]  # class 99 has one image
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # clustering alone searches nothing, so no lone-query warning
        assert list(evaluate(x, y, metrics=("NMI",))) == ["NMI"]
    with pytest.warns(UserWarning, match="1 of 40 queries"):
        assert list(evaluate(x, y, ks=(3, 1), metrics=("R@K",))) == ["R@1", "R@3"]
    with pytest.raises(ValueError, match=r"unknown metrics \['recall'\]"):
        evaluate(x, y, metrics=("recall",))


@pytest.mark.skipif(not gpu_available() or faiss.get_num_gpus() < 2, reason="needs a GPU build of faiss and 2+ GPUs")
def test_all_gpus_and_one_gpu_agree():
    rng = np.random.default_rng(9)
    x, g = rng.normal(size=(300, 16)).astype(np.float32), rng.normal(size=(1001, 16)).astype(np.float32)
    for distance in ("euclidean", "cosine"):
        d1, i1 = knn(x, 600, g, distance, gpus=1, max_memory=2**20)
        dn, i_n = knn(x, 600, g, distance, gpus="all", max_memory=2**20)
        np.testing.assert_allclose(dn, d1, atol=1e-4)
        assert (i_n == i1).mean() > 0.999  # ties and float rounding aside


# ---------------------------------------------------------------- several GPUs, simulated on the CPU
def cpu_flat(part, metric, device):
    index = faiss.IndexFlat(part.shape[1], metric)
    index.add(part)
    return index


@pytest.fixture
def three_gpus(monkeypatch):
    "faiss as if it saw 3 GPUs; each 'GPU' flat index is a CPU `IndexFlat`. Returns the (device, index) made."
    made = []

    class Config:
        device = -1

    def gpu_index_flat(res, d, metric, cfg):
        assert isinstance(res, FakeResources)
        made.append((cfg.device, faiss.IndexFlat(d, metric)))
        return made[-1][1]

    class FakeResources:
        pass

    def to_gpus(index, co=None, gpus=None, ngpu=-1):
        made.append(("kmeans", list(gpus)))
        return index  # the CPU index: same assignment as without GPUs

    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 3)
    monkeypatch.setattr(faiss, "StandardGpuResources", FakeResources, raising=False)
    monkeypatch.setattr(faiss, "GpuIndexFlatConfig", Config, raising=False)
    monkeypatch.setattr(faiss, "GpuIndexFlat", gpu_index_flat, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpus_list", to_gpus, raising=False)
    monkeypatch.setattr(faiss, "knn_gpu", lambda *a, **kw: pytest.fail("knn_gpu called"), raising=False)
    monkeypatch.setattr(metrics, "_GPU_RES", {})
    return made


def brute_knn(x, k, g=None, distance="euclidean"):
    "Nearest-first gallery indices and distances from a float64 distance matrix (the query excluded if g is None)."
    d = brute_distances(x, x if g is None else g, distance)
    if g is None:
        np.fill_diagonal(d, np.inf)
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, 1), order


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("single_set", [False, True])
def test_sharded_search_equals_one_index_and_brute_force(three_gpus, distance, single_set):
    rng = np.random.default_rng(11)
    g = rng.normal(size=(70, 8)).astype(np.float32)  # 3 shards of 24, 23, 23: k = 30 exceeds each
    x = g if single_set else rng.normal(size=(45, 8)).astype(np.float32)
    gal = None if single_set else g
    d_all, i_all = knn(x, 30, gal, distance, max_memory=24 * 4 * 31 * 7)  # gpus="all": 3 shards, chunks of 7
    assert [(dev, index.ntotal) for dev, index in three_gpus] == [(0, 24), (1, 23), (2, 23)]  # built once
    d_cpu, i_cpu = knn(x, 30, gal, distance, gpus=None, max_memory=24 * 4 * 31 * 7)
    assert len(three_gpus) == 3  # gpus=None built nothing
    np.testing.assert_array_equal(i_all, i_cpu)
    np.testing.assert_array_equal(d_all, d_cpu)
    d_ref, i_ref = brute_knn(x, 30, gal, distance)
    np.testing.assert_array_equal(i_all, i_ref)
    if distance == "euclidean":
        np.testing.assert_allclose(np.sqrt(np.maximum(d_all, 0)), d_ref, atol=1e-5)
    else:
        np.testing.assert_allclose(1 - d_all, d_ref, atol=1e-5)
    if single_set:
        assert not (i_all == np.arange(70)[:, None]).any()


@pytest.mark.parametrize("metric", [faiss.METRIC_L2, faiss.METRIC_INNER_PRODUCT])
def test_sharded_search_with_ties_across_shards(metric):
    "Each gallery row three times, the copies in different shards: same distances, same sets up to the k-th distance."
    rng = np.random.default_rng(12)
    base = rng.normal(size=(17, 5)).astype(np.float32)
    g, q = np.concatenate([base] * 3), rng.normal(size=(20, 5)).astype(np.float32)  # 51 rows, shards of 13
    for k in (7, 20, 51):
        d, i = search_shards(shard_gallery(g, metric, [0, 1, 2, 3], cpu_flat), q, k, metric)
        d1, i1 = faiss.knn(q, g, k, metric=metric)
        np.testing.assert_array_equal(d, d1)
        assert (i >= 0).all() and all(len(set(row)) == k for row in i)  # k distinct gallery items
        assert (i % 17 == i1 % 17).all()  # the same base vector at every rank: tied copies only swap
        for r in range(len(q)):  # everything strictly closer than the k-th distance is the same set
            closer = (d[r] < d[r, -1]) if metric == faiss.METRIC_L2 else (d[r] > d[r, -1])
            assert set(i[r][closer]) == set(i1[r][closer])


def test_sharded_evaluate_and_kmeans_equal_the_cpu(three_gpus):
    rng = np.random.default_rng(13)
    y = np.repeat(np.arange(12), 9)[:101]
    x = rng.normal(size=(12, 8))[y] + rng.normal(size=(101, 8))
    on_gpus = evaluate(x, y, ks=(1, 4, 40), max_memory=5_000)
    devices = [dev for dev, _ in three_gpus]
    assert devices == [0, 1, 2, "kmeans"] and three_gpus[-1][1] == [0, 1, 2]
    assert evaluate(x, y, ks=(1, 4, 40), max_memory=5_000, gpus=None) == on_gpus
    assert len(three_gpus) == 4
    assert on_gpus == pytest.approx({**brute_retrieval(x, y, (1, 4, 40)), "NMI": on_gpus["NMI"], "F1": on_gpus["F1"]},
                                    abs=1e-12)
    three_gpus.clear()
    evaluate(x, y, ks=(1,), gpus=[2, 0])
    assert three_gpus[:2] == [(2, three_gpus[0][1]), (0, three_gpus[1][1])] and three_gpus[2] == ("kmeans", [2, 0])
    assert [index.ntotal for _, index in three_gpus[:2]] == [51, 50]


def test_gpus_argument(three_gpus):
    assert gpu_ids() == [0, 1, 2] and gpu_ids(2) == [0, 1] and gpu_ids([2, 1]) == [2, 1]
    assert gpu_ids(None) == gpu_ids(0) == gpu_ids([]) == []
    with pytest.raises(RuntimeError, match=r"gpus=4, but faiss sees 3 GPU\(s\), ids 0 to 2"):
        gpu_ids(4)
    with pytest.raises(RuntimeError, match="sees 3 GPU"):
        knn(np.eye(4), 1, gpus=[3])
    with pytest.raises(ValueError, match="names a GPU twice"):
        evaluate(np.eye(4), [0, 0, 1, 1], gpus=[1, 1])
    with pytest.raises(TypeError, match='pass "all", a number of GPUs'):
        gpu_ids(True)
    with pytest.raises(TypeError, match='pass "all", a number of GPUs'):
        gpu_ids("cuda")
    with pytest.raises(TypeError):
        gpu_ids([0.5])
    with pytest.raises(ValueError, match="must not be negative"):
        gpu_ids(-1)
    assert three_gpus == []  # refused before any index was built


def test_k_above_the_gpu_limit_runs_on_the_cpu(three_gpus):
    rng = np.random.default_rng(14)
    x, g = rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=(2100, 2)).astype(np.float32)
    d, i = knn(x, 2049, g)
    assert three_gpus == []
    np.testing.assert_array_equal(i, brute_knn(x, 2049, g)[1])
    knn(x, 2048, g)
    assert [dev for dev, _ in three_gpus] == [0, 1, 2]


def test_without_gpus_nothing_gpu_is_touched(monkeypatch):
    def touched(*args, **kwargs):
        raise AssertionError("a GPU entry point was called")
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0)
    for name in ("StandardGpuResources", "GpuIndexFlat", "GpuIndexFlatConfig", "index_cpu_to_gpus_list",
                 "index_cpu_to_all_gpus", "knn_gpu"):
        monkeypatch.setattr(faiss, name, touched, raising=False)
    monkeypatch.setattr(metrics, "_GPU_RES", {})
    rng = np.random.default_rng(15)
    x, y = rng.normal(size=(60, 4)), rng.integers(0, 6, 60)
    res = evaluate(x, y, ks=(1, 5))  # gpus="all" with no GPU: the CPU
    assert res == pytest.approx({**brute_retrieval(x, y, (1, 5)), "NMI": res["NMI"], "F1": res["F1"]}, abs=1e-12)
    assert res == evaluate(x, y, ks=(1, 5), gpus=None)
    assert metrics._GPU_RES == {}
    with pytest.raises(RuntimeError, match="gpus=1, but faiss has no GPU support or sees no GPU"):
        evaluate(x, y, gpus=1)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_sharded_lists_with_counts_and_ties_equal_the_cpu(three_gpus, distance):
    "The GPU path, simulated: lists from L2 shards (cosine too), counts beyond them; same numbers as the CPU."
    rng = np.random.default_rng(24)
    x, y = tied(rng, 100, 4, distance), rng.integers(0, 12, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_gpus = evaluate(x, y, ks=(1, 4, 40), metrics=RETRIEVAL, distance=distance, max_memory=4_000)
        assert [index.metric_type for _, index in three_gpus] == [faiss.METRIC_L2] * 3
        assert evaluate(x, y, ks=(1, 4, 40), metrics=RETRIEVAL, distance=distance, max_memory=4_000, gpus=None) == on_gpus
    assert on_gpus == pytest.approx(brute_retrieval(x, y, (1, 4, 40), distance=distance), abs=1e-12)
