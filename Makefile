# Two-command set-up: `make demo` runs the main job, `make test` runs the suite.
# Each bootstraps .venv itself; installs are pinned through constraints.txt so pip never
# resolves an unpinned torch (which would pull a multi-GB CUDA build).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
# The system-Python tier: a venv made from Debian 12's own interpreter (3.11.2), which is what
# a cluster node's user has; the tests whose behaviour depends on the interpreter run there,
# and only there: the venv tier leaves them out (each test runs in one tier, so the 2-node
# bed, the slowest part of the suite, runs once). Without that interpreter they run in the
# venv tier instead.
SYSTEM_PYTHON ?= /usr/bin/python3
SYSTEM_VENV ?= .venv-system
SYSTEM_STAMP := $(SYSTEM_VENV)/.installed
SYSTEM_TESTS := tests/parallel/test_metadata_versions.py tests/parallel/test_checkpoint.py \
  tests/parallel/test_checkpoint_trust.py tests/parallel/test_checkpoint_swap.py \
  tests/parallel/test_checkpoint_all_or_nothing.py tests/parallel/test_user_checkpoint.py \
  tests/session/test_training.py tests/cluster/test_faults.py tests/multinode
HAS_SYSTEM_PYTHON := $(shell test -x $(SYSTEM_PYTHON) && echo yes)
VENV_TIER_IGNORE := $(if $(HAS_SYSTEM_PYTHON),$(addprefix --ignore=,$(SYSTEM_TESTS)))
# Every pytest tier prints its 25 slowest tests: a new slow test shows in the next log.
DURATIONS := --durations=25
# The venv and unit tiers run on two pytest-xdist workers, a test file per worker at a time
# (--dist loadfile: a module's shared cluster is started once). Most of an engine test is
# waiting on other processes, so two workers overlap on two cores (benchmarks/README.md has
# the measured times). PYTEST_WORKERS=0 runs them in this process, one by one.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)
# Private IPython/Jupyter state: tests, demos and CI never touch ~/.ipython or ~/.jupyter.
STATE := $(CURDIR)/.state
export IPYTHONDIR := $(STATE)/ipython
export JUPYTER_CONFIG_DIR := $(STATE)/jupyter/config
export JUPYTER_DATA_DIR := $(STATE)/jupyter/data
export JUPYTER_RUNTIME_DIR := $(STATE)/jupyter/runtime
export JUPYTER_PLATFORM_DIRS := 1
# The key that signs checkpoint manifests (see workbench/parallel/checkpoint/trust.py).
export WORKBENCH_STATE_DIR := $(STATE)/workbench
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: state venv demo test test-lint test-venv test-notebooks test-fast test-system-python lint lab notebooks bench gpu-check browser-test clean

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

# `make test`: every tier, each to its end, then one line per tier with its wall time
# (tools/run_tiers.sh). The tiers can be run alone too.
TEST_TIERS := test-lint test-venv $(if $(HAS_SYSTEM_PYTHON),test-system-python) test-notebooks

test: $(STAMP) state
	@$(if $(HAS_SYSTEM_PYTHON),,echo "no $(SYSTEM_PYTHON): the system-Python tier's tests run in the venv tier")
	@tools/run_tiers.sh $(TEST_TIERS)

test-lint: $(STAMP)
	$(PY) -m ruff check workbench tests benchmarks notebooks/build.py

# The browser tests run after, one by one: what they assert is drawn on a page, and a
# second worker's load made one see a figure before its last update (a flaky wait, not a bug).
test-venv: $(STAMP) state
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(DURATIONS) $(VENV_TIER_IGNORE) --ignore=tests/browser tests; \
	  first=$$?; \
	  $(PY) -m pytest -q -p no:cacheprovider $(DURATIONS) tests/browser; \
	  test $$first -eq 0 -a $$? -eq 0

test-notebooks: $(STAMP) state
	@if ls notebooks/*.ipynb >/dev/null 2>&1; then \
	  $(PY) -m pytest -q -p no:cacheprovider $(DURATIONS) --nbval --nbval-current-env --nbval-sanitize-with workbench/nbval/sanitize.cfg notebooks; \
	fi

# `-e '.[test]'` resolves in a minute there only because constraints.txt pins a soupsieve
# that 3.11.2 can install (4.x needs >= 3.11.5; without a candidate pip backtracks for long).
$(SYSTEM_STAMP): pyproject.toml constraints.txt
	test -x $(SYSTEM_VENV)/bin/python || $(SYSTEM_PYTHON) -m venv $(SYSTEM_VENV)
	$(SYSTEM_VENV)/bin/python -m pip install -q -c constraints.txt torch==2.13.0 numpy
	$(SYSTEM_VENV)/bin/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(SYSTEM_STAMP)

test-system-python: $(SYSTEM_STAMP) state
	$(SYSTEM_VENV)/bin/python -m pytest -q -p no:cacheprovider $(DURATIONS) $(SYSTEM_TESTS)

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
	rm -rf $(VENV) $(SYSTEM_VENV) $(STATE) reports .pytest_cache
