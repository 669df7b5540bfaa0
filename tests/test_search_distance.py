"`dml-book search` says what its distances are, and they are what it says: Euclidean and not squared (l2), 1 - inner product (ip)."
import contextlib, io, json
import numpy as np, pytest
from PIL import Image
from dml_book.cli import main
from dml_book.train import Trainer, TrainConfig


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): code = main(list(map(str, argv)))
    assert code == 0, err.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    "A one-epoch run on 16-pixel glyphs, 12 of its test images as PNG files, and their embeddings from `dml-book embed`."
    d = tmp_path_factory.mktemp("served")
    trainer = Trainer(TrainConfig(dataset="glyphs", dataset_kwargs={"size": 16, "per_font": 1}, embedding_dim=16, batch_size=32,
                                  m_per_class=4, max_steps_per_epoch=2, ks=(1,), epochs=1, out=str(d/"run")))
    trainer.fit()
    (d/"imgs").mkdir()
    for i in range(12): Image.fromarray(trainer.test_ds.images[i]).save(d/"imgs"/f"{i:02d}.png")
    cli("embed", d/"run", d/"imgs", "--out", d/"emb.npz")
    e = np.load(d/"emb.npz")
    return d, dict(zip(map(str, e["paths"]), e["embeddings"]))


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_search_distances_are_what_it_says(served, metric):
    d, emb = served
    cli("index", d/"run", d/"imgs", "--out", d/f"ix-{metric}", "--metric", metric, "--force")
    q = d/"imgs"/"03.png"
    found, = json.loads(cli("search", d/f"ix-{metric}", q, "-k", "5", "--json"))
    a = emb[str(q.resolve())]
    for r in found["neighbours"]:
        b = emb[r["path"]]
        expected = np.linalg.norm(a - b) if metric == "l2" else 1 - a @ b
        assert r["distance"] == pytest.approx(float(expected), abs=1e-4)
    assert found["distance_is"] == ("Euclidean distance, not squared" if metric == "l2" else
                                    "1 - inner product: the cosine distance of L2-normalised embeddings")
    assert cli("search", d/f"ix-{metric}", q, "-k", "2").splitlines()[0] == f"{q}: ({found['distance_is']})"
