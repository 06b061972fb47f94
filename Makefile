# The two commands of the README:
#   make demo   set up (SQLite ledger, local executor) and run the main job on this machine
#   make test   set up, start the services the tests use, and run the whole suite
# and for a developer:
#   make test-fast   the same, without the tests marked slow (under a minute on 2 cores)
# The suite runs on PYTEST_WORKERS pytest-xdist workers (more than the 2 cores: many tests wait on
# Slurm, timeouts or child processes); setup.cfg sets --dist loadgroup, so tests sharing a costly
# module fixture stay on one worker, and tests on the dev Slurm take turns on it (tests/conftest.py).
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS_TEST ?= train,dev,cpu-rollout
PYTEST_WORKERS ?= 6

.PHONY: test test-fast demo setup services
test: setup services
	$(PY) -m pytest -n $(PYTEST_WORKERS)

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
