"""How a node process starts: stop signals are caught on its first line, then the node is imported and run.

Importing a node takes seconds (torch, rclpy); a SIGINT or SIGTERM in that time, or at any later point, only sets
the process's stop event: no `KeyboardInterrupt` traceback, and a node told to stop before it was built exits 0
without building it. The handlers stay until the process ends (then the signals are ignored), so a second signal
during shutdown (`ros2 launch` sends more than one) changes nothing and the exit code stays 0. They are installed even when the parent started
the process with SIGINT ignored (a shell's background job), which Python would otherwise keep.

Every executable goes through `run`: the console scripts below, the colcon-installed scripts, and
`python -m oxygen_ros.nodes.<name>` (each node module hands over to `run` before its own imports). Only the standard
library is imported here.
"""

from __future__ import annotations

import importlib
import signal
import threading

from oxygen_ros.openmp import prefer_passive_waits, prefer_short_spins

PASSIVE_OPENMP_NODES = {"fleet_node"}  # several threads run torch at once (`oxygen_ros/openmp.py`)

_stop: threading.Event | None = None


def catch_stop_signals() -> threading.Event:
    """From now on, SIGINT and SIGTERM set the returned event (one per process)."""
    global _stop
    if _stop is None:
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        _stop = stop
    return _stop


def process_stop() -> threading.Event | None:
    """The process's stop event if `catch_stop_signals` ran, else None (e.g. a node's main called in a test)."""
    return _stop


def run(node: str) -> int:
    """Catch the stop signals, import `oxygen_ros.nodes.<node>` and return its `main()`'s exit code."""
    stop = catch_stop_signals()
    if node in PASSIVE_OPENMP_NODES:  # before torch is imported (`oxygen_ros/openmp.py`)
        prefer_passive_waits()
    else:
        prefer_short_spins()
    try:
        main = importlib.import_module(f"oxygen_ros.nodes.{node}").main
        return 0 if stop.is_set() else main()
    finally:
        # The process is ending. Ignored from here: Python's finalization would otherwise put back the default
        # action (terminate), and a signal arriving in that last stretch would turn the exit code into -2.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


# Console scripts (setup.py): one per node executable.
def vla_node() -> int:
    return run("vla_node")


def replay_node() -> int:
    return run("replay_node")


def record_node() -> int:
    return run("record_node")


def sim_node() -> int:
    return run("sim_node")


def fleet_node() -> int:
    return run("fleet_node")


def scripted_policy() -> int:
    return run("scripted_policy")


def velocity_watchdog() -> int:
    return run("velocity_watchdog")
