"""Shared test setup: ROS 2 isolation (log dir, localhost-only discovery, a reserved DDS domain per test) and the
test tiers (`system`: processes, DDS, the simulator, colcon; everything else is the unit tier, `make test-fast`)."""

import itertools
import os
import sys
import tempfile
from pathlib import Path

import pytest
from domain_coordinator import domain_id

# Set before any test imports rclpy: logs go to a temp dir, discovery stays on this machine.
os.environ.setdefault("ROS_LOG_DIR", tempfile.mkdtemp(prefix="oxygen_ros_test_logs_"))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault("HOME", tempfile.gettempdir())
# One OpenMP thread per process (this one and its children), set before torch loads, and workers that sleep
# instead of spinning where a test asks for more (thread budgets). The tests' models are tiny; on a machine whose
# cores are busy, two spinning OpenMP workers per process made a 6 s test take over 4 minutes.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One user cache for the tests, apart from the user's own and kept between runs and tiers: the stand-in tokenizer is
# trained and the CPU kernel compiled (about 10 s) once, by the first test or node process that needs them, and
# reused by every other one (child processes inherit it; files are named by their inputs and written atomically, so
# runs side by side share it safely). A test about the cache itself points XDG_CACHE_HOME elsewhere.
os.environ["XDG_CACHE_HOME"] = os.path.join(tempfile.gettempdir(), f"oxygen_ros_test_cache_{os.getuid()}")

# The tests sit in one folder per layer of the package (docs/testing.md: the map). A test module may take helpers
# from another folder's by module name (`from test_vla_node_ros import Spinner`), so every test folder is on the
# import path whichever folder or file pytest is given; this folder, with the shared helpers, is there already (pytest
# puts a conftest's folder first). Test module names are unique across folders (test/product/test_layout.py).
sys.path += [str(folder) for folder in sorted(Path(__file__).resolve().parent.iterdir())
             if folder.is_dir() and any(folder.glob("test_*.py")) and str(folder) not in sys.path]

from engine_fixtures import tokenizer  # noqa: E402, F401 - the fixture, for every test here

# Candidates for domain_coordinator, which maps them into 1..100 (ids above 101 put DDS ports into the ephemeral
# range). One counter for the whole run: consecutive tests get different domains, so nothing a finished test left
# behind can be discovered by the next one. Under pytest-xdist (`make test` runs two workers) each worker counts from
# its own part of the range (gw0 from 1, gw1 from 51), so a worker does not take the domain the other one has just
# let go; a domain still held is skipped either way.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
_workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
_domain_candidates = itertools.count(int(_worker.removeprefix("gw") or 0) * 100 // _workers)
# Tests that run a node's `main` in their own process to see it refuse to start take no domain fixture: they run on
# one reserved for this process (each worker its own) for the whole run, not on the shell's (0 when unset), which the
# other worker, or a ROS graph of the user's, would share. Children started with `os.environ` get it too.
_process_domain = domain_id(selector=lambda: next(_domain_candidates) % 100 + 1)
os.environ["ROS_DOMAIN_ID"] = str(_process_domain.__enter__())  # held (its port bound) until this process exits


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """The tests' user cache (above), for node processes given their environment explicitly."""
    return Path(os.environ["XDG_CACHE_HOME"])


@pytest.fixture
def ros_domain_id():
    """A DDS domain reserved for this test: domain_coordinator holds a port bound for it until the test ends, so
    no other test of this run, nor of another run on this machine, uses it meanwhile."""
    with domain_id(selector=lambda: next(_domain_candidates) % 100 + 1) as domain:
        yield domain


@pytest.fixture
def ros_env(ros_domain_id) -> dict:
    """Environment for child processes that must share the test's DDS domain."""
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(ros_domain_id)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def ros_context(ros_domain_id):
    """An initialized rclpy context of its own on the test's domain, shut down afterwards."""
    import rclpy

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    yield context
    context.try_shutdown()
    context.destroy()  # frees its DDS participant once its nodes are gone; shutdown alone keeps it


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items):
    """Every test that needs a DDS domain is a system test; tests that start processes, the simulator or a build
    without DDS carry `@pytest.mark.system` themselves. The system tests run first: they are the suite's longest,
    and on parallel workers (`make test`) the short unit tests then fill in at the end."""
    for item in items:
        if "ros_domain_id" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.system)
    items.sort(key=lambda item: item.get_closest_marker("system") is None)  # stable: files keep their order
