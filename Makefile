# The two commands of the README:
#   make demo   set up (SQLite ledger, local executor) and run the main job on this machine
#   make test   set up, start the services the tests use, and run the whole suite
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS_TEST ?= train,dev,cpu-rollout

.PHONY: test demo setup services
test:
	tools/install.sh $(EXTRAS_TEST)
	$(PY) tools/fetch_corpus.py
	tools/services.sh
	$(PY) -m pytest

demo:
	tools/install.sh train
	$(PY) tools/fetch_corpus.py
	tools/demo.sh
