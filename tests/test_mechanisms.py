"""Each method chapter's 'On the reference run': the stored logs parse and match metrics.json, every number a chapter states
is recomputed here from the raw log lines, and every figure function runs on a tiny synthetic log."""
import json, math
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from dml_book.study import read_log, reference_run
from dml_book.study_design import study_variants
from dml_book.methods.ala import plot_assessment, assessment_sentence
from dml_book.methods.hdml import plot_hardness, hardness_sentence, hardness_criterion, tuple_distances
from dml_book.methods.dcml import plot_compositor_weights, compositor_sentence
from dml_book.methods.pads import PADS, plot_policy_run, distribution_sentence, distribution_means, critic_sentence, signal_sentence
from dml_book.methods.dmml import plot_set_distances, set_distance_sentence

RESULTS = Path(__file__).resolve().parents[1]/"results"
STORED = ("ala", "pads", "hdml", "dcml", "dmml")   # a log not stored (yet) skips its tests


def raw(method):
    "The reference log's step and epoch records as plain dicts (no pandas), or skip when it is not stored."
    path = RESULTS/method/method/"seed0"/"log.jsonl"
    if not path.exists(): pytest.skip(f"no reference log for {method}")
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in recs if r["kind"] == "step"], [r for r in recs if r["kind"] == "epoch"]


def epoch_mean(steps, key, epoch): return float(np.mean([r[key] for r in steps if r["epoch"] == epoch]))


@pytest.mark.parametrize("method", STORED)
def test_stored_log_parses_and_matches_metrics(method):
    raw_epochs = raw(method)[1]
    steps, epochs = reference_run(method, root=RESULTS)
    folder = RESULTS/method/method/"seed0"
    stored = json.loads((folder/"metrics.json").read_text())
    n = stored["config"]["epochs"]   # the run's own budget (a study stored before the 30-epoch budget ran 20)
    assert list(epochs.epoch) == list(range(n + 1)) and len(steps) and steps.kind.eq("step").all()
    assert steps.step.is_monotonic_increasing and steps.epoch.max() == n and steps.loss.notna().all()
    assert stored["config"]["method"] == method and stored["config"]["seed"] == 0
    assert len(stored["epochs"]) == len(epochs)
    for rec, rrec in zip(stored["epochs"], raw_epochs):   # the log is the run behind these metrics
        for k, v in rec.items():
            if k != "seconds": assert rrec[k] == v, (method, rec["epoch"], k)


def test_reference_run_absent(tmp_path):
    assert reference_run("ala", root=tmp_path) is None and reference_run("ala", root=RESULTS, seed=7) is None


def test_ala_sentence_from_the_log():
    steps, epochs = raw("ala")
    s = assessment_sentence(*reference_run("ala", root=RESULTS))
    corr = [r["weight_hardness_corr"] for r in epochs if "weight_hardness_corr" in r]
    last = steps[-1]["epoch"]   # the run's own budget
    for x in (f"{epoch_mean(steps, 'weight_std', 1):.3f} (mean over epoch 1)", f"{epoch_mean(steps, 'weight_std', last):.3f} (epoch {last})",
              f"{corr[0]:+.2f} at epoch 1", f"{corr[-1]:+.2f} at epoch {last}", f"between {min(corr):+.2f} and {max(corr):+.2f}"):
        assert x in s, (x, s)


def test_pads_sentence_from_the_log():
    _, epochs = raw("pads")
    edges = np.linspace(0.1, 1.4, 31)   # PADS's defaults, the study's settings
    np.testing.assert_allclose(PADS(**study_variants("pads")["pads"].method_kwargs).distribution.edges.numpy(), edges)
    probs = [r["pads_probs"] for r in epochs if "pads_probs" in r]
    mean = lambda p: sum(pk * (edges[k] + edges[k + 1]) / 2 for k, pk in enumerate(p))
    top = lambda p: max(range(len(p)), key=p.__getitem__)
    s = distribution_sentence(reference_run("pads", root=RESULTS)[1], edges)
    for x in (f"Over {epochs[-1]['policy_steps']} policy steps", f"from {mean(probs[0]):.3f} at the end of epoch 1",
              f"to {mean(probs[-1]):.3f} at epoch {epochs[-1]['epoch']}", f"from [{edges[top(probs[0])]:.2f}, ", f"to [{edges[top(probs[-1])]:.2f}, "):
        assert x in s, (x, s)


def test_pads_critic_and_signal_sentences_from_the_log():
    "The critic's value range and the advantage's agreement with the reward; the correlation of an action's effect with its reward."
    steps, _ = raw("pads")
    s = critic_sentence(reference_run("pads", root=RESULTS)[0])
    upd = [r for r in steps if r.get("value") is not None and r.get("reward") is not None]
    agree = sum(np.sign(r["advantage"]) == np.sign(r["reward"]) for r in upd)
    for x in (f"Over {len(upd)} policy updates", f"between {min(r['value'] for r in upd):.2f} and {max(r['value'] for r in upd):.2f}",
              f"reward's sign in {agree} of the {len(upd)} updates"):
        assert x in s, (x, s)
    edges = np.linspace(0.1, 1.4, 31)
    pol = [r for r in steps if "pads_probs" in r]
    mean = lambda p: sum(pk * (edges[k] + edges[k + 1]) / 2 for k, pk in enumerate(p))
    shift = [mean(pol[t - 1]["pads_probs"]) - mean(pol[t - 2]["pads_probs"]) for t in range(2, len(pol))]
    corr = np.corrcoef(shift, [pol[t]["reward"] for t in range(2, len(pol))])[0, 1]
    s = signal_sentence(reference_run("pads", root=RESULTS)[0], edges)
    assert f"Over {len(pol) - 2} rewarded actions" in s and f"correlates with the reward at {corr:+.2f}" in s, s
    if all("d_an" in r for r in steps):   # logs since the critic fix: the mean sampled distance, M iterations after vs before
        at = [r["step"] for r in pol]
        window = lambda lo, hi: np.mean([r["d_an"] for r in steps if lo < r["step"] <= hi])
        d_shift = [window(at[t - 1], at[t]) - window(at[t - 2], at[t - 1]) for t in range(2, len(pol))]
        corr = np.corrcoef(d_shift, [pol[t]["reward"] for t in range(2, len(pol))])[0, 1]
        assert f"that of the mean sampled distance at {corr:+.2f}" in s, s


def test_hdml_sentence_from_the_log():
    steps, _ = raw("hdml")
    s = hardness_sentence(reference_run("hdml", root=RESULTS)[0])
    m = lambda k, e: epoch_mean(steps, k, e)
    L = steps[-1]["epoch"]   # the run's own budget
    num = lambda x: f"{x:.2f}" if abs(x) >= 0.01 or x == 0 else f"{x:.1e}"
    for x in (f"λ averages {num(m('lam', 1))} in epoch 1 and {num(m('lam', L))} in epoch {L} ({num(m('lam', 2))} in epoch 2)",
              f"distance of {m('d_an_syn', L):.2f}", f"at {m('d_an_hat', L):.2f}", f"{m('d_an', L):.2f} for the real negatives",
              f"{m('d_ap', L):.2f} for the positives"):
        assert x in s, (x, s)
    above = sum(m("j_syn", e) > m("j_real", e) for e in range(2, L + 1))
    assert f"cost more than the real ones in {above} of the {L - 1} epochs after the first" in s, s
    if "viol_syn" in steps[0]:
        assert f"{m('viol_real', L):.0%} of the real and {m('viol_syn', L):.0%} of the synthetic triplets violate the margin" in s
    c = hardness_criterion(reference_run("hdml", root=RESULTS)[0])
    unsat = "viol_syn" in steps[0] and m("viol_syn", L) >= 0.95
    assert c["met"] == (2 * above >= L - 1 and m("lam", L) <= m("lam", 1) / 2 and not unsat) and c["syn_above_real"] == above
    assert c["unsatisfiable"] == unsat and ("Nearly every synthetic triplet is then unsatisfiable" in s) == unsat


def test_dcml_sentence_from_the_log():
    _, epochs = raw("dcml")
    w = [np.array(r["compositor_weights"]) for r in epochs if "compositor_weights" in r]
    n = max(r["epoch"] for r in epochs)   # the run's own budget
    assert len(w) == n and w[0].shape == (8, 4)
    np.testing.assert_allclose(w[-1].sum(1), 1, atol=1e-5)   # |c| sums to 1 over the learners
    s = compositor_sentence(reference_run("dcml", root=RESULTS)[1])
    lead = sorted({int(np.argmax(row)) for row in w[-1]})
    for x in (f"{np.mean([row.max() for row in w[0]]):.2f} of its weight at epoch 1", f"{np.mean([row.max() for row in w[-1]]):.2f} at epoch {n}",
              f"{len(lead)} of the 4 learners", ", ".join(map(str, lead))):
        assert x in s, (x, s)
    top = np.mean([row.max() for row in w[-1]]); selection = (top - 0.25) / 0.75   # 0: even weights, 1: one learner
    assert f"a selection of {selection:.2f}" in s and ("barely select" in s) == (selection < 0.1)
    even = pd.DataFrame([dict(epoch=e, compositor_weights=np.full((2, 2), 0.5).tolist()) for e in (1, 2)])   # no selection at all
    assert "a selection of 0.00" in compositor_sentence(even) and "barely select" in compositor_sentence(even)


def test_dmml_sentence_from_the_log():
    steps, _ = raw("dmml")
    s = set_distance_sentence(reference_run("dmml", root=RESULTS)[0])
    m = lambda k, e: epoch_mean(steps, k, e)
    L = steps[-1]["epoch"]   # the run's own budget
    for e in (1, L):   # the first epoch and the last the run logged
        assert f"{m('d_pos', e):.3g} to the own meta-cell against {m('d_neg', e):.3g} to the others at epoch {e}" in s
        assert f"a gap of {(m('d_neg', e) - m('d_pos', e)) / 0.4:.1f} margins, episode accuracy {m('episode_acc', e):.2f}" in s


# A tiny synthetic log: 3 epochs of 4 steps with every method's values, known by construction.
def tiny_log(tmp_path):
    recs = [dict(epoch=0, step=0, kind="epoch")]
    for e in range(1, 4):
        for i in range(1, 5):
            t = (e - 1)*4 + i
            recs.append(dict(epoch=e, step=t, kind="step", loss=1/t, weight_mean=0.5, weight_std=0.01*e, lam=1 - 0.1*e, weight=0.9,
                             d_ap=0.3, d_an=1.0 + 0.1*i, d_an_hat=0.7, d_an_syn=0.6, d_pos=1.0/e, d_neg=2.0, episode_acc=0.25*e,
                             **({"pads_probs": [0.5, 0.5, 0.0] if e == 1 else [0.0, 0.2, 0.8], "val_R@1": 0.1*t} if i == 4 else {})))
        w = np.full((2, 3), 1/3); w[:, e - 1] += 0.3; w /= w.sum(1, keepdims=True)
        recs.append(dict(epoch=e, step=4*e, kind="epoch", weight_hardness_corr=[0.1, -0.5, 0.3][e - 1], pads_probs=[0.5, 0.5, 0.0] if e == 1
                         else [0.0, 0.2, 0.8], policy_steps=e, compositor_weights=w.tolist()))
    (tmp_path/"log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return read_log(tmp_path/"log.jsonl")


def test_figures_and_sentences_on_a_tiny_log(tmp_path):
    steps, epochs = tiny_log(tmp_path)
    edges = [0.0, 1.0, 2.0, 3.0]
    figs = [plot_assessment(steps, epochs), plot_hardness(steps), plot_compositor_weights(epochs), plot_policy_run(steps, edges),
            plot_set_distances(steps)]
    assert all(len(f.axes) >= 2 for f in figs)
    assert len(figs[1].axes[1].lines) == 4 and list(figs[1].axes[1].lines[2].get_ydata()) == [0.6, 0.6, 0.6]
    assert [len(ax.lines) for ax in figs[1].axes[2:]] == [0, 0] and "not logged" in figs[1].axes[3].texts[0].get_text()   # older logs
    full = steps.assign(j_real=steps.epoch * 1.0, j_syn=2.0, viol_real=0.25, viol_syn=steps.epoch / 4)
    fig = plot_hardness(full)
    assert list(fig.axes[2].lines[1].get_ydata()) == [2.0] * 3 and list(fig.axes[3].lines[1].get_ydata()) == [0.25, 0.5, 0.75]
    c = hardness_criterion(full)   # epochs 2, 3: J(T~) = 2 is not above J(T) = 2, 3; lambda's 0.7 is not below 0.9 / 2
    assert (c["syn_above_real"], c["epochs_after_first"], c["met"]) == (0, 2, False)
    c = hardness_criterion(full.assign(j_syn=2.5, lam=1.0 - 0.45 * (full.epoch - 1)))
    assert (c["syn_above_real"], c["met"]) == (1, True) and math.isclose(c["lam_last"], 0.1)
    assert "in 1 of the 2 epochs after the first" in hardness_sentence(full.assign(j_syn=2.5)) and "75% of the synthetic" in hardness_sentence(full)
    nearly_all = full.assign(j_syn=2.5, lam=1.0 - 0.45 * (full.epoch - 1), viol_syn=0.97)   # harder, lambda falls: but unsatisfiable
    c = hardness_criterion(nearly_all)
    assert (c["unsatisfiable"], c["met"]) == (True, False) and "unsatisfiable" in hardness_sentence(nearly_all)
    assert not hardness_criterion(full)["unsatisfiable"] and "unsatisfiable" not in hardness_sentence(full)
    plt.close("all")
    np.testing.assert_allclose(distribution_means([[0.5, 0.5, 0.0], [0.0, 0.2, 0.8]], edges), [1.0, 2.3])
    assert "from 0.010 (mean over epoch 1) to 0.030 (epoch 3)" in assessment_sentence(steps, epochs)
    assert "from +0.10 at epoch 1 to +0.30 at epoch 3, and lies between -0.50 and +0.30" in assessment_sentence(steps, epochs)
    assert "λ averages 0.90 in epoch 1 and 0.70 in epoch 3" in hardness_sentence(steps) and "1.25 for the real negatives" in hardness_sentence(steps)
    s = compositor_sentence(epochs)
    assert f"{(1/3 + 0.3)/1.3:.2f} of its weight at epoch 1" in s and "0.33" in s and "1 of the 3 learners (learner 2)" in s
    assert "from 1.000 at the end of epoch 1 to 2.300 at epoch 3, and its most likely bin from [0.00, 1.00) to [2.00, 3.00)" in distribution_sentence(epochs, edges)
    assert "1 to the own meta-cell against 2 to the others at epoch 1 (a gap of 2.5 margins, episode accuracy 0.25)" in set_distance_sentence(steps)


def test_tuple_distances_by_hand():
    import torch
    z = torch.tensor([[0., 0.], [3., 4.], [0., 1.], [1., 0.]], requires_grad=True)
    d_ap, d_an = tuple_distances(z, (torch.tensor([0, 0]), torch.tensor([1, 2]), torch.tensor([2, 3])))
    assert math.isclose(d_ap.item(), 3.0) and math.isclose(d_an.item(), 1.0) and not d_ap.requires_grad
    assert all(math.isnan(x.item()) for x in tuple_distances(z, (torch.tensor([], dtype=torch.long),)*3))


def late(records, n):
    "The records of the last third of an n-epoch run, by hand: epochs after 2n/3."
    return [r for r in records if r["epoch"] > 2 * n / 3]


def test_activity_criteria_on_the_stored_runs_by_hand():
    "Each method's declared criterion (`mechanism_of`) on its reference run, recomputed from the raw log lines and metrics.json."
    from dml_book.study import mechanism_of
    for m in STORED:
        if not (RESULTS/m/m/"seed0"/"log.jsonl").exists(): pytest.skip(f"no reference log for {m}")
    got = {m: mechanism_of(RESULTS/m/m/"seed0") for m in STORED}
    steps, epochs = raw("hdml"); n = epochs[-1]["epoch"]
    w, viol = (float(np.mean([r[k] for r in late(steps, n)])) for k in ("weight", "viol_syn"))
    assert [p["value"] for p in got["hdml"]["parts"]] == pytest.approx([1 - w, 1 - viol], abs=1e-12)
    assert got["hdml"]["active"] == (1 - w >= 0.1 and 1 - viol >= 0.2)
    steps, epochs = raw("ala"); n = epochs[-1]["epoch"]
    assert got["ala"]["value"] == pytest.approx(np.mean([r["weight_hardness_corr"] for r in late(epochs, n)]), abs=1e-12)
    cw = np.array(raw("dcml")[1][-1]["compositor_weights"]); K = cw.shape[1]
    assert got["dcml"]["value"] == pytest.approx((cw.max(1).mean() - 1 / K) / (1 - 1 / K), abs=1e-6)
    cfg = json.loads((RESULTS/"pads"/"pads"/"seed0"/"metrics.json").read_text())["config"]
    assert cfg["method_kwargs"] == {}   # PADS's defaults: 30 bins on [0.1, 1.4], U[0.3, 0.7] with 1e-3 elsewhere (Tab. 5c)
    edges = np.linspace(0.1, 1.4, 31); centers = (edges[1:] + edges[:-1]) / 2
    p0 = np.where((centers >= 0.3) & (centers <= 0.7), 1.0, 1e-3); p0 = p0 / p0.sum()
    epochs = raw("pads")[1]; n = epochs[-1]["epoch"]
    kl = [sum(p * math.log(p / q) for p, q in zip(r["pads_probs"], p0) if p > 0) for r in late(epochs, n)]
    assert got["pads"]["value"] == pytest.approx(np.mean(kl), rel=1e-9)
    n_s = json.loads((RESULTS/"dmml"/"dmml"/"seed0"/"metrics.json").read_text())["config"]["method_kwargs"]["n_support"]
    assert (got["dmml"]["value"], got["dmml"]["active"]) == (n_s, n_s >= 2)
