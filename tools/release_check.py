"""Run the release workflow's build job (.github/workflows/release.yml) on this machine, from a clean clone, up to the
upload: each `run:` step as the workflow writes it, in order, with `python` a fresh venv (as actions/setup-python gives)
and GITHUB_WORKSPACE the clone. Steps that run only on a tag (`if:`) are skipped and named; the job stops at the
first `uses:` step after the checks (the upload).

    python tools/release_check.py                 # clone HEAD of this repository into a temporary folder and run
    python tools/release_check.py --keep DIR      # ... in DIR (a new folder), kept afterwards (dist/ holds the sdist and the wheel)

The workflow's venv for the wheel (`/tmp/wheel-env` on the runner) is made here inside the check's own folder: nothing
outside the folders this check makes is written or deleted.

pip's settings come from the environment as usual: where the CPU-only PyTorch index cannot be reached, a constraint
file (PIP_CONSTRAINT) can pin torch to a CPU build that pip finds elsewhere (a local wheel in PIP_FIND_LINKS).
"""
from __future__ import annotations
import argparse, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT/".github"/"workflows"/"release.yml"


def build_steps(workflow: Path = WORKFLOW) -> list[dict]:
    "The build job's steps up to the first `uses:` after a `run:` (the upload): actions/checkout and setup-python aside."
    import yaml
    steps, out, ran = yaml.safe_load(workflow.read_text())["jobs"]["build"]["steps"], [], False
    for s in steps:
        if "uses" in s and ran: break
        if "run" in s: out.append(s); ran = True
    return out


RUNNER_VENV = "/tmp/wheel-env"   # the workflow's path for the wheel's venv, a fresh runner's; here a folder of the check's own


def work_folder(keep: str | None) -> Path:
    "The check's folder: `keep`, made new (a path that exists, folder or file, is refused in one line), else a new temporary one."
    if keep is None: return Path(tempfile.mkdtemp(prefix="release-check-"))
    work = Path(keep)
    if work.exists() or work.is_symlink():
        sys.exit(f"release_check: --keep {keep}: {'a folder' if work.is_dir() else 'a file'} of that name exists; name a new folder "
                 "(the check clones into it and deletes nothing it did not make)")
    try: work.mkdir(parents=True)
    except OSError as e: sys.exit(f"release_check: --keep {keep}: cannot make the folder ({e.strerror})")
    return work


def local_step(run: str, work: Path) -> str:
    "A step's script with the runner's paths made the check's own: the wheel's venv inside `work`, never the system's `/tmp/wheel-env`."
    return run.replace(RUNNER_VENV, str(work/"wheel-env"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", help="clone into this folder (new) and keep it")
    args = ap.parse_args(argv)
    work = work_folder(args.keep)
    clone = work/"clone"
    for cmd, what in (([ "git", "clone", "-q", "--no-local", str(ROOT), str(clone)], "clone the repository"),
                      ([sys.executable, "-m", "venv", str(work/"python")], "make the build's venv")):   # actions/setup-python: a python of its own
        r = subprocess.run(cmd)
        if r.returncode: sys.exit(f"release_check: could not {what} (exit {r.returncode}) in {work}")
    py = work/"python"
    env = {**os.environ, "PATH": f"{py/'bin'}:{os.environ['PATH']}", "GITHUB_WORKSPACE": str(clone), "GITHUB_REF": "refs/heads/main"}
    for k in ("PYTHONPATH", "VIRTUAL_ENV"): env.pop(k, None)
    for s in build_steps():
        name = s.get("name") or s["run"].strip().splitlines()[0]
        if "if" in s: print(f"release_check: skipped (only {s['if']}): {name}"); continue
        print(f"release_check: {name}", flush=True); t0 = time.time()
        r = subprocess.run(["bash", "-e", "-c", local_step(s["run"], work)], cwd=clone, env=env)
        if r.returncode: sys.exit(f"release_check: the step '{name}' failed (exit {r.returncode}); the clone is in {clone}")
        print(f"release_check: ok in {time.time() - t0:.0f} s", flush=True)
    print(f"release_check: every step before the upload passed; dist/: " + ", ".join(sorted(p.name for p in (clone/'dist').iterdir())))
    if not args.keep: shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__": main()
