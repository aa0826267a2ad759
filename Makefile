# Developer entry points. `make demo` is the main job, `make test` is what CI runs (.ci/run).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-alone test-fast lint demo sim-demo bench test-gpu gpu-check

# `make setup CUDA=1`: the CUDA build of the pinned torch and the `gpu` extra instead of the CPU build (make passes
# command-line variables to the script's environment). The targets below run setup without CUDA, which keeps the
# build .venv has; `make setup CUDA=0` goes back to the CPU build.
setup:
	bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check oxygen_ros test test_gpu launch

# The suite in two tiers: unit, and system (`-m system`: processes, DDS, the simulator, colcon). `make test` (what
# CI runs) is ruff, then both tiers in one pytest run on TEST_WORKERS pytest-xdist workers (the tests spend much of
# their time waiting on processes and DDS). The tests marked `alone`, which compare this machine's speed with itself
# minutes apart, run by themselves with `make test-alone`, not in `make test`: on a shared host their verdict follows
# the host's state (docs/testing.md). `make test-fast` is ruff and the unit tier. Each run ends with its wall time.
TEST_WORKERS ?= 2
define pytest_run
	@start=$$(date +%s); $(PY) -m pytest -q $(3) -m "$(2)"; status=$$?; \
	echo "$(1): $$(($$(date +%s) - start)) s"; exit $$status
endef

test: lint
	$(call pytest_run,unit and system tiers,not alone,-n $(TEST_WORKERS) --dist worksteal)

test-alone: setup
	$(call pytest_run,alone,alone)

test-fast: lint
	$(call pytest_run,unit tier,not system,-n $(TEST_WORKERS) --dist worksteal)

# Generated ALOHA episode -> rosbag2 -> tiny policy trained on it (cached in out/cache) -> replay into the VLA node
# loading that checkpoint + recorder -> report (out/demo).
demo: setup
	$(VENV)/bin/oxygen-ros demo --out out/demo

# The closed loop in simulation: sim_node (gym-aloha) + the VLA node (tiny preset), timing report + contact sheet.
sim-demo: setup
	MUJOCO_GL=$${MUJOCO_GL:-egl} $(VENV)/bin/oxygen-ros sim-demo --out out/sim_demo

# The OxyGen benchmark matrix, reduced (a few minutes on 2 CPU cores); see docs/benchmarks.md for the full command.
bench: setup
	$(VENV)/bin/oxygen-ros bench --preset small --quick --out out/bench

# On a machine with a CUDA GPU (no ROS, no setup: a GPU machine's own python3 will do): the CUDA test suite, which
# fails without a GPU, and the GPU checks and figures, the most telling first, within 9 minutes, into out/gpu and
# packed into out/gpu/gpu_check.tar.gz (ARCHIVE=DIR: the archive into DIR instead). The interpreter is the first of
# GPU_PY, .venv/bin/python and python3 that has every package the checks import and whose torch is a CUDA build that
# sees a device (scripts/gpu_python.sh says which); without one, one line naming what each lacks, and status 1.
GPU_PY ?=
ARCHIVE ?=
test-gpu:
	@py=$$(GPU_PY="$(GPU_PY)" bash scripts/gpu_python.sh) && $$py -m pytest -q test_gpu

gpu-check:
	GPU_PY="$(GPU_PY)" bash scripts/gpu_check.sh $(if $(ARCHIVE),--archive "$(ARCHIVE)") out/gpu
