"Study statistics on synthetic metrics.json files: paired difference and t-interval against scipy, verdict, checkpoints."
import json, math
from pathlib import Path
import numpy as np
import pytest
from scipy import stats
from dml_book.study import study_frame, paired_difference, study_table, verdict, drop_checkpoints


def write_run(root, variant, seed, r1, selected=True):
    run = dict(config=dict(method=variant, dataset="glyphs_xl", loss="triplet", seed=seed), environment={},
               epochs=[dict(epoch=1, kind="epoch", **{"R@1": r1 - 0.1})], final={"R@1": r1 - 0.05})
    if selected: run["selected"] = dict(epoch=1, validation={"R@1": 0.9}, test={"R@1": r1})
    p = root/variant/f"seed{seed}"; p.mkdir(parents=True)
    (p/"metrics.json").write_text(json.dumps(run))


@pytest.fixture
def study(tmp_path):
    base = [0.50, 0.52, 0.49, 0.51, 0.50]
    meth = [0.47, 0.50, 0.47, 0.48, 0.49]             # below the baseline on every seed
    for s, (b, m) in enumerate(zip(base, meth)): write_run(tmp_path, "baseline", s, b); write_run(tmp_path, "pads", s, m)
    write_run(tmp_path, "pads", 7, 0.99)              # a seed the baseline lacks: not paired
    return tmp_path, np.array(meth) - np.array(base)


def test_paired_difference_matches_scipy(study):
    root, d = study
    p = paired_difference(study_frame(root), "pads")
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert p["n"] == 5 and p["seeds"] == [0, 1, 2, 3, 4]
    assert math.isclose(p["mean"], d.mean(), abs_tol=1e-12) and math.isclose(p["std"], d.std(ddof=1), abs_tol=1e-12)
    assert math.isclose(p["low"], lo, abs_tol=1e-12) and math.isclose(p["high"], hi, abs_tol=1e-12)
    # the t-test agrees: the interval excludes zero exactly when the paired test rejects at 5 %
    assert (hi < 0) == (stats.ttest_1samp(d, 0).pvalue < 0.05)


def test_reported_stage_and_table(study):
    root, d = study
    f = study_frame(root)
    assert set(f.stage) == {"selected"} and f.query("variant == 'baseline' and seed == 1").value.item() == 0.52
    t = study_table(f).set_index("variant")
    assert list(t.index) == ["baseline", "pads"] and t.loc["pads", "seeds"] == 6
    assert math.isclose(t.loc["baseline", "mean"], 100*np.mean([0.50, 0.52, 0.49, 0.51, 0.50]))
    assert math.isclose(t.loc["pads", "diff"], 100*d.mean())


def test_verdict_carries_numbers_and_sign(study):
    root, d = study
    v = verdict(study_frame(root), "pads", label="PADS")
    half = 100*stats.t.ppf(0.975, 4)*d.std(ddof=1)/math.sqrt(5)
    assert v.startswith("On glyphs-XL, PADS changes R@1 by -") and f"{100*d.mean():+.1f} ± {half:.1f} points over 5 seeds" in v
    assert "excludes zero" in v


def test_verdict_when_interval_straddles_zero(tmp_path):
    for s, (b, m) in enumerate([(0.5, 0.51), (0.5, 0.49), (0.5, 0.505)]):
        write_run(tmp_path, "baseline", s, b); write_run(tmp_path, "ala", s, m)
    v = verdict(study_frame(tmp_path), "ala")
    assert "+0.2" in v and "cannot tell" in v and "over 3 seeds" in v


def test_final_stage_without_validation_and_errors(tmp_path):
    write_run(tmp_path, "baseline", 0, 0.6, selected=False)
    f = study_frame(tmp_path)
    assert f.stage.item() == "final" and math.isclose(f.value.item(), 0.55)
    write_run(tmp_path, "hdml", 1, 0.7, selected=False)
    with pytest.raises(ValueError, match="share 0 seed"): paired_difference(study_frame(tmp_path), "hdml")
    with pytest.raises(ValueError, match="no variant 'dcml'"): paired_difference(f, "dcml")
    with pytest.raises(ValueError, match="reports 'NMI'"): study_frame(tmp_path, metric="NMI")


def test_drop_checkpoints(tmp_path):
    write_run(tmp_path, "baseline", 0, 0.5)
    for n in ("best.pt", "checkpoint.pt"): (tmp_path/"baseline"/"seed0"/n).write_bytes(b"x")
    assert sorted(p.name for p in drop_checkpoints(tmp_path)) == ["best.pt", "checkpoint.pt"]
    assert not list(tmp_path.rglob("*.pt")) and (tmp_path/"baseline"/"seed0"/"metrics.json").exists()


def test_study_config_applies_the_calibrated_settings():
    from dml_book.train import TrainConfig
    from dml_book.study import study_config, STUDY_SETTINGS
    cfg = study_config(TrainConfig(dataset="glyphs", dataset_kwargs={"size": 16}, epochs=2, loss="contrastive"), seed=3)
    assert cfg.dataset == "glyphs_xl" and cfg.dataset_kwargs == STUDY_SETTINGS["dataset_kwargs"] and cfg.seed == 3
    assert cfg.epochs == STUDY_SETTINGS["epochs"] and cfg.val_fraction > 0 and cfg.loss == "contrastive"


RESULTS = __import__("pathlib").Path(__file__).parent.parent/"results"


def test_stored_studies_parse_and_hold_no_checkpoints():
    studies = [p for p in RESULTS.iterdir() if p.is_dir() and any(p.rglob("metrics.json"))] if RESULTS.exists() else []
    for study in studies:
        f = study_frame(study)
        assert len(f) and f.value.between(0, 1).all() and not list(study.rglob("*.pt")), study
        for _, g in f.groupby("variant"): assert g.seed.is_unique, study
    for c in (RESULTS/"calibration").glob("*.json"):
        rec = json.loads(c.read_text())
        assert rec["command"].startswith("dml-book train --dataset glyphs_xl") and rec["cpu_seconds"] > 0
        assert 0 <= rec["test_R1"] <= 1 and rec["selected_epoch"] in [r["epoch"] for r in rec["curve"]], c


STORED = sorted(p.name for p in (Path(__file__).parents[1]/"results").iterdir()
                if p.is_dir() and p.name in ("ala", "hdml", "dcml", "pads", "dmml"))


def test_every_method_has_its_stored_study():
    assert STORED == ["ala", "dcml", "dmml", "hdml", "pads"]


@pytest.mark.parametrize("method", STORED)
def test_a_stored_method_study_parses_and_pairs_its_seeds(method):
    "results/<method>/: baseline and method over >= 3 paired seeds, the CPU time recorded, the verdict from the files."
    from dml_book.study import study_report, study_variants, paired_difference
    rep = study_report(method, root=Path(__file__).parents[1]/"results")
    assert set(rep["table"].variant) == set(study_variants(method)) and (rep["table"].seeds >= 3).all()
    assert rep["cpu_seconds"] > 0
    p = paired_difference(rep["frame"], method)
    assert f"{100*p['mean']:+.1f}" in rep["verdicts"][0] and rep["verdicts"][0].startswith(f"On glyphs-XL, {method.upper()} changes")
    for run in (Path(__file__).parents[1]/"results"/method).rglob("metrics.json"):   # configs are the study's own
        cfg = json.loads(run.read_text())["config"]
        assert cfg["dataset"] == "glyphs_xl" and cfg["epochs"] == 20 and not list(run.parent.glob("*.pt"))
