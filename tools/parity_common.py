"""What the `tools/parity_*.py` scripts share: one-line failures, the official copy's commit, and their command line."""
import argparse, subprocess, sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1]/"tests"/"fixtures"/"parity"


def fail(msg: str):
    "One clear line on stderr, exit status 2."
    print(f"error: {msg}", file=sys.stderr); sys.exit(2)


def commit_of(path: Path, given: str | None) -> str:
    "The official copy's commit: `--commit`, or `git rev-parse HEAD` where the copy is the top of a checkout."
    if given:
        if len(given) != 40 or any(ch not in "0123456789abcdef" for ch in given.lower()): fail(f"--commit must be a 40-digit hash, got {given!r}")
        return given
    git = lambda *a: subprocess.run(["git", "-C", str(path), *a], capture_output=True, text=True, check=True).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() == path.resolve(): return git("rev-parse", "HEAD")
    except (subprocess.CalledProcessError, FileNotFoundError): pass
    fail(f"{path} is not the top of a git checkout: pass --commit <sha>")


def fixture_parser(doc: str, # the script's docstring (its second line describes it)
                   fixture: str, # the fixture's file name under tests/fixtures/parity/
                  ) -> argparse.ArgumentParser:
    "The scripts' common command line: PATH of the official copy, --commit, --out."
    ap = argparse.ArgumentParser(description=doc.splitlines()[1])
    ap.add_argument("path", type=Path, help="local copy of the official repository")
    ap.add_argument("--commit", help="its commit (needed when PATH is not a git checkout)")
    ap.add_argument("--out", type=Path, default=FIXTURES/fixture)
    return ap


def cited_lines(root: Path, functions: dict) -> dict:
    "The text (stripped) of each cited `file:line` of `functions`, read from the official copy at `root`."
    out = {}
    for key, at in functions.items():
        path, line = at.rsplit(":", 1)
        out[key] = (root/path).read_text().splitlines()[int(line) - 1].strip()
    return out
