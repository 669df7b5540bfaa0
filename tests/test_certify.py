"A plan's phases through `python -m dml_book.certify` (`dml_book.certify`): every run pinned to the plan's SHA, the -off arm's null read back, the search and selection through the tuner, a rerun skipping what is stored, a record of another plan left alone."
import json
from dataclasses import replace
from pathlib import Path
import pytest
from dml_book import plans as P
from dml_book.certify import main, null_value
from dml_book.files import write_json
from dml_book.study_design import train_one
from test_tune import TINY

EPISODES = dict(method="dmml", loss="triplet", method_kwargs={"n_classes": 3, "n_support": 3, "n_query": 1})

def tiny_plan(results: Path, baseline_searched: bool = False) -> P.Plan:
    "A DMML plan (cpu, fp32) in a temporary results store (its baseline searched too, as DCML's from scratch, if `baseline_searched`)."
    knob = dict(field="lr_head", low=1e-4, high=1e-2, log=True)
    plan = dict(version=1, method="dmml", regime="from scratch",
                arms={"baseline": dict(what="the baseline at its pick", fields={}), "dmml": dict(what="DMML at its pick", fields={}),
                      "dmml-off": dict(what="one support image per meta-cell", fields={"method_kwargs.mechanism_off": True}, cite="DMML Table 5, n_s = 1")},
                search=dict(kind="search", trials=2, epochs=1, seed=0, space={"dmml": [knob], **({"baseline": [knob]} if baseline_searched else {})}),
                structure=P.declared_structure("dmml"),
                criterion=dict(name="set distances differing from the first image's", reads="steps[].set_effect", threshold=0.0,
                               null=dict(kind="one support image per meta-cell: the set plays no part (exactly 0)", n=20, quantile=0.95)),
                selection=dict(rule="best validation R@1 at work", candidates=1, seeds=[0, 1]),
                decision_seeds=list(range(100, 108)), power=dict(min_seeds=8, max_seeds=8, half_width=1.0), diverged="no-pair",
                exclusions=[], device=dict(kind="cpu", precision="fp32"), cost=dict(cpu_minutes=1.0, gpu_minutes=0.0, how="tiny"), calibration=None)
    return P.write_plan(P.plan_path("dmml", results=results), plan)

def test_the_null_and_decision_phases_run_under_the_plan_and_resume(tmp_path, one_thread):
    plan = tiny_plan(tmp_path); folder = Path(plan.path).parent
    pick = tmp_path/"pick"/"seed0"
    train_one(replace(TINY, **EPISODES, out=str(pick)), tmp_path)
    args = ["dmml", "--plan", str(plan.path), "--pick", str(pick), "--results", str(tmp_path), "--first", "2"]
    lines = []
    assert main(args + ["--phase", "null"], log=lines.append) == [100, 101]
    assert lines[-1] == "null: " + str({"kind": "one support image per meta-cell: the set plays no part (exactly 0)", "p95": 0.0, "n": 2})
    assert main(args + ["--phase", "decide", "--arm", "dmml"], log=lines.append) == [100, 101]
    for arm, off in (("dmml-off", True), ("dmml", False)):
        for seed in (100, 101):
            m = json.loads((folder/arm/f"seed{seed}"/"metrics.json").read_text())
            assert m["config"]["plan_sha"] == plan.sha and m["config"]["seed"] == seed and m["run"]["precision"] == "fp32"
            assert m["config"]["method_kwargs"].get("mechanism_off", False) is off and m["config"]["method_kwargs"]["n_support"] == 3
            P.check_run(folder/arm/f"seed{seed}", plan)
            assert (null_value(m["mechanism"]) == 0.0) is off   # the switched-off set plays no part; the method's does
            assert m["mechanism"]["active"] is not off
    before = (folder/"dmml-off"/"seed100"/"metrics.json").read_bytes()
    (folder/"dmml-off"/"seed102").mkdir()
    write_json(folder/"dmml-off"/"seed102"/"metrics.json", dict(config=dict(plan_sha="0" * 64, precision="fp32")))   # another plan's record
    lines.clear()
    assert main(args[:-1] + ["3", "--phase", "null"], log=lines.append) == []   # nothing trained again, nothing overwritten
    assert lines[:2] == ["dmml-off/seed100: stored under the plan", "dmml-off/seed101: stored under the plan"]
    assert lines[2].startswith("dmml-off/seed102: left alone: ") and "not this study's plan" in lines[2]
    assert (folder/"dmml-off"/"seed100"/"metrics.json").read_bytes() == before
    assert json.loads((folder/"dmml-off"/"seed102"/"metrics.json").read_text())["config"]["plan_sha"] == "0" * 64

def test_a_plan_of_another_method_or_a_phase_without_its_inputs_is_refused_in_one_line(tmp_path, capsys):
    plan = tiny_plan(tmp_path); x = ["--pick", "x"]
    for argv, says in ((["hdml", "--phase", "null", *x], "is 'dmml''s plan, not 'hdml''s"),
                       (["dmml", "--pretrained", "--phase", "null", *x], "the from scratch plan, not the pretrained one"),
                       (["dmml", "--phase", "select"], "no trial of the search of dmml is stored: run --phase search first"),
                       (["dmml", "--phase", "decide", "--arm", "dmml"], "phase decide trains at a pick: name a finished run of it (--pick)"),
                       (["dmml", "--phase", "decide", "--arm", "dmml-off", *x], "the dmml-off arm: --phase null")):
        with pytest.raises(SystemExit) as e: main(argv + ["--plan", str(plan.path), "--results", str(tmp_path)])
        assert str(e.value).startswith("certify: error: ") and says in str(e.value) and "\n" not in str(e.value)

def test_the_search_and_selection_run_under_the_plan_resume_and_pick(tmp_path, one_thread):
    "The plan's search (Optuna, its storage in the plan's folder) and selection: every trial and candidate pinned to the plan, a rerun trains nothing."
    import pandas as pd
    plan = tiny_plan(tmp_path); tuning = Path(plan.path).parent/"tuning"/"dmml"
    start = tmp_path/"start"/"seed0"
    train_one(replace(TINY, **EPISODES, out=str(start)), tmp_path)
    args = ["dmml", "--plan", str(plan.path), "--results", str(tmp_path)]
    lines = []
    with pytest.raises(SystemExit) as e: main(args + ["--phase", "select"], log=lines.append)
    assert "run --phase search first" in str(e.value)
    assert main(args + ["--phase", "search", "--pick", str(start)], log=lines.append) == [0, 1]   # the plan's budget: 2 trials
    assert (tuning.parent/"optuna.db").is_file()
    trials = pd.read_csv(tuning/"trials.csv")
    assert len(trials) == 2 and (trials.state == "COMPLETE").all()
    for n in (0, 1):
        m = json.loads((tuning/f"trial{n}"/"metrics.json").read_text())
        assert m["config"]["plan_sha"] == plan.sha and m["config"]["epochs"] == 1 and 1e-4 <= m["config"]["lr_head"] <= 1e-2
        P.check_run(tuning/f"trial{n}", plan)
    assert json.loads((tuning/"trial1"/"metrics.json").read_text())["config"]["lr_head"] != json.loads((tuning/"trial0"/"metrics.json").read_text())["config"]["lr_head"]
    before = (tuning/"trial0"/"metrics.json").read_bytes()
    assert main(args + ["--phase", "search"], log=lines.append) == []   # resumed from the storage: nothing trained again
    assert (tuning/"trial0"/"metrics.json").read_bytes() == before
    with pytest.raises(SystemExit) as e: main(args + ["--phase", "search", "--pick", str(pick_of_other_start(tmp_path))], log=lines.append)
    assert "started from another configuration" in str(e.value)
    lines.clear()
    assert trials.feasible.all() and (trials.constraint == 0).all() and (trials.criterion_value > 0).all()   # the set plays a part in each: under its criterion
    best = int(trials.sort_values("val_R1", ascending=False, kind="stable").number.iloc[0])   # the best feasible trial (the earlier on a tie)
    assert main(args + ["--phase", "select"], log=lines.append) == [best, best]   # 1 candidate, seeds 0 and 1
    for s in (0, 1):
        run = tuning/"selection"/f"trial{best}"/f"seed{s}"
        m = json.loads((run/"metrics.json").read_text())
        assert m["config"]["plan_sha"] == plan.sha and m["config"]["seed"] == s and m["config"]["epochs"] == TINY.epochs
        P.check_run(run, plan)
    sel = pd.read_csv(tuning/"selection.csv")
    assert sel.candidate.tolist() == [best] and sel.seeds.tolist() == [2]
    assert sel.active.tolist() == [True] and sel.diverged.tolist() == [0] and sel.picked.tolist() == [True]
    assert lines[-1].startswith(f"dmml: picked trial {best} ") and lines[-1].endswith(f"selection/trial{best}/seed0")
    lines.clear()
    assert main(args + ["--phase", "select"], log=lines.append) == []   # stored under the plan: nothing trained again
    assert lines[:2] == [f"dmml/selection/trial{best}/seed0: stored under the plan", f"dmml/selection/trial{best}/seed1: stored under the plan"]

def pick_of_other_start(tmp_path: Path) -> Path:
    "A finished run at another setting than the search's start (its margin)."
    run = tmp_path/"other"/"seed0"
    train_one(replace(TINY, **{**EPISODES, "method_kwargs": {**EPISODES["method_kwargs"], "margin": 0.7}}, epochs=1, out=str(run)), tmp_path)
    return run

def test_a_baseline_the_plan_searches_is_searched_and_selected_without_a_criterion(tmp_path, one_thread):
    "DCML from scratch: the plan's search.space has the baseline too; its trials are unconstrained, its pick the best validation R@1."
    import pandas as pd
    plan = tiny_plan(tmp_path, baseline_searched=True); tuning = Path(plan.path).parent/"tuning"/"baseline"
    start = tmp_path/"start"/"seed0"
    train_one(replace(TINY, out=str(start)), tmp_path)
    args = ["dmml", "--plan", str(plan.path), "--results", str(tmp_path), "--arm", "baseline"]
    lines = []
    assert main(args + ["--phase", "search", "--pick", str(start)], log=lines.append) == [0, 1]
    trials = pd.read_csv(tuning/"trials.csv")
    assert trials.constraint.isna().all() and trials.feasible.isna().all() and (trials.state == "COMPLETE").all()   # no criterion: every trial counts
    best = int(trials.sort_values("val_R1", ascending=False, kind="stable").number.iloc[0])
    assert main(args + ["--phase", "select"], log=lines.append) == [best, best]
    sel = pd.read_csv(tuning/"selection.csv")
    assert sel.candidate.tolist() == [best] and sel.active.isna().all() and sel.picked.tolist() == [True]
    for s in (0, 1):
        m = json.loads((tuning/"selection"/f"trial{best}"/f"seed{s}"/"metrics.json").read_text())
        assert m["config"]["plan_sha"] == plan.sha and m["config"]["method"] == "baseline"
    assert not (Path(plan.path).parent/"tuning"/"dmml").exists()   # the method's arm is searched on its own command
