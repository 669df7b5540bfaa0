"A plan's phases through `python -m dml_book.certify` (`dml_book.certify`): every run pinned to the plan's SHA, the -off arm's null read back, a rerun skipping what is stored, a record of another plan left alone."
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

def tiny_plan(results: Path) -> P.Plan:
    "A DMML plan (cpu, fp32) in a temporary results store."
    plan = dict(version=1, method="dmml", regime="from scratch",
                arms={"baseline": dict(what="the baseline at its pick", fields={}), "dmml": dict(what="DMML at its pick", fields={}),
                      "dmml-off": dict(what="one support image per meta-cell", fields={"method_kwargs.mechanism_off": True}, cite="DMML Table 5, n_s = 1")},
                search=dict(kind="search", trials=2, epochs=1, seed=0, space={"dmml": [dict(field="lr_head", low=1e-4, high=1e-2, log=True)]}),
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

def test_a_plan_of_another_method_or_phase_not_built_is_refused_in_one_line(tmp_path, capsys):
    plan = tiny_plan(tmp_path)
    for argv, says in ((["hdml", "--phase", "null"], "is 'dmml''s plan, not 'hdml''s"),
                       (["dmml", "--pretrained", "--phase", "null"], "the from scratch plan, not the pretrained one"),
                       (["dmml", "--phase", "search"], "phase search is not built yet"),
                       (["dmml", "--phase", "decide", "--arm", "dmml-off"], "the dmml-off arm: --phase null")):
        with pytest.raises(SystemExit) as e: main(argv + ["--plan", str(plan.path), "--pick", "x", "--results", str(tmp_path)])
        assert str(e.value).startswith("certify: error: ") and says in str(e.value) and "\n" not in str(e.value)
