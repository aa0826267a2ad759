# Developer entry points. `make test` is what CI runs (.ci/run).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup test lint sim-demo

setup:
	bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check oxygen_ros test

test: lint
	$(PY) -m pytest -q

# The closed loop in simulation: sim_node (gym-aloha) + the VLA node (tiny preset), timing report + contact sheet.
sim-demo: setup
	MUJOCO_GL=$${MUJOCO_GL:-egl} $(VENV)/bin/oxygen-ros sim-demo --out out/sim_demo
