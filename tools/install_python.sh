#!/bin/sh
# The Python half of `make install`: the book with its tools (`pip install -e ".[dev]"`) into the virtual environment
# whose python is $1, taking the PyTorch build this machine can use:
#   a machine with an NVIDIA GPU   PyPI's torch, the CUDA build (NVIDIA's libraries come with it)
#   a machine without one          PyTorch's CPU-only wheels from PyTorch's own index (no NVIDIA libraries); where that
#                                  index cannot be reached, PyPI's build after all, said in one line
# DML_BOOK_TORCH=cpu or =cuda chooses instead of the probe; DML_BOOK_CPU_INDEX names a mirror of the CPU index. A line
# says which build was taken, in every case; the sizes of each are in the README's install section.
#   tools/install_python.sh .venv/bin/python
set -eu
python="$1"
cpu_index="${DML_BOOK_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"   # a mirror of it may stand in
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
reachable() { "$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=15)" "$cpu_index" >/dev/null 2>&1; }
choice="${DML_BOOK_TORCH:-}"
if [ -z "$choice" ]; then if has_gpu; then choice=cuda; else choice=cpu; fi; fi
case "$choice" in
  cuda) echo "install: an NVIDIA GPU is here: PyPI's torch, the CUDA build"
        extra="" ;;
  cpu)  if reachable; then
            echo "install: no NVIDIA GPU here: PyTorch's CPU-only wheels from $cpu_index"
            extra="--extra-index-url $cpu_index"
        else
            echo "install: no NVIDIA GPU here, but $cpu_index cannot be reached: PyPI's torch build instead (its CUDA libraries, unused on this machine, take about 3 GB more)"
            extra=""
        fi ;;
  *)    echo "install: DML_BOOK_TORCH must be cpu or cuda (is: $choice)" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086  # $extra is empty or two words
"$python" -m pip install -q --disable-pip-version-check $extra -e ".[dev]"
"$python" -c "import torch; print('install: took torch', torch.__version__, '(CUDA', str(torch.version.cuda) + ')' if torch.version.cuda else '(CPU-only)')"
