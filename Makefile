# Two commands set up and run everything on a fresh machine:
#   make demo   train and evaluate on built-in data (no download)
#   make test   every test: package/notebook sync, nbdev-test over all notebooks, pytest tests/
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export MPLBACKEND ?= Agg
export PYTHONHASHSEED ?= 0

.PHONY: demo test install readme docs preview clean

# The install step (`make test` runs it first): the Python packages in .venv (tools/install_python.sh: the CPU-only torch
# wheels on a machine without an NVIDIA GPU, PyPI's CUDA build on one with; one line says which it took), then the
# Debian packages the tests use (tools/system_packages.sh: installed with apt-get when run as root, else the command is
# printed and the tests that need them are skipped, naming it). `make demo` needs the Python packages only.
install: $(STAMP)
	@sh tools/system_packages.sh

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || python3 -m venv $(VENV)
	@sh tools/install_python.sh $(BIN)/python
	@touch $@

demo: $(STAMP)
	$(BIN)/dml-book train --dataset glyphs --loss triplet --epochs 5 --out runs/demo

# Two notebooks, or two test files, run at once on two cores: one thread each (oversubscribed OpenMP threads spin and
# crawl). pytest runs one worker per core (pytest-xdist), a whole file per worker so that module fixtures run once.
test: export OMP_NUM_THREADS = 1
# nbdev-test runs on an identical copy of nbs/ with --save (tools/preview.py), so the chapters execute once and their
# outputs build the offline preview; the experiment notebooks run under papermill; pytest then checks both.
test: install
	$(BIN)/python tools/preview.py --out _preview
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=15 tests/

# The navigation from the chapters' own titles and summaries and the verdicts from results/ (nbs/sidebar.yml, the home
# page's first-screen and methods tables, README.md from the home page: tools/navigation.py), then the saved outputs: every cell tagged
# `results` (front page, method chapters' results, experiment pages) keeps what a fresh execution of the book shows, so
# the book reads on a repository viewer (tools/saved_outputs.py, from the preview). Run it after a study or a tuning
# run, or after changing a results section; `make test` checks that the saved outputs are current. The navigation runs
# again last, since the README's forest plot is the home page's saved figure.
readme: $(STAMP)
	$(BIN)/python tools/navigation.py
	$(BIN)/python tools/saved_outputs.py --write
	$(BIN)/python tools/navigation.py

docs: $(STAMP)
	$(BIN)/nbdev-docs

# Offline HTML preview of the executed book without Quarto: _preview/site/index.html
preview: $(STAMP)
	$(BIN)/python tools/preview.py --if-stale --out _preview

clean:
	rm -rf _docs _proc _preview runs
