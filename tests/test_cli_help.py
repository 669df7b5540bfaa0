"""`dml-book train --help`, `pretrain --help` and `list` import no torch once what they show is cached (dml_book.cli._cached):
the cached answer is the one the package computes, and an edited package computes it anew."""
import os, re, shutil, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(argv, cache, path=ROOT):
    "`dml-book ARGV` in a fresh interpreter with the cache folder `cache`: its stdout, and whether torch was imported."
    code = ("import sys; from dml_book.cli import main\n"
            f"try: rc = main({list(argv)!r})\nexcept SystemExit as e: rc = e.code\n"
            "sys.stderr.write('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\nsys.exit(rc)")
    env = {**os.environ, "DML_BOOK_CACHE": str(cache), "PYTHONPATH": str(path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=path, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr.endswith("TORCH") and not r.stderr.endswith("NO-TORCH")


@pytest.mark.parametrize("argv", [["train", "--help"], ["pretrain", "--help"], ["list"]])
def test_help_and_list_import_no_torch_once_cached(argv, tmp_path):
    first, _ = run(argv, tmp_path)   # computes it (imports torch) and caches it
    again, torch_loaded = run(argv, tmp_path)
    assert not torch_loaded, argv
    assert again == first and len(first.splitlines()) > 10, argv


def test_cached_help_names_what_the_package_registers(tmp_path):
    run(["train", "--help"], tmp_path)
    text, torch_loaded = run(["train", "--help"], tmp_path)
    assert not torch_loaded and "--method" in text and "hdml: paper-triplet" in " ".join(text.split())
    listed, _ = run(["list", "methods"], tmp_path)
    assert [l.split()[0] for l in listed.splitlines()[1:]] == [l.split()[0] for l in run(["list", "methods"], tmp_path / "fresh")[0].splitlines()[1:]]


def test_an_edited_package_is_computed_anew(tmp_path):
    "On a copy of the package: a new registered loss appears in `list losses` although the old answer is cached."
    shutil.copytree(ROOT/"dml_book", tmp_path/"src"/"dml_book", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path/"cache"
    before, _ = run(["list", "losses"], cache, tmp_path/"src")
    with open(tmp_path/"src"/"dml_book"/"losses"/"__init__.py", "a") as f:
        f.write("\nfrom dml_book.registry import LOSSES\nfrom dml_book.losses.triplet import TripletLoss\n"
                "@LOSSES.register('toy_triplet')\nclass ToyTriplet(TripletLoss):\n    'A toy loss.'\n")
    after, torch_loaded = run(["list", "losses"], cache, tmp_path/"src")
    assert torch_loaded and "toy_triplet" in after and "toy_triplet" not in before
    assert len(list((cache/"cli").glob("lists-*.json"))) == 2


def test_help_and_readme_name_only_parameter_files_that_exist(tmp_path):
    "Every params/NAME.yaml that `experiment --help` or the README names is shipped in params/."
    text = run(["experiment", "--help"], tmp_path)[0] + (ROOT/"README.md").read_text()
    named = set(re.findall(r"params/[\w.-]+\.yaml", text))
    assert named and not [p for p in named if not (ROOT/p).is_file()], named
