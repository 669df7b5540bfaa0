"""Ship the experiments and the studies' summaries in the wheel: `build_py` copies `nbs/experiments` (notebooks and
published figures) and `params/` into `dml_book/_experiments/`, so that an installed wheel is enough for
`dml-book experiment NAME` (see `dml_book.results.experiments_dir`), and the summaries of the stored runs under
`results/` (each study's `study.json` and `study_time.json`, each run's `metrics.json` and `run.json`, and the
`diverged.json` of a run that diverged, which a verdict names, and the `infeasible.json` of a search that kept no setting
with its mechanism at work, which stands in a verdict's place; no logs,
checkpoints or data records) into `dml_book/_results/`, so that `dml_book.study` and `dml_book.findings` report the
verdicts from a plain install (see `dml_book.results.results_dir`). The copies exist only in the build: the repository
keeps one of each file. A symbolic link under `results/` (a file, or a folder on the way to it) ships nothing, in the
wheel or the sdist: its target may lie outside the repository, and a summary is a file the repository holds."""
import os, shutil
from pathlib import Path
from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
SHIPPED = {"nbs/experiments": "", "params": "params"}   # source folder -> folder under dml_book/_experiments
SUMMARIES = ("study.json", "study_time.json", "metrics.json", "run.json", "diverged.json", "infeasible.json", "plan.json", "deviations.json", "deviations_before_plans.json")   # the files of results/ that ship, by name


def linked(path, # a file of the source tree
           top=HERE, # the tree's root
          ) -> bool:
    "Whether `path`, or a folder between it and `top`, is a symbolic link."
    path = Path(os.path.abspath(path))
    return any(p.is_symlink() for p in [path, *path.parents] if p != top and top in p.parents)


def summaries(results: Path) -> list[Path]:
    "The files of `results` that ship (`SUMMARIES`, by name), none through a link: a walk that enters no linked folder and takes no linked file."
    out = []
    for folder, dirs, files in os.walk(results):   # followlinks=False: a linked folder is listed, never entered
        dirs[:] = sorted(d for d in dirs if not (Path(folder)/d).is_symlink())
        out += [Path(folder)/f for f in sorted(files) if f in SUMMARIES and not (Path(folder)/f).is_symlink()]
    return out


class SdistWithoutLinks(sdist):
    "sdist, leaving out every file under `results/` reached through a symbolic link (MANIFEST.in's patterns would follow it)."
    def make_release_tree(self, base_dir, files):
        kept = [f for f in files if not (Path(f).parts[:1] == ("results",) and linked(HERE/f))]
        for f in sorted(set(files) - set(kept)): print(f"setup.py: not shipped, a symbolic link: {f}")
        super().make_release_tree(base_dir, kept)


class BuildWithExperiments(build_py):
    "build_py, then the experiment notebooks, their published figures, the papers' parameter files and the studies' summaries."
    def run(self):
        super().run()
        target = Path(self.build_lib)/"dml_book"/"_experiments"
        shutil.rmtree(target, ignore_errors=True)
        for src, dst in SHIPPED.items():
            if not (HERE/src).is_dir(): raise FileNotFoundError(f"{HERE/src} is missing: build from a full source tree")
            shutil.copytree(HERE/src, target/dst, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "_*.ipynb", ".notest"))
        results = Path(self.build_lib)/"dml_book"/"_results"
        shutil.rmtree(results, ignore_errors=True)
        if not (HERE/"results").is_dir(): raise FileNotFoundError(f"{HERE/'results'} is missing: build from a full source tree")
        for f in summaries(HERE/"results"):
            dest = results/f.relative_to(HERE/"results")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)


setup(cmdclass={"build_py": BuildWithExperiments, "sdist": SdistWithoutLinks})
