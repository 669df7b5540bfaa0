"""Records against words: nbs/words_vs_records.json (the findings page's list of commit messages that name a number
format their runs' records contradict) is what git's history gives, where the history is there."""
import json, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/"tools"))
import words_vs_records as wv


def _history() -> bool:
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == "false"


@pytest.mark.skipif(not _history(), reason="no full git history here (a wheel, a tarball or a shallow clone): nothing to check the list against")
def test_the_stored_list_is_what_git_gives():
    stored = json.loads(wv.OUT.read_text())
    assert stored == wv.disagreements(), "nbs/words_vs_records.json is stale: run python tools/words_vs_records.py"
    for row in stored:   # each entry, by hand: the message names the format, and a run it added records another
        subject = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%s", row["commit"]], capture_output=True, text=True).stdout
        assert all(f in subject.lower() for f in row["says"]) and set(row["recorded"]) - set(row["says"])


def test_a_message_that_agrees_with_its_records_is_not_listed():
    from collections import Counter
    assert wv.FORMATS.findall("Results, CPU fp32: x") == ["fp32"] and wv.FORMATS.findall("bf16x") == []
