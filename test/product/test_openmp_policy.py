"""The fleet's processes ask OpenMP for passive waits before torch loads, the others for short spins
(`oxygen_ros/openmp.py`)."""

import os
import threading

from oxygen_ros.commands import cli
from oxygen_ros.nodes import entry
from oxygen_ros.openmp import SHORT_SPINS, SPIN_VARIABLE, VARIABLE, prefer_passive_waits, prefer_short_spins


def test_passive_waits_are_a_default_the_environment_can_override(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    prefer_passive_waits()
    assert os.environ[VARIABLE] == "PASSIVE"
    monkeypatch.setenv(VARIABLE, "ACTIVE")
    prefer_passive_waits()
    assert os.environ[VARIABLE] == "ACTIVE"


def test_short_spins_unless_the_environment_sets_waits_or_spins(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.delenv(SPIN_VARIABLE, raising=False)
    prefer_short_spins()
    assert os.environ[SPIN_VARIABLE] == SHORT_SPINS
    monkeypatch.setenv(SPIN_VARIABLE, "300000")
    prefer_short_spins()
    assert os.environ[SPIN_VARIABLE] == "300000"
    monkeypatch.delenv(SPIN_VARIABLE)
    monkeypatch.setenv(VARIABLE, "ACTIVE")  # a policy asked for: its own spin count
    prefer_short_spins()
    assert SPIN_VARIABLE not in os.environ


def _seen_at_import(monkeypatch, module) -> list:
    """What the wait policy was when `module` imported the node or command (none is really imported)."""
    seen = []

    class Stub:
        @staticmethod
        def main(*_):
            return 0

    def fake_import(name):
        seen.append((name, os.environ.get(VARIABLE), os.environ.get(SPIN_VARIABLE)))
        return Stub

    monkeypatch.setattr(module.importlib, "import_module", fake_import)
    return seen


def _clear(monkeypatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.delenv(SPIN_VARIABLE, raising=False)


def test_each_node_and_command_sets_its_waits_before_its_imports(monkeypatch):
    _clear(monkeypatch)
    # (this test process keeps its own signal handlers)
    monkeypatch.setattr(entry, "catch_stop_signals", threading.Event)
    monkeypatch.setattr(entry.signal, "signal", lambda *_: None)
    seen = _seen_at_import(monkeypatch, entry)
    assert entry.run("vla_node") == 0 and seen[-1] == ("oxygen_ros.nodes.vla_node", None, SHORT_SPINS)
    _clear(monkeypatch)
    assert entry.run("fleet_node") == 0 and seen[-1] == ("oxygen_ros.nodes.fleet_node", "PASSIVE", None)
    _clear(monkeypatch)
    seen = _seen_at_import(monkeypatch, cli)
    assert cli.main(["bench"]) == 0 and seen[-1] == ("oxygen_ros.evaluation.bench.oxygen_bench", None, SHORT_SPINS)
    _clear(monkeypatch)
    assert cli.main(["fleet-bench"]) == 0 and seen[-1] == ("oxygen_ros.commands.fleet_bench", "PASSIVE", None)
