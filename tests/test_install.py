"""`make install` takes the PyTorch build the machine can use (tools/install_python.sh): PyTorch's CPU-only wheels
without an NVIDIA GPU, PyPI's CUDA build with one, PyPI's after all where the CPU index cannot be reached, each said
in one line. The script is run against a stand-in python that records what pip was asked, so no package is installed."""
import os, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT/"tools"/"install_python.sh"
FAKE = """#!/bin/sh
# a stand-in python: the index probe answers as FAKE_REACHABLE says, pip records its arguments, torch reports FAKE_CUDA
case "$*" in
  *urlopen*) [ "$FAKE_REACHABLE" = 1 ]; exit $? ;;
  "-m pip"*) echo "$*" > "$FAKE_LOG" ;;
  *torch*)   echo "install: took torch 2.14.1 $FAKE_BUILD" ;;
esac
"""


def _install(tmp_path, reachable: bool, gpu: bool, **env):
    tmp_path = Path(tmp_path)/f"call{len(list(Path(tmp_path).iterdir()))}"; (tmp_path/"bin").mkdir(parents=True)
    python = tmp_path/"bin"/"python"; python.write_text(FAKE); python.chmod(0o755)
    if gpu:
        smi = tmp_path/"bin"/"nvidia-smi"; smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200'\n"); smi.chmod(0o755)
    log = tmp_path/"pip.log"
    path = f"{tmp_path/'bin'}:/usr/bin:/bin"   # no real nvidia-smi on this PATH
    out = subprocess.run(["sh", str(SCRIPT), str(python)], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": path, "FAKE_REACHABLE": "1" if reachable else "0", "FAKE_LOG": str(log), "FAKE_BUILD": "", **env})
    return out, (log.read_text() if log.exists() else "")


def test_a_machine_without_a_gpu_takes_the_cpu_only_wheels(tmp_path):
    out, pip = _install(tmp_path, reachable=True, gpu=False)
    assert out.returncode == 0, out.stderr
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in pip and '-e .[dev]' in pip
    assert "CPU-only wheels" in out.stdout.splitlines()[0]


def test_an_unreachable_cpu_index_falls_back_to_pypi_and_says_so_in_one_line(tmp_path):
    out, pip = _install(tmp_path, reachable=False, gpu=False)
    assert out.returncode == 0 and "--extra-index-url" not in pip and "-e .[dev]" in pip
    said = [l for l in out.stdout.splitlines() if "cannot be reached" in l]
    assert len(said) == 1 and "PyPI's torch build instead" in said[0]


def test_a_machine_with_an_nvidia_gpu_takes_pypis_cuda_build(tmp_path):
    out, pip = _install(tmp_path, reachable=True, gpu=True)
    assert out.returncode == 0 and "--extra-index-url" not in pip and "CUDA build" in out.stdout


def test_the_choice_can_be_forced_and_a_bad_one_is_one_line(tmp_path):
    out, pip = _install(tmp_path, reachable=True, gpu=True, DML_BOOK_TORCH="cpu")
    assert "--extra-index-url" in pip
    out, pip = _install(tmp_path, reachable=True, gpu=False, DML_BOOK_CPU_INDEX="file:///srv/mirror/cpu")
    assert "--extra-index-url file:///srv/mirror/cpu" in pip
    out, _ = _install(tmp_path, reachable=True, gpu=False, DML_BOOK_TORCH="rocm")
    assert out.returncode == 2 and out.stderr.strip() == "install: DML_BOOK_TORCH must be cpu or cuda (is: rocm)"


def test_the_makefile_installs_through_the_script():
    make = (ROOT/"Makefile").read_text()
    assert "tools/install_python.sh $(BIN)/python" in make and "pip install" not in make.split("$(STAMP): pyproject.toml")[1].split("demo:")[0]
