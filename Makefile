# Developer entry points. `make test` is what CI runs (.ci/run).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup test lint

setup:
	bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check oxygen_ros test

test: lint
	$(PY) -m pytest -q
