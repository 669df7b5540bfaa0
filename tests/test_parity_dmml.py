"""DMML against the authors' code, number by number.

`tests/fixtures/parity/dmml.json` holds what the official `DMMLLoss` (CHENGY12/DMML, `loss/dmml.py`; repository, commit
and file:line in the fixture) computes on three fixed float64 episodes: its set distances, its loss and the loss's
gradient with respect to the embeddings (`tools/parity_dmml.py` wrote it; neither that script nor the official code is
needed here). Where our computation is the official one the tests ask for equality element by element at a relative
1e-12 (`parity.assert_parity`), values and gradients; where the chapter follows the paper instead (squared Euclidean distances in the hard mining mode, the margin
of eq. 7 on the negatives, no feature penalty) they compute both and assert the size of the difference that the
chapter's protocol table states.
"""
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from dml_book.methods.dmml import DMML, MetaCellLoss, episode_loss
from parity import assert_lines_match, assert_parity, assert_same_numbers, fresh_run, official_copy, rel   # tests/parity.py

FIX = json.loads((Path(__file__).parent/"fixtures"/"parity"/"dmml.json").read_text())
LABELS = torch.tensor(FIX["inputs"]["labels"])
CASES = FIX["cases"]
PENALTY = 0.002 * 0.25          # the official loss adds 0.002 * 0.25 * sum |f|^2 / B: feature_penalty of the mean |f|^2


def run(inputs, feature_of=lambda u: u, **kw):
    "DMML.batch_loss on feature_of(u) (a stand-in trainer whose model is feature_of): set distances in the official row order, loss, d loss / d u."
    u = torch.tensor(inputs, dtype=torch.float64, requires_grad=True)
    method = DMML(n_classes=4, n_support=FIX["inputs"]["n_support"], n_query=FIX["inputs"]["n_query"], **kw)
    view = SimpleNamespace(model=feature_of, gather=lambda z, l: (z, l), optimizer=SimpleNamespace(param_groups=[{"lr": 0.0}]))
    loss = method.batch_loss(view, u, LABELS)["loss"]
    loss.backward()
    d, _ = method.loss.episode(method.scale * feature_of(u), LABELS)
    n_s = FIX["inputs"]["n_support"]
    q_labels = LABELS.view(4, -1)[:, n_s:].reshape(-1)                  # our query rows: batch order
    return d.detach()[torch.argsort(q_labels, stable=True)], loss.item(), u.grad   # the official rows: classes ascending


def test_fixture_names_the_official_code():
    assert FIX["repository"] == "https://github.com/CHENGY12/DMML" and len(FIX["commit"]) == 40
    assert FIX["functions"]["DMMLLoss.forward"].startswith("loss/dmml.py:")
    assert set(FIX["lines"]) == set(FIX["functions"])        # the text of every cited line is stored
    assert FIX["lines"]["DMMLLoss.forward"].startswith("def forward(self, feature, label)")
    assert FIX["lines"]["euclidean_dist"].startswith("def euclidean_dist(") and FIX["lines"]["cosine_dist"].startswith("def cosine_dist(")


def test_cited_lines_and_numbers_match_a_fresh_run(tmp_path):
    "tools/parity_dmml.py run again on the official copy: every cited line holds the stored text, and the fixture is what it writes."
    repo = official_copy("DMML", FIX["commit"])
    assert_lines_match(FIX, repo)
    fresh_run("parity_dmml.py", repo, tmp_path / "dmml.json")
    assert_same_numbers(json.loads((tmp_path / "dmml.json").read_text()), FIX)


def test_center_distance_loss_and_gradient_equal_the_official_ones():
    "Center support distance (eq. 9), plain softmax, the code's feature penalty: the official computation exactly."
    d, loss, grad = run(FIX["inputs"]["raw"], distance="center", variant="none", feature_penalty=PENALTY, scale=1.0)
    off = CASES["center"]
    assert_parity(d, off["distances"])
    assert_parity(loss, off["loss"])
    assert_parity(grad, off["grad"])


def test_hard_mining_on_the_sphere_equals_the_official_one():
    """The hard mining distance (eq. 10) and its softmax are the official ones up to the point distance: on unit vectors
    scaled by 1/sqrt(2), our squared Euclidean distance is 1 - <x, s>, the official -<x, s> plus 1, a shift the softmax
    ignores. So distances differ by exactly 1, and loss and gradient (through the normalisation) are equal."""
    d, loss, grad = run(FIX["inputs"]["on_sphere"], lambda u: F.normalize(u, dim=1), distance="hard", variant="none",
                        feature_penalty=PENALTY, scale=2 ** -0.5)
    off = CASES["hard_unit"]
    assert_parity(d - 1, off["distances"])
    assert_parity(loss, off["loss"])
    assert_parity(grad, off["grad"])


def test_official_margin_is_not_applied():
    """The official loss is the same with margin 0.4 and 0 (its margin line is commented out): it is our plain softmax
    (`variant="none"`) of its own set distances plus its feature penalty, and eq. (7)'s margin would change it."""
    assert CASES["hard"]["loss"] == CASES["hard_margin0"]["loss"]
    d = torch.tensor(CASES["hard"]["distances"], dtype=torch.float64)
    t = torch.arange(4).repeat_interleave(FIX["inputs"]["n_query"])          # official rows: classes ascending
    penalty = PENALTY * torch.tensor(FIX["inputs"]["raw"], dtype=torch.float64).pow(2).sum(1).mean().item()
    assert_parity(episode_loss(d, t, 0.4, "none").item() + penalty, CASES["hard"]["loss"])
    assert abs(episode_loss(d, t, 0.4, "positive").item() + penalty - CASES["hard"]["loss"]) > 0.1


# Deliberate departures on the raw (unnormalised) episode, hard mining mode: the sizes the chapter's protocol table states.
def test_departure_point_distance():
    "Squared Euclidean (paper) instead of the code's negative inner product, all else official: loss +170.5%."
    _, loss, grad = run(FIX["inputs"]["raw"], distance="hard", variant="none", feature_penalty=PENALTY, scale=1.0)
    np.testing.assert_allclose((loss - CASES["hard"]["loss"]) / CASES["hard"]["loss"], 1.7049, atol=5e-5)
    np.testing.assert_allclose(rel(grad, CASES["hard"]["grad"]), 2.2424, atol=5e-5)


def test_departure_margin_and_penalty():
    "Eq. (7)'s margin adds 0.4000 to our loss on this episode; the code's feature penalty is 0.0036 of its loss."
    kw = dict(distance="hard", scale=1.0)
    plain = run(FIX["inputs"]["raw"], variant="none", feature_penalty=0.0, **kw)[1]
    np.testing.assert_allclose(run(FIX["inputs"]["raw"], variant="negative", feature_penalty=0.0, **kw)[1] - plain, 0.4000, atol=5e-5)
    np.testing.assert_allclose(run(FIX["inputs"]["raw"], variant="none", feature_penalty=PENALTY, **kw)[1] - plain, 0.0036, atol=5e-5)


def test_departure_whole_loss_of_the_presets():
    "The presets' loss (hard mining, squared Euclidean, eq. 7, no penalty) against the official one: +176.2%; center mode: +8.6%."
    paper = dict(variant="negative", feature_penalty=0.0, scale=1.0)
    hard = run(FIX["inputs"]["raw"], distance="hard", **paper)[1]
    center = run(FIX["inputs"]["raw"], distance="center", **paper)[1]
    np.testing.assert_allclose((hard - CASES["hard"]["loss"]) / CASES["hard"]["loss"], 1.7616, atol=5e-5)
    np.testing.assert_allclose((center - CASES["center"]["loss"]) / CASES["center"]["loss"], 0.0864, atol=5e-5)
    np.testing.assert_allclose(MetaCellLoss(3, "hard", 0.4, "negative")(torch.tensor(FIX["inputs"]["raw"], dtype=torch.float64), LABELS).item(), hard, rtol=1e-12)
