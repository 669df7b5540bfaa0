"A study's plan (`dml_book.plans`): out-of-bound values refused, a linked plan refused, a run of another plan refused, an edited plan reported, and the SHA carried by a real run."
import json, os
from dataclasses import replace
from pathlib import Path
import pytest
from dml_book import plans as P
from dml_book.files import write_json

COUPLED = {f"{l}x{c}": {"method_kwargs.n_learners": l, "method_kwargs.n_compositors": c} for l in (2, 4, 8) for c in (2, 4, 8) if c >= l}
TANH = dict(field="method_kwargs.use_sign", op="==", value=True, cite="DCML Sec. 3.2")
ORDER = dict(field="method_kwargs.n_compositors", op=">=", other="method_kwargs.n_learners", cite="DCML Sec. 4.1")


def plan(**over):
    "A valid plan; `over` sets dotted keys."
    p = dict(version=1, method="dcml", regime="from scratch",
             arms={"baseline": dict(what="tuned baseline", fields={}), "dcml": dict(what="at its pick", fields={}),
                   "dcml-off": dict(what="compositors frozen", fields={"method_kwargs.mechanism_off": True}, cite="DCML Table 1")},
             search=dict(kind="search", trials=20, epochs=10, seed=0,
                         space={"baseline": [dict(field="lr_head", low=2e-4, high=5e-3, log=True)],
                                "dcml": [dict(field="ensemble", sets=COUPLED), dict(field="method_kwargs.use_sign", choices=[True])]}),
             structure=P.declared_structure("dcml"),
             criterion=dict(name="coverage", reads="mechanism.coverage", threshold=0.1, null=dict(kind="frozen", n=100, quantile=0.95)),
             selection=dict(rule="best validation R@1 among those at work", candidates=3, seeds=[0, 1]),
             decision_seeds=list(range(100, 116)), power=dict(min_seeds=8, max_seeds=16, half_width=1.0),
             diverged="no-pair", exclusions=[dict(rule="none beyond divergence", why="every run counts")],
             device=dict(kind="cpu", precision="fp32"), cost=dict(cpu_minutes=10.0, gpu_minutes=0.0, how="cost.json"), calibration=None)
    for k, v in over.items(): p = P._set(p, k, v)
    return p


def record(folder: Path, sha, precision="fp32", device="cpu"):
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder/"metrics.json", dict(config=dict(plan_sha=sha, precision=precision), run=dict(precision=precision, plan_sha=sha)))
    write_json(folder/"run.json", dict(device=device, cpu_seconds=1.0))


@pytest.mark.parametrize("key,bad,says", [
    ("power.min_seeds", 5, "power.min_seeds=5 is invalid: expected at least 8"),
    ("power.half_width", 2.0, "power.half_width=2.0 is invalid"),
    ("power.max_seeds", 30, "16 decision seeds, fewer than power.max_seeds=30"),
    ("device.kind", "tpu", "device.kind='tpu' is invalid"),
    ("device.precision", "auto", "device.precision='auto' is invalid"),
    ("search.trials", 0, "search.trials=0 is invalid"),
    ("criterion.null.quantile", 1.0, "criterion.null.quantile=1.0 is invalid"),
    ("cost.cpu_minutes", -1, "cost.cpu_minutes=-1 is invalid"),
    ("decision_seeds", [0] + list(range(100, 115)), "decision seeds 0 are used by the search or the selection"),
    ("arms.dcml-off.cite", "", "arms.dcml-off lacks its cite"),
    ("exclusion", [], "holds 'exclusion', which no plan has (a misspelt key?)"),
    ("structure", [TANH, ORDER], "omits dcml's structural rule method_kwargs.compositor_weighting == \"softmax\""),
    ("arms.dcml.fields", {"method_kwargs.fc_compositor": True}, "reaches method_kwargs.fc_compositor=True, but the paper keeps"),
    ("search.space.dcml", [dict(field="method_kwargs.use_sign", choices=[True, False])], "reaches method_kwargs.use_sign=False"),
    ("search.space.dcml", [dict(field="method_kwargs.n_learners", choices=[4, 8]), dict(field="method_kwargs.n_compositors", choices=[4])],
     "method_kwargs.n_compositors=4, but the paper keeps method_kwargs.n_compositors >= method_kwargs.n_learners=8"),
])
def test_out_of_bound_values_are_refused_in_one_line(tmp_path, key, bad, says):
    P.check_plan(plan())
    with pytest.raises(P.PlanError) as e: P.write_plan(P.plan_path("dcml", results=tmp_path), plan(**{key: bad}))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path/"dcml").exists()


def test_a_linked_plan_is_refused(tmp_path):
    f = P.plan_path("dcml", results=tmp_path); P.write_plan(f, plan())
    os.symlink(f, tmp_path/"link.json")
    with pytest.raises(P.FileError, match="is a symbolic link"): P.read_plan(tmp_path/"link.json")
    real = tmp_path/"real"; real.mkdir(); (real/"plan.json").write_text(f.read_text())
    f.unlink(); os.symlink(real/"plan.json", f)   # the plan in its place replaced by a link
    with pytest.raises(P.FileError, match="is a symbolic link"): P.read_plan(f)


def test_a_run_of_another_plan_or_format_or_device_is_refused(tmp_path):
    f = P.plan_path("dcml", results=tmp_path); p = P.write_plan(f, plan())
    other = P.plan_sha(plan(**{"power.min_seeds": 10}))
    record(f.parent/"dcml"/"seed100", p.sha); record(f.parent/"dcml"/"seed101", other); record(f.parent/"dcml"/"seed102", None)
    record(f.parent/"dcml"/"seed103", p.sha, precision="bf16"); record(f.parent/"dcml"/"seed104", p.sha, device="cuda:0")
    assert P.check_run(f.parent/"dcml"/"seed100", p)["config"]["plan_sha"] == p.sha
    for seed, says in ((101, f"made under plan {other[:12]}, not this study's plan {p.sha[:12]}"), (102, "made under no plan"),
                       (103, "ran in bf16, but its plan pins fp32"), (104, "trained on cuda:0, but its plan pins cpu")):
        with pytest.raises(P.PlanError) as e: P.check_run(f.parent/"dcml"/f"seed{seed}", p)
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_an_edited_plan_is_reported_with_its_lines_before_and_after(tmp_path):
    f = P.plan_path("dcml", results=tmp_path); p = P.write_plan(f, plan())
    assert P.deviations(f) == []
    record(f.parent/"baseline"/"seed100", p.sha)
    q = P.amend(f, {"selection.candidates": 2}, "a candidate cannot finish", today="2026-12-01")
    assert P.check_run(f.parent/"baseline"/"seed100", q)   # a run of the earlier version is the plan's
    assert P.deviations(f) == [dict(date="2026-12-01", key="selection.candidates", before=3, after=2, why="a candidate cannot finish", recorded=True)]
    with pytest.raises(P.PlanError, match="power.half_width=1.5 is invalid"): P.amend(f, {"power.half_width": 1.5}, "wider")
    edited = json.loads(f.read_text()); edited["power"]["min_seeds"] = 12; edited["diverged"] = "zero"
    f.write_text(json.dumps(edited, indent=2))   # changed outside plans.amend
    assert not P.read_plan(f).recorded
    got = {(d["key"], json.dumps(d["before"]), json.dumps(d["after"])) for d in P.deviations(f) if not d["recorded"]}
    assert got == {("power.min_seeds", "8", "12"), ("diverged", '"no-pair"', '"zero"')}, got
    with pytest.raises(P.PlanError, match="edited outside plans.amend"): P.amend(f, {"power.max_seeds": 15}, "x")
    f.with_name(P.DEVIATIONS).unlink()   # the record gone too: the runs still hold the SHA they were made under
    gone = P.deviations(f)
    assert len(gone) == 1 and gone[0]["before"] == f"plan {p.sha[:12]}" and not gone[0]["recorded"]


def test_a_real_run_records_its_plan_and_is_accepted(tmp_path):
    "`decide_arm` trains the pick's configuration pinned to the plan; the trainer writes the SHA into `metrics.json`; a rerun skips it."
    from dml_book.train import TrainConfig
    from dml_book.study_design import train_one
    f = P.plan_path("dcml", results=tmp_path); p = P.write_plan(f, plan(**{"decision_seeds": list(range(100, 116))}))
    pick = TrainConfig(dataset="glyphs", dataset_kwargs={"size": 16, "per_font": 1}, epochs=1, max_steps_per_epoch=2, batch_size=16,
                       ks=(1,), out=str(tmp_path/"pick"/"seed0"))
    train_one(pick, tmp_path)
    lines = []
    assert P.decide_arm(p, "baseline", tmp_path/"pick"/"seed0", tmp_path, first=2, log=lines.append) == [100, 101]
    m = json.loads((f.parent/"baseline"/"seed100"/"metrics.json").read_text())
    assert m["config"]["plan_sha"] == m["run"]["plan_sha"] == p.sha and m["run"]["precision"] == "fp32" and m["config"]["seed"] == 100
    P.check_run(f.parent/"baseline"/"seed100", p)
    record(f.parent/"baseline"/"seed102", "0" * 64)   # a record of another plan in a decision seed's folder: left alone
    assert P.decide_arm(p, "baseline", tmp_path/"pick"/"seed0", tmp_path, first=3, log=lines.append) == []
    assert lines[-1].startswith("baseline/seed102: left alone: ") and "not this study's plan" in lines[-1], lines
    assert json.loads((f.parent/"baseline"/"seed102"/"metrics.json").read_text())["config"]["plan_sha"] == "0" * 64
    other = P.write_plan(P.plan_path("dcml", "pretrained", tmp_path), plan(regime="pretrained"))
    with pytest.raises(P.PlanError, match="not this study's plan"): P.check_run(f.parent/"baseline"/"seed100", other)


def test_certified_spaces_keep_each_papers_structure_and_the_stored_ones_do_not():
    "Every stored search (tune.SEARCH_SPACES) reaches a point outside its paper's declared structure; the certified space none."
    from dml_book.tune import SEARCH_SPACES
    leaving = []
    for m in SEARCH_SPACES:
        base, rules = {**P.method_defaults(m), **P.paper_fields(m)}, P.declared_structure(m)
        assert rules, m
        P.check_structure(P.certified_space(m), base, rules, m)
        try: P.check_structure([P._plan_knob(k) for k in SEARCH_SPACES[m][m]], base, rules, m)
        except P.PlanError: leaving.append(m)
    assert sorted(leaving) == sorted(SEARCH_SPACES), leaving
