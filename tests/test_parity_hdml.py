"""HDML against the authors' code, number by number.

`tests/fixtures/parity/hdml.json` holds what the official TensorFlow code (wzzheng/HDML; repository, commit and, per
quantity, file:line in the fixture) computes in float64 on fixed inputs: the hardness-aware pull of eq. (4) for the
triplet and the N-pair tuples (values and gradients), lambda = exp(-alpha / J_avg), the running J_avg of its
`data_collector`, the weight exp(-beta / J_gen) of eq. (11), J_m, J_syn, J_metric, J_recon, J_soft and J_gen of
`main_triplet.py`, the N-pair J_soft (`genSoftmax`), the synthetic N-pair loss (`new_npair_loss`) and the real one
(`npairs_loss`), and `main_npair.py`'s objectives end to end (J_m, the pulled N x N grid, J_syn, J_metric, J_recon,
J_soft with its per-row cross-entropies, J_gen). `tools/parity_hdml.py` wrote it under TensorFlow 2's `tf.compat.v1`;
neither TensorFlow nor the official code is needed here. Where our computation is the official one the tests ask for
equality element by element at a relative 1e-12 (`parity.assert_parity`); where the chapter departs on purpose they
compute both and assert the difference, exactly where it has a closed form, else the size the chapter states.
"""
import json, math, os, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dml_book.losses import NPairLoss, TripletLoss
from dml_book.methods.hdml import (WindowAverage, decay_penalty, generator_objective, grouped_npair_loss, metric_objective,
                                   npair_synthesis, official_j_m, official_triplet_loss, pulling_lambda, reconstruction_loss,
                                   synthesis_weight, triplet_synthesis)
from parity import RTOL, assert_lines_match, assert_parity, assert_same_numbers, fresh_run, official_copy, rel, as_array as _np   # tests/parity.py

FIX = json.loads((Path(__file__).parent/"fixtures"/"parity"/"hdml.json").read_text())
OUT, FLAGS = FIX["outputs"], FIX["flags"]
TRI, NP = FIX["inputs"]["triplet"], FIX["inputs"]["npair"]
ALPHA, BETA, LAM, SOFTMAX_FACTOR = FLAGS["alpha"], FLAGS["beta"], FLAGS["_lambda"], FLAGS["Softmax_factor"]


def t64(x, grad=False): return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def close(a, b, rtol=RTOL): assert_parity(a, b, rtol)


def project(y):
    "sum(y * R) with the script's R (numpy default_rng(7), the output's shape): the scalar whose gradient the fixture holds."
    return (y * t64(np.random.default_rng(7).standard_normal(tuple(y.shape)))).sum()


def triplets(n): t = torch.arange(n); return t, t + n, t + 2 * n


def classifier(w, b):
    "The softmax layer as our method holds it (nn.Linear), with the official W_fc (in x out) and b_fc."
    lin = nn.Linear(*np.shape(w)).double()
    with torch.no_grad(): lin.weight.copy_(t64(w).T); lin.bias.copy_(t64(b))
    return lin


def test_fixture_names_the_official_code():
    assert FIX["repository"] == "https://github.com/wzzheng/HDML" and len(FIX["commit"]) == 40
    assert FIX["functions"]["Pulling"] == "lib/HDML.py:6" and FIX["functions"]["main_triplet.J_gen"].startswith("main_triplet.py:")
    assert (ALPHA, BETA, LAM, SOFTMAX_FACTOR) == (90.0, 1e4, 0.5, 1e4)
    assert set(FIX["lines"]) == set(FIX["functions"]) and set(FIX["flag_texts"]) == set(FLAGS)   # the text of every cited line
    for key, text in FIX["lines"].items():
        name = key.split(".")[-1]
        if key.startswith("main_") and name != "exclude_batch_norm":   # a statement of main_triplet.py / main_npair.py
            target = {"J_m_weighted": "J_m", "z_in": "embedding_z_quta", "embedding_yp": "embedding_yp, embedding_yq"}.get(name, name)
            assert text.startswith(f"{target} = "), key
        else: assert text.startswith((f"def {name}(", f"class {name}")), key
    for k, text in FIX["flag_texts"].items(): assert text.startswith(f"tf.flags.DEFINE_float('{k}', "), k


def test_cited_lines_and_numbers_match_a_fresh_run(tmp_path):
    """tools/parity_hdml.py run again on the official copy (with $DML_BOOK_TF_PYTHON, a Python with TensorFlow, or this
    one): every cited line holds the stored text, and the fixture is what it writes."""
    repo = official_copy("HDML", FIX["commit"])
    assert_lines_match(FIX, repo)
    python = os.environ.get("DML_BOOK_TF_PYTHON", sys.executable)
    if subprocess.run([python, "-c", "import tensorflow"], capture_output=True).returncode:
        pytest.skip(f"tools/parity_hdml.py needs TensorFlow, which {python} lacks: set DML_BOOK_TF_PYTHON")
    fresh_run("parity_hdml.py", repo, tmp_path / "hdml.json", python=python)
    fresh = json.loads((tmp_path / "hdml.json").read_text())
    fresh.pop("note"); stored = {k: v for k, v in FIX.items() if k != "note"}   # the note names the TensorFlow version
    assert_same_numbers(fresh, stored)


def test_lambda_and_triplet_pull_equal_the_official_ones():
    "lambda = exp(-alpha / J_avg) and the pulled negatives of eq. (4) (the code's Pulling), values and gradients."
    labels = torch.tensor(TRI["labels"])
    for rec in OUT["pull_triplet"]:
        lam = pulling_lambda(rec["j_avg"], ALPHA)
        close(lam, rec["lam"])
        z = t64(TRI["z"], grad=True)
        z_in, _, _ = triplet_synthesis(z, labels, triplets(len(z) // 3), lam)
        close(z_in, rec["z_in"])
        project(z_in).backward()
        close(z.grad, rec["grad"])
    moved = ~np.isclose(OUT["pull_triplet"][2]["z_in"], TRI["z"]).all(1)
    assert moved[12:].sum() >= 3 and not moved[:14].any()     # easy negatives move, hard ones (rows 12, 13) and a, p stay


def test_npair_pull_equals_the_official_one():
    "The N x N grid of N-pair candidates pulled towards each anchor: the layout and values of the code's N-pair branch."
    z_all, labels = NP["z"], torch.tensor(NP["labels"])
    n = len(z_all) // 2
    for rec in OUT["pull_npair"]:
        z = t64(z_all, grad=True)
        z_in, _, _ = npair_synthesis(z, labels, (torch.arange(n), torch.arange(n) + n), pulling_lambda(rec["j_avg"], ALPHA))
        close(z_in, rec["z_in"])
        project(z_in).backward()
        close(z.grad, rec["grad"])


def test_j_avg_window_equals_the_official_collector():
    "The block mean of 64 values (NaN skipped) after the first window; before it, the code's 1e6 where we hold inf."
    rec = OUT["j_avg"]
    avg = WindowAverage(64)
    ours = [avg.update(float("nan") if x is None else x) for x in rec["sequence"]]
    first = next(i for i, r in enumerate(rec["reads"]) if r != rec["init"])
    assert first == 63 and rec["sequence"][70] is None   # the 64th value closes the first window; a NaN delays the next
    close(ours[first:], rec["reads"][first:])
    assert all(math.isinf(x) for x in ours[:first]) and set(rec["reads"][:first]) == {1e6}


def test_departure_initial_running_values():
    "Before the first window: lambda 1 and weight 1 (ours) against exp(-90/1e6) and exp(-1e4/1e6) (the code's 1e6)."
    off_lam, off_w = OUT["pull_triplet"][0]["lam"], OUT["objectives_triplet"][0]["weight"]
    np.testing.assert_allclose(pulling_lambda(float("inf"), ALPHA) - off_lam, 9.0e-5, atol=5e-7)
    np.testing.assert_allclose(synthesis_weight(float("inf"), BETA) - off_w, 9.95e-3, atol=5e-6)


def test_departure_paper_alpha_for_triplets():
    "The paper-triplet preset's alpha = 7 (Sec. 4.2) against the code's 90 at J_avg = 45: lambda 0.856 against 0.135."
    rec = OUT["pull_triplet"][2]
    assert rec["j_avg"] == 45.0
    np.testing.assert_allclose((pulling_lambda(45.0, 7.0), rec["lam"]), (0.8559, 0.1353), atol=5e-5)


def decaying_optimizer(params):
    "The metric's Adam with the official weight decay on what the official wdLoss covers (not batch norm, not the generator)."
    decayed = [nn.Parameter(t64(v)) for k, v in params.items() if "batch_normalization" not in k and "Generator" not in k]
    rest = [nn.Parameter(t64(v)) for k, v in params.items() if "batch_normalization" in k]
    return torch.optim.Adam([dict(params=decayed, weight_decay=FLAGS["Regular_factor"]), dict(params=rest, weight_decay=0.0)])


def test_weight_j_m_and_metric_objective_equal_the_official_ones():
    "Eq. (11)'s weight, J_m (loss + weight decay, weighted), J_syn and the gradient of J_metric w.r.t. real and synthetic embeddings."
    labels, trip = torch.tensor(TRI["labels"]), triplets(len(TRI["z"]) // 3)
    loss_fn = TripletLoss(margin=1.0, squared=True, reduction="sum", normalize=False)    # the paper presets' loss
    decay = decay_penalty(decaying_optimizer(TRI["params"]))
    for rec in OUT["objectives_triplet"]:
        w = synthesis_weight(rec["j_gen"], BETA)
        close(w, rec["weight"])
        close(decay, rec["wdLoss"])
        z, z_syn = t64(TRI["z"], grad=True), t64(TRI["z_syn"], grad=True)
        j_real, j_syn = loss_fn(z, labels, trip), loss_fn(z_syn, labels, trip)
        close(official_triplet_loss(z, trip), rec["J_m"] - rec["wdLoss"]); close(j_real, rec["J_m"] - rec["wdLoss"])
        close(official_j_m(official_triplet_loss(z, trip).item(), decay, w), rec["J_m_weighted"])
        close((1 - w) * j_syn, rec["J_syn"])
        metric_objective(j_real, j_syn, w).backward()
        close(z.grad, rec["grad_J_metric"]["z"]); close(z_syn.grad, rec["grad_J_metric"]["z_syn"])


def test_departure_weight_decay_inside_j_metric():
    "The code's J_metric carries its weight decay times eq. (11)'s weight; ours leaves decay to the optimiser: w * wdLoss apart (0.0230 at J_gen = 2e4)."
    labels, trip = torch.tensor(TRI["labels"]), triplets(len(TRI["z"]) // 3)
    loss_fn = TripletLoss(margin=1.0, squared=True, reduction="sum", normalize=False)
    diffs = []
    for rec in OUT["objectives_triplet"]:
        w = synthesis_weight(rec["j_gen"], BETA)
        ours = metric_objective(loss_fn(t64(TRI["z"]), labels, trip), loss_fn(t64(TRI["z_syn"]), labels, trip), w).item()
        close(rec["J_metric"] - ours, w * rec["wdLoss"])
        diffs.append(rec["J_metric"] - ours)
    np.testing.assert_allclose(diffs[1], 0.0230, atol=5e-5)


def test_departure_j_m_loss_option():
    "`j_m='loss'` (the paper's 'average metric loss') feeds J(T) alone: 6.736 where the code's J_m is 4.109 at J_gen = 2e4 (+63.9%)."
    rec = OUT["objectives_triplet"][1]
    j = official_triplet_loss(t64(TRI["z"]), triplets(len(TRI["z"]) // 3)).item()
    np.testing.assert_allclose((j, rec["J_m_weighted"], j / rec["J_m_weighted"] - 1), (6.736, 4.109, 0.639), atol=5e-4)


def test_generator_objective_equals_the_official_one():
    "J_recon, J_soft and J_gen of main_triplet.py with the presets' recon_weight=0.5, softmax_factor=1e4, gen_lambda=0.5; gradients too."
    labels = torch.tensor(TRI["labels"])
    soft = classifier(TRI["W_fc"], TRI["b_fc"])
    for rec in OUT["objectives_triplet"][:1]:          # J_gen does not depend on J_gen's average: one record suffices
        y_rec, y_syn = t64(TRI["y_rec"], grad=True), t64(TRI["y_syn"], grad=True)
        j_recon, j_soft = reconstruction_loss(y_rec, t64(TRI["y"])), F.cross_entropy(soft(y_syn), labels)
        close((1 - LAM) * j_recon, rec["J_recon"]); close(SOFTMAX_FACTOR * LAM * j_soft, rec["J_soft"])
        j_gen = generator_objective(j_recon, j_soft, LAM, recon_weight=1 - LAM, softmax_factor=SOFTMAX_FACTOR)
        close(j_gen, rec["J_gen"])
        j_gen.backward()
        close(y_rec.grad, rec["grad_J_gen"]["y_rec"]); close(y_syn.grad, rec["grad_J_gen"]["y_syn"])


def test_departure_eq9_as_printed():
    "Eq. (9) as printed, J_recon + 0.5 J_soft (the method's recon_weight=1, softmax_factor=1): 1.2% of the code's J_gen on the fixture."
    rec = OUT["objectives_triplet"][0]
    j_recon = reconstruction_loss(t64(TRI["y_rec"]), t64(TRI["y"]))
    j_soft = F.cross_entropy(classifier(TRI["W_fc"], TRI["b_fc"])(t64(TRI["y_syn"])), torch.tensor(TRI["labels"]))
    printed = generator_objective(j_recon, j_soft, LAM).item()
    np.testing.assert_allclose(printed / rec["J_gen"], 0.0120, atol=5e-5)


def penalty_departure(za, zn, l2):
    "Our N-pair penalty (each anchor's own pulled positive, the i = j cell) minus the official one (all N^2 candidates)."
    n = len(za)
    return l2 * (zn.view(n, n, -1).diagonal().pow(2).sum(0).mean() - zn.pow(2).sum(1).mean()).item()


def test_npair_losses():
    """Real N-pair loss (npairs_loss) equals NPairLoss(l2_reg=3e-3/4); the synthetic one (new_npair_loss) has our
    grouped_npair_loss's cross-entropy, but its norm penalty averages all N^2 candidates where ours takes each anchor's positive."""
    z, labels = t64(NP["z"], grad=True), torch.tensor(NP["labels"])
    l2 = FLAGS["loss_l2_reg"] / 4
    real = NPairLoss(l2_reg=l2, normalize=False)(z, labels)
    close(real, OUT["j_real_npair"]["value"]); real.backward(); close(z.grad, OUT["j_real_npair"]["grad"])
    n = len(NP["z_syn_anc"])
    za, zn = t64(NP["z_syn_anc"], grad=True), t64(NP["z_syn_neg"], grad=True)
    _, _, syn = npair_synthesis(t64(NP["z"]), labels, (torch.arange(n), torch.arange(n) + n), 1.0)
    emb = torch.cat([za, zn])
    xent = grouped_npair_loss(emb, *syn)
    official = xent + l2 * (za.pow(2).sum(1).mean() + zn.pow(2).sum(1).mean())
    close(official, OUT["j_syn_npair"]["value"])
    official.backward()
    close(za.grad, OUT["j_syn_npair"]["grad"]["z_syn_anc"]); close(zn.grad, OUT["j_syn_npair"]["grad"]["z_syn_neg"])
    ours = grouped_npair_loss(emb.detach(), *syn, l2_reg=l2).item()
    np.testing.assert_allclose((ours - OUT["j_syn_npair"]["value"]) / OUT["j_syn_npair"]["value"], -2.61e-4, atol=5e-7)   # the chapter's
    close(ours - OUT["j_syn_npair"]["value"], penalty_departure(za.detach(), zn.detach(), l2))


def test_objectives_wire_the_official_losses():
    """`HDML.objectives`, the method's own iteration, on the fixture's numbers: the paper-triplet settings on the code's
    batches of triplets give the official J_m, J_recon, J_soft and J_gen, and J_metric up to the w x weight decay that the
    code keeps inside it. Stand-ins feed the fixture's features and embeddings: the backbone is the identity on the real
    features, the generator returns the fixture's reconstructed and synthetic features, the head the fixture's embeddings."""
    from types import SimpleNamespace
    from dml_book.methods.hdml import HDML
    n3 = len(TRI["z"]) // 3
    inter = torch.arange(3 * n3).view(3, n3).T.reshape(-1)          # official blocks (a; p; n) -> our consecutive triples
    y_real, labels = t64(TRI["y"])[inter], torch.tensor(TRI["labels"])[inter]
    y_all = torch.cat([t64(TRI["y_rec"])[inter], t64(TRI["y_syn"])])   # generator(cat[z, z_in]): z in batch order, z_in in blocks
    head = lambda t: t64(TRI["z"])[inter] if t is y_real else t64(TRI["z_syn"])
    trainer = SimpleNamespace(model=SimpleNamespace(backbone=lambda x: x, head=head), gather=lambda z, l: (z, l), miner=None,
                              loss_fn=TripletLoss(margin=1.0, squared=True, reduction="sum", normalize=False),
                              optimizer=decaying_optimizer(TRI["params"]))
    hd = HDML(pulling_factor=ALPHA, beta=BETA, gen_lambda=LAM, softmax_factor=SOFTMAX_FACTOR, recon_weight=1 - LAM, triplet_batches=True)
    hd.mode, hd.generator, hd.classifier = "triplet", lambda inp: y_all, classifier(TRI["W_fc"], TRI["b_fc"])
    for rec in OUT["objectives_triplet"]:
        hd.j_avg.value, hd.j_gen_avg.value = 45.0, rec["j_gen"]
        o = hd.objectives(trainer, y_real, labels)
        close(o["weight"], rec["weight"]); close(o["j_m"], rec["J_m_weighted"])
        close(SOFTMAX_FACTOR * LAM * o["j_soft"], rec["J_soft"]); close((1 - LAM) * o["j_recon"], rec["J_recon"])
        close(o["j_gen"], rec["J_gen"]); close(o["j_metric"] + o["weight"] * rec["wdLoss"], rec["J_metric"])


NM = FIX["inputs"]["npair_main"]


def npair_layout():
    """Our rows of the N + N^2 synthetic tuples as official rows. `npair_pairs` takes the classes in ascending label order,
    the official code in batch order: our anchor i is official anchor sigma(i), our cell (i, j) the official (sigma(i), sigma(j))."""
    n = len(NM["z"]) // 2
    sigma = torch.argsort(torch.tensor(NM["labels"][:n]), stable=True)
    return torch.cat([sigma, n + (sigma[:, None] * n + sigma[None]).reshape(-1)])


def npair_objectives(rec):
    """`HDML.objectives` of the paper-npair preset (its method and loss settings) on the official batch (anchors, then
    positives): the backbone is the identity on the real features, the head gives the official embeddings (real) and
    synthetic ones (in our row order), the generator records its input and returns the official reconstructed and
    synthetic features. Returns the objectives, the generator's input, and the leaves z and z_syn (official order)."""
    from types import SimpleNamespace
    from dml_book.methods.hdml import HDML
    preset, rows = HDML.presets["paper-npair"], npair_layout()
    y_real, labels = t64(NM["y"]), torch.tensor(NM["labels"])
    z, z_syn = t64(NM["z"], grad=True), t64(NM["z_syn"], grad=True)
    seen = []
    def generator(inp): seen.append(inp.detach()); return torch.cat([t64(NM["y_rec"]), t64(NM["y_syn"])[rows]])
    trainer = SimpleNamespace(model=SimpleNamespace(backbone=lambda x: x, head=lambda t: z if t is y_real else z_syn[rows]),
                              gather=lambda e, l: (e, l), miner=None, loss_fn=NPairLoss(**preset["loss_kwargs"]),
                              optimizer=decaying_optimizer(NM["params"]))
    hd = HDML(**preset["method_kwargs"])
    hd.mode, hd.generator, hd.classifier = "npair", generator, classifier(NM["W_fc"], NM["b_fc"])
    hd.j_avg.value, hd.j_gen_avg.value = rec["j_avg"], rec["j_gen"]
    return hd.objectives(trainer, y_real, labels), seen[0], z, z_syn


def test_npair_objectives_equal_the_official_ones():
    """main_npair.py end to end through `HDML.objectives`: eq. (11)'s weight, J_m, the pulled N x N grid (the synthetic
    rows' layout), J_recon, and J_syn, J_metric, J_gen and J_metric's gradients up to the three departures, each in closed
    form: the N-pair penalty on each anchor's own positive (not all N^2 candidates), the weight decay left to the
    optimiser (not inside J_metric), and J_soft as one mean over the N + N^2 rows (not a mean of anchors plus one of
    negatives), which the official per-row cross-entropies give exactly."""
    n, rows, l2 = len(NM["z"]) // 2, npair_layout(), HDML_L2
    for rec in OUT["objectives_npair"]:
        o, gen_in, z, z_syn = npair_objectives(rec)
        w = rec["weight"]
        close(o["weight"], w); close(o["lam"], math.exp(-ALPHA / rec["j_avg"]))            # eq. (4) at the fed J_avg
        close(o["j_m"], rec["J_m_weighted"]); close(o["j_real"], rec["J_m"] - rec["wdLoss"])
        close(gen_in, torch.cat([t64(NM["z"]), t64(rec["z_in"])[rows]]))                  # generator input: z, then the pull
        close((1 - LAM) * o["j_recon"], rec["J_recon"])
        pen = penalty_departure(t64(NM["z_syn"])[:n], t64(NM["z_syn"])[n:], l2)
        close(o["j_syn"], rec["J_syn"] / (1 - w) + pen)                                   # xent + our penalty
        close(o["j_metric"] + w * rec["wdLoss"] - (1 - w) * pen, rec["J_metric"])
        ce = t64(rec["ce_anc"] + rec["ce_neg"])
        close(SOFTMAX_FACTOR * LAM * (ce[:n].mean() + ce[n:].mean()), rec["J_soft"])      # the fixture's own sum of two means
        close(o["j_soft"], ce.mean())                                                     # ours: one mean over the same rows
        close(o["j_gen"], rec["J_gen"] - rec["J_soft"] + SOFTMAX_FACTOR * LAM * ce.mean())
        o["j_metric"].backward()
        close(z.grad, rec["grad_J_metric"]["z"])
        zn = t64(NM["z_syn"])[n:].view(n, n, -1)
        extra = 2 * l2 * zn * ((torch.eye(n, dtype=torch.float64) / n - 1 / n ** 2)[:, :, None])   # d pen / d z_syn's candidates
        close(z_syn.grad, t64(rec["grad_J_metric"]["z_syn"]) + (1 - w) * torch.cat([torch.zeros(n, zn.shape[-1], dtype=torch.float64), extra.reshape(n * n, -1)]))


def test_npair_objectives_generator_gradient_and_j_soft_departure():
    """d J_gen / d y_rec equals the official; J_soft's one mean weighs the N anchors N times less than the official two
    means: ours / official - 1 on the fixture, at J_gen = 2e4 (the chapter's protocol table)."""
    rec = OUT["objectives_npair"][1]
    y_rec = t64(NM["y_rec"], grad=True)
    o = npair_objectives(rec)[0]
    j_recon = reconstruction_loss(y_rec, t64(NM["y"]))
    (LAM * j_recon).backward()          # J_gen's reconstruction term (recon_weight = 1 - lambda = 0.5), as objectives builds it
    close(y_rec.grad, rec["grad_J_gen"]["y_rec"]); close(j_recon, o["j_recon"])
    n = len(NM["z"]) // 2
    a, b = np.mean(rec["ce_anc"]), np.mean(rec["ce_neg"])
    close(o["j_soft"], (n * a + n * n * b) / (n + n * n))
    np.testing.assert_allclose(SOFTMAX_FACTOR * LAM * o["j_soft"].item() / rec["J_soft"] - 1, -0.4822, atol=5e-5)


HDML_L2 = FLAGS["loss_l2_reg"] / 4      # NPairLoss's l2_reg in the paper-npair preset: the official 0.25 * reg_lambda
