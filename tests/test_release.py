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
