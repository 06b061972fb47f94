# The two commands of the README:
#   make demo   set up (SQLite ledger, local executor) and run the main job on this machine
#   make test   set up, start the services the tests use, and run the whole suite
# and for a developer:
#   make test-fast   the same, without the tests marked slow (under a minute on 2 cores)
#   make test-repeat N=5 K=EXPR [BUSY=3] [WORKERS=2]   run the tests matching K N times (flake hunting),
#                    beside BUSY CPU-bound processes; each failure with its seed and log (tools/test_repeat.sh)
# `make test` keeps the time budget (tests/support/budget.py): it prints the ten slowest tests with
# their slow_reason and fails when the suite's CPU time is over cpu_budget_seconds, or the machine's
# (every process, Slurm jobs included) over machine_cpu_budget_seconds (setup.cfg).
# The suite runs on PYTEST_WORKERS pytest-xdist workers (more than the 2 cores: many tests wait on
# Slurm, timeouts or child processes); setup.cfg sets --dist loadgroup, so tests sharing a costly
# module fixture stay on one worker, and tests on the dev Slurm take turns on it (tests/conftest.py).
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS_TEST ?= train,dev,cpu-rollout
PYTEST_WORKERS ?= 6

N ?= 5
K ?=
BUSY ?= 0
WORKERS ?=

.PHONY: test test-fast test-repeat demo setup services
test: setup services
	$(PY) -m pytest -n $(PYTEST_WORKERS) --cpu-budget

test-repeat: setup services
	@test -n "$(K)" || { echo "make test-repeat: say which tests, K=EXPR (a pytest -k expression)"; exit 2; }
	PY=$(PY) tools/test_repeat.sh $(N) '$(K)' $(BUSY) '$(WORKERS)'

test-fast: setup services
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not slow"

setup:
	tools/install.sh $(EXTRAS_TEST)
	$(PY) tools/fetch_corpus.py

services:
	tools/services.sh

demo:
	tools/install.sh train
	$(PY) tools/fetch_corpus.py
	tools/demo.sh
