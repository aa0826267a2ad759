"""The fleet's processes ask OpenMP for passive waits before torch loads (`oxygen_ros/openmp.py`)."""

import os
import threading

from oxygen_ros import cli
from oxygen_ros.nodes import entry
from oxygen_ros.openmp import VARIABLE, prefer_passive_waits


def test_passive_waits_are_a_default_the_environment_can_override(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    prefer_passive_waits()
    assert os.environ[VARIABLE] == "PASSIVE"
    monkeypatch.setenv(VARIABLE, "ACTIVE")
    prefer_passive_waits()
    assert os.environ[VARIABLE] == "ACTIVE"


def _seen_at_import(monkeypatch, module) -> list:
    """What the wait policy was when `module` imported the node or command (none is really imported)."""
    seen = []

    class Stub:
        @staticmethod
        def main(*_):
            return 0

    def fake_import(name):
        seen.append((name, os.environ.get(VARIABLE)))
        return Stub

    monkeypatch.setattr(module.importlib, "import_module", fake_import)
    return seen


def test_the_fleet_node_and_fleet_commands_set_it_before_their_imports(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    # (this test process keeps its own signal handlers)
    monkeypatch.setattr(entry, "catch_stop_signals", threading.Event)
    monkeypatch.setattr(entry.signal, "signal", lambda *_: None)
    seen = _seen_at_import(monkeypatch, entry)
    assert entry.run("vla_node") == 0 and seen[-1] == ("oxygen_ros.nodes.vla_node", None)
    assert entry.run("fleet_node") == 0 and seen[-1] == ("oxygen_ros.nodes.fleet_node", "PASSIVE")
    monkeypatch.delenv(VARIABLE, raising=False)
    seen = _seen_at_import(monkeypatch, cli)
    assert cli.main(["fleet-sim"]) == 0 and seen[-1] == ("oxygen_ros.fleet.fleet_sim_cli", None)
    assert cli.main(["fleet-bench"]) == 0 and seen[-1] == ("oxygen_ros.fleet.real_bench", "PASSIVE")
