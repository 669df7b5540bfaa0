"What the parity tests share: how far our numbers are from the official code's, and the tolerance that float64 allows."
import numpy as np
import torch

RTOL = 1e-12   # float64 arithmetic in a different order (ours against the official code) agrees to ~1e-15; 1e-12 leaves room


def as_array(a) -> np.ndarray:
    "A tensor, list or number as a float64 array (a tensor's own precision kept: no detour through float32)."
    return a.detach().cpu().double().numpy() if torch.is_tensor(a) else np.asarray(a, dtype=float)


def rel(ours, theirs) -> float:
    "Relative difference of two arrays: the largest |ours - theirs| over the largest |theirs|."
    ours, theirs = as_array(ours), as_array(theirs)
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-300))


def assert_parity(ours, theirs, rtol: float = RTOL):
    """Element by element: |ours - theirs| <= rtol |theirs| + rtol max|theirs| (the absolute floor, for elements that
    are zero or cancel to rounding noise, is rtol times the array's largest element; 1e-300 for an all-zero array)."""
    ours, theirs = as_array(ours), as_array(theirs)
    assert ours.shape == theirs.shape, f"shape {ours.shape} against the official {theirs.shape}"
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=rtol * max(np.abs(theirs).max(initial=0.0), 1e-300))


# ---- the cited official lines against a fresh run of the generating script (where the official code is at hand)
import json, os, subprocess, sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OFFICIAL = "DML_BOOK_OFFICIAL"       # a folder holding clones of the official repositories, by their names (HDML, DCML, ...)


def official_copy(name: str, commit: str) -> Path:
    "The clone of the official repository `name` at `commit` under $DML_BOOK_OFFICIAL; a skip saying why where there is none."
    if not os.environ.get(OFFICIAL): pytest.skip(f"no official code at hand: set {OFFICIAL} to a folder with a clone of {name} at {commit[:12]}")
    path = Path(os.environ[OFFICIAL]) / name
    if not path.is_dir(): pytest.skip(f"{path} does not exist: clone the official {name} there")
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head != commit: pytest.skip(f"{path} is at {head[:12] or 'no commit'}, the fixture at {commit[:12]}: check out {commit[:12]} there")
    return path


def fresh_run(script: str, repo: Path, out: Path, python: str = sys.executable) -> subprocess.CompletedProcess:
    "Run tools/<script> on the official copy `repo`, writing to `out`; fail with its stderr's tail if it fails."
    r = subprocess.run([python, str(ROOT / "tools" / script), str(repo), "--out", str(out)], capture_output=True, text=True,
                       env=os.environ | {"OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert r.returncode == 0, f"{script} failed: {r.stderr[-2000:]}"
    return r


def assert_same_numbers(fresh, stored, where=""):
    "Two fixtures' numbers (nested dicts and lists of a JSON fixture) equal at parity's tolerance, their text exactly."
    if isinstance(stored, dict):
        assert set(fresh) == set(stored), f"{where}: keys {sorted(set(fresh) ^ set(stored))} differ"
        for k in stored: assert_same_numbers(fresh[k], stored[k], f"{where}.{k}")
    elif isinstance(stored, list) and stored and all(isinstance(x, (int, float)) or x is None for x in stored):
        f, s = (np.array([np.nan if x is None else x for x in v], dtype=float) for v in (fresh, stored))
        assert f.shape == s.shape and np.array_equal(np.isnan(f), np.isnan(s)), f"{where}: shape or NaNs differ"
        if (~np.isnan(s)).any(): assert_parity(f[~np.isnan(s)], s[~np.isnan(s)])
    elif isinstance(stored, list):
        assert len(fresh) == len(stored), f"{where}: lengths differ"
        for i, (a, b) in enumerate(zip(fresh, stored)): assert_same_numbers(a, b, f"{where}[{i}]")
    elif isinstance(stored, float): assert_parity(fresh, stored)
    else: assert fresh == stored, f"{where}: {fresh!r} against {stored!r}"


def assert_lines_match(meta: dict, repo: Path):
    "Every cited file:line of a fixture's `functions` holds, in the official copy, the text the fixture stores."
    for key, at in meta["functions"].items():
        path, line = at.rsplit(":", 1)
        assert (repo / path).read_text().splitlines()[int(line) - 1].strip() == meta["lines"][key], f"{key}: {at} moved"


def assert_fresh_fixture(folder: Path, name: str, meta: dict, stored):
    "The fixture a fresh run of the generator wrote in `folder` (`<name>.json`, `<name>.npz`) is the stored one: metadata equal, arrays by `assert_parity`."
    import json
    assert json.loads((folder / f"{name}.json").read_text()) == meta
    fresh = np.load(folder / f"{name}.npz")
    assert set(fresh) == set(stored)
    for k in stored: assert_parity(fresh[k], stored[k])
