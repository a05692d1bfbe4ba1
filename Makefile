# Two-command set-up: `make demo` runs the main job, `make test` runs the suite.
# Each bootstraps .venv itself; installs are pinned through constraints.txt so pip never
# resolves an unpinned torch (which would pull a multi-GB CUDA build).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
# Private IPython/Jupyter state: tests, demos and CI never touch ~/.ipython or ~/.jupyter.
STATE := $(CURDIR)/.state
export IPYTHONDIR := $(STATE)/ipython
export JUPYTER_CONFIG_DIR := $(STATE)/jupyter/config
export JUPYTER_DATA_DIR := $(STATE)/jupyter/data
export JUPYTER_RUNTIME_DIR := $(STATE)/jupyter/runtime
export JUPYTER_PLATFORM_DIRS := 1
# The key that signs checkpoint manifests (see workbench/parallel/checkpoint_trust.py).
export WORKBENCH_STATE_DIR := $(STATE)/workbench
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: state venv demo test test-fast lint lab notebooks bench gpu-check browser-test clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	mkdir -p $(IPYTHONDIR) $(JUPYTER_CONFIG_DIR) $(JUPYTER_DATA_DIR) $(JUPYTER_RUNTIME_DIR)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0 numpy
	$(PY) -m pip install -q -c constraints.txt -e '.[test,hf]'
	$(VENV)/bin/workbench kernel install --sys-prefix >/dev/null
	touch $(STAMP)

state:
	@mkdir -p $(IPYTHONDIR) $(JUPYTER_CONFIG_DIR) $(JUPYTER_DATA_DIR) $(JUPYTER_RUNTIME_DIR)

demo: $(STAMP) state
	$(VENV)/bin/workbench demo --out reports/demo

test: $(STAMP) state
	$(PY) -m ruff check workbench tests benchmarks notebooks/build.py
	$(PY) -m pytest -q -p no:cacheprovider tests
	@if ls notebooks/*.ipynb >/dev/null 2>&1; then \
	  $(PY) -m pytest -q -p no:cacheprovider --nbval --nbval-current-env --nbval-sanitize-with workbench/nbval/sanitize.cfg notebooks; \
	fi

# The unit tier: no engines, ranks or subprocesses (tests/conftest.py enforces it), < 1 min.
test-fast: $(STAMP) state
	WB_TEST_TIER=unit $(PY) -m pytest -q -p no:cacheprovider -m "not engines and not browser and not slow" tests

lint: $(STAMP)
	$(PY) -m ruff check workbench tests benchmarks notebooks/build.py
	$(PY) -m ruff format --check workbench tests benchmarks notebooks/build.py

# The "Python 3 (workbench)" kernel (workbench kernel install) is installed in the venv.
lab: $(STAMP) state
	$(VENV)/bin/workbench kernel install --sys-prefix >/dev/null
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 notebooks

# Rebuild the walkthrough notebooks from notebooks/src/ (executes each; see notebooks/build.py).
notebooks: $(STAMP) state
	$(PY) notebooks/build.py

# The peers the benchmarks compare against (the `bench` extra), pinned by constraints.txt.
$(BENCH_STAMP): $(STAMP) pyproject.toml constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e '.[test,hf,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) state
	$(PY) -m benchmarks.run_all

# The GPU checks (tests/gpu, tools/gpu_check.sh): on a GPU machine, installs into .venv-gpu
# (a CUDA build of the pinned torch; WHEELS=DIR: from a wheel directory, no index) and runs
# them, writing benchmarks/results/gpu/gpu-check.{json,md}. Without nvidia-smi (or with
# DRY_RUN=1): prints the install commands, and runs the checks in .venv, where they skip.
gpu-check: state
	@if [ -n "$(DRY_RUN)" ] || ! command -v nvidia-smi >/dev/null; then \
	  $(MAKE) --no-print-directory venv && tools/gpu_check.sh --dry-run; \
	else \
	  tools/gpu_check.sh $(if $(WHEELS),--wheels $(WHEELS)); \
	fi

clean:
	rm -rf $(VENV) $(STATE) reports .pytest_cache
