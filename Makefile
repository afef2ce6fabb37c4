# Two commands do all the set-up on a fresh machine:
#   make repro   build .venv if missing, print each stage's estimate on this machine, then run the whole study (dvc repro)
#   make test    build .venv if missing, then run the whole test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
# make test's workers (pytest-xdist): one per core; `make test JOBS=0` runs the tests in this process
JOBS ?= auto

.PHONY: repro test test-fast lint lab env clean-env

env: $(STAMP)

$(STAMP): requirements.lock requirements-nodeps.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==25.3
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -c "import fbgemm_gpu, torchrec, autoshard"
	touch $(STAMP)

repro: $(STAMP)
	$(BIN)/python -m autoshard.pipeline.budget
	$(BIN)/dvc repro

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q

lint: $(STAMP)
	$(BIN)/ruff check src tests notebooks

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks

clean-env:
	rm -rf $(VENV)
