"""Experiment notebooks check their own parameters (`dml_book.results.check_parameters`, in the cell after the
`parameters` cell), so that raw papermill (`-p seeds "[0]"`, a string) either gets the declared type or one line
naming the parameter, instead of a traceback many cells later."""
import json, subprocess, sys
from typing import Optional
from pathlib import Path
import nbformat, pytest
from dml_book.results import check_parameter, check_parameters, ParameterError

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT/"nbs"/"experiments").glob("*.ipynb"))


@pytest.mark.parametrize("kind, given, expected", [
    (list, "[0]", [0]), (list, "[0, 1]", [0, 1]), (list, [2], [2]), (dict, '{"size": 8}', {"size": 8}),
    (Optional[int], "12", 12), (Optional[int], "null", None), (Optional[int], None, None), (int, 3, 3),
    (float, "0.5", 0.5), (float, "3e-3", 0.003), (float, 2, 2.0), (bool, "true", True), (bool, False, False),
    (str, "[0]", "[0]"), (str, "null", "null"), (Optional[str], "None", None), (str, 5, "5"), (Optional[bool], "null", None),
])
def test_values_are_read_as_the_declared_type(kind, given, expected):
    got = check_parameter("p", kind, given)
    assert got == expected and type(got) is type(expected), (got, expected)


@pytest.mark.parametrize("kind, given, fragment", [
    (list, "0,1", "parameter p must be list; got '0,1' (str)"), (int, "two", "parameter p must be int; got 'two' (str)"),
    (int, True, "must be int; got True (bool)"), (int, 2.5, "must be int; got 2.5 (float)"),
    (Optional[int], "[1]", "must be int or None; got [1] (list)"), (dict, "[1]", "must be dict; got [1] (list)"),
    (bool, "maybe", "must be bool; got 'maybe' (str)"), (float, "fast", "must be float; got 'fast' (str)"),
])
def test_values_of_another_type_are_one_clear_error(kind, given, fragment):
    with pytest.raises(ParameterError) as e: check_parameter("p", kind, given)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def _parameters_cell(nb) -> int:
    return next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_each_experiment_checks_its_defaults_right_after_its_parameters(path):
    "The checking cell follows the `parameters` cell (papermill's injected cell lands between them), and accepts the defaults unchanged."
    nb = nbformat.read(str(path), as_version=4)
    i = _parameters_cell(nb)
    assert "check_parameters(globals())" in nb.cells[i + 1].source, path.name
    ns = {}
    exec(compile(nb.cells[i].source, "parameters", "exec"), ns)
    defaults = {k: ns[k] for k in ns["__annotations__"]}
    assert check_parameters(ns) == defaults and defaults


def test_raw_papermill_reads_a_list_and_stops_at_a_bad_value_with_one_line(tmp_path):
    "`-p seeds \"[0]\"` passes (it is read as a list); `-p study maybe` stops the notebook in the checking cell, in one line."
    out = tmp_path/"out.ipynb"
    r = subprocess.run([sys.executable, "-m", "papermill", str(ROOT/"nbs"/"experiments"/"hdml.ipynb"), str(out), "-k", "python3",
                        "-p", "seeds", "[0]", "-p", "study", "maybe", "-p", "out_dir", str(tmp_path/"runs")],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode != 0
    nb = json.loads(out.read_text())
    errors = [(i, o) for i, c in enumerate(nb["cells"]) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert len(errors) == 1
    i, err = errors[0]
    assert "check_parameters(globals())" in "".join(nb["cells"][i]["source"])   # it stopped in the checking cell
    assert err["traceback"] == ["ParameterError: parameter study must be bool; got 'maybe' (str)"]
    assert "ParameterError: parameter study must be bool; got 'maybe' (str)" in r.stderr + r.stdout
    assert not (tmp_path/"runs").exists() or not any((tmp_path/"runs").rglob("metrics.json"))   # nothing trained


@pytest.mark.parametrize("projection, fragment", [("tsne", None), (None, None), ("umap", None),
                                                  ("pca", "parameter projection must be one of 'umap', 'tsne', None; got 'pca'")])
def test_train_eval_names_a_projection_it_cannot_draw(projection, fragment):
    "train_eval's checking cell accepts the two maps and None, and stops on any other with one line naming the parameter."
    nb = nbformat.read(str(ROOT/"nbs"/"experiments"/"train_eval.ipynb"), as_version=4)
    i = _parameters_cell(nb)
    ns = {}
    exec(compile(nb.cells[i].source, "parameters", "exec"), ns)
    ns["projection"] = projection
    run = lambda: exec(compile(nb.cells[i + 1].source, "checking", "exec"), ns)
    if fragment is None: run()
    else:
        with pytest.raises(ParameterError) as e: run()
        assert str(e.value) == fragment


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_allowed_values_are_annotations_that_check_parameters_enforces(path):
    "A parameter with a few allowed values says so in its annotation (a `Literal` alias): no cell checks them by hand, and a value outside them stops in the checking cell."
    import re, typing
    nb = nbformat.read(str(path), as_version=4)
    i = _parameters_cell(nb)
    for c in nb.cells[i + 1:]:
        assert not re.search(r"^if \w+ not in \(", c.source, re.M), f"{path.name}: a parameter's values checked by hand:\n{c.source[:200]}"
    ns = {}
    exec(compile(nb.cells[i].source, "parameters", "exec"), ns)
    chosen = {k: a for k, a in ns["__annotations__"].items() if typing.Literal in {typing.get_origin(x) for x in (a, *typing.get_args(a))}}
    if path.stem in ("ala", "dcml", "dmml", "hdml", "pads"): assert "scale" in chosen
    if path.stem == "train_eval": assert "projection" in chosen
    for k in chosen:
        ns_bad = {**ns, k: "no-such-value"}
        with pytest.raises(ParameterError, match=f"parameter {k} must be one of .*; got 'no-such-value'"): check_parameters(ns_bad)
