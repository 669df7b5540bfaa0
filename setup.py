"""Ship the experiments in the wheel: `build_py` copies `nbs/experiments` (notebooks and published figures) and `params/`
into `dml_book/_experiments/`, so that `pip install dml_book` is enough for `dml-book experiment NAME` (see
`dml_book.results.experiments_dir`). The copies exist only in the build: the repository keeps one of each file."""
import shutil
from pathlib import Path
from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED = {"nbs/experiments": "", "params": "params"}   # source folder -> folder under dml_book/_experiments


class BuildWithExperiments(build_py):
    "build_py, then the experiment notebooks, their published figures and the papers' parameter files."
    def run(self):
        super().run()
        target = Path(self.build_lib)/"dml_book"/"_experiments"
        shutil.rmtree(target, ignore_errors=True)
        for src, dst in SHIPPED.items():
            if not (HERE/src).is_dir(): raise FileNotFoundError(f"{HERE/src} is missing: build from a full source tree")
            shutil.copytree(HERE/src, target/dst, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__", "_*.ipynb", ".notest"))


setup(cmdclass={"build_py": BuildWithExperiments})
