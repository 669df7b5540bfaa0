"""The release workflow's wheel check (.github/workflows/release.yml) follows `findings()`: it runs tools/wheel_check.py,
which computes what the wheel must report from the clone's results/, with no count typed in; the check passes on
today's findings and names each difference when the wheel's summaries disagree."""
import re, sys
from pathlib import Path
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/"tools"))
import release_check, wheel_check
from dml_book.findings import findings


def test_the_workflow_checks_the_installed_wheel_with_wheel_check_and_types_no_count():
    steps = release_check.build_steps()
    runs = [s["run"] for s in steps]
    check = next(r for r in runs if "wheel_check.py" in r)
    assert '"$GITHUB_WORKSPACE/tools/wheel_check.py" "$GITHUB_WORKSPACE/results"' in check and "cd /tmp" in check   # outside the clone
    assert re.search(r"python -m venv /tmp/wheel-env\n.*pip install .*dist/\*\.whl", check), check   # a fresh venv, the wheel with its dependencies
    assert "--no-deps" not in check and "--system-site-packages" not in check
    assert not re.search(r"assert|len\(|==\s*\d", check), "a count typed into the workflow goes stale with the next study"
    assert any("twine check --strict" in r for r in runs) and any("python -m build" in r for r in runs)
    workflow = yaml.safe_load((ROOT/".github"/"workflows"/"release.yml").read_text())
    upload = [s for s in workflow["jobs"]["build"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert upload and workflow["jobs"]["build"]["steps"].index(upload[0]) > max(workflow["jobs"]["build"]["steps"].index(s) for s in steps)


def test_wheel_check_passes_on_todays_findings_and_names_each_difference():
    today = findings(root=ROOT/"results")
    assert len(today) and not wheel_check.problems(today, today)
    summary = wheel_check.summary(today)
    assert summary.startswith(f"{len(today)} findings of {today.method.nunique()} methods")
    dropped, changed = today.iloc[1:], today.copy()
    changed.loc[changed.index[0], "decided"] = "better" if today.decided.iloc[0] != "better" else "worse"
    first = " / ".join(today.iloc[0][["method", "regime", "settings"]])
    assert wheel_check.problems(dropped, today) == [f"the wheel has no finding for {first}"]
    assert wheel_check.problems(today, dropped) == [f"the wheel has a finding the clone has not: {first}"]
    said = wheel_check.problems(changed, today)
    assert len(said) == 1 and said[0].startswith(f"{first}: decided is") and "in the clone" in said[0]
    assert wheel_check.problems(today.iloc[:0], today.iloc[:0]) == ["the clone's results/ give no finding: nothing to check the wheel against"]


def test_keep_names_a_new_folder_and_nothing_outside_the_check_is_deleted(tmp_path):
    "`--keep` naming an existing folder or file is one line, and the folder stays; the wheel's venv is the check's own, never /tmp/wheel-env."
    import subprocess
    for existing in (tmp_path/"file", tmp_path/"dir"):   # the file first: the old check failed on it at once
        existing.mkdir() if existing.name == "dir" else existing.write_text("mine")
        (tmp_path/"dir"/"keep-me").write_text("mine") if existing.name == "dir" else None
        r = subprocess.run([sys.executable, str(ROOT/"tools"/"release_check.py"), "--keep", str(existing)], capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "exists; name a new folder" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert (tmp_path/"dir"/"keep-me").read_text() == "mine" and (tmp_path/"file").read_text() == "mine"
    check = next(s["run"] for s in release_check.build_steps() if "wheel_check.py" in s["run"])
    local = release_check.local_step(check, tmp_path/"work")
    assert release_check.RUNNER_VENV in check and release_check.RUNNER_VENV not in local and str(tmp_path/"work"/"wheel-env") in local
    assert "rmtree" not in (ROOT/"tools"/"release_check.py").read_text().split("def main", 1)[1].split("if not args.keep", 1)[0]


def test_wheel_check_names_an_infeasible_line_the_wheel_lacks(tmp_path):
    "A store without ALA's infeasible.json (as the wheel `python -m build` made before MANIFEST.in named it) is one line."
    import shutil
    shipped = tmp_path/"results"
    shutil.copytree(ROOT/"results"/"ala", shipped/"ala", ignore=shutil.ignore_patterns("*.jsonl", "*.pt", "*.db", "*.csv", "*.png"))
    assert wheel_check.infeasible_problems(shipped, ROOT/"results") == []   # ALA's from-scratch search: the same line in both
    (shipped/"ala"/"tuning"/"ala-active"/"infeasible.json").unlink()
    said = wheel_check.infeasible_problems(shipped, ROOT/"results")
    assert [s.split(":")[0] for s in said] == ["ala / from scratch"] and "None in the wheel" in said[0]
