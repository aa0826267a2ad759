"""Planning with measured figures: the co-run slowdown a table measured is the guard and the interference every
planner uses, and one design default everywhere."""

import json

import pytest

from oxygen_ros.evaluation.fleet.simulator import SimConfig
from oxygen_ros.fleet.co_run import (
    ASSUMED_INTERFERENCE,
    DEFAULT_GUARD,
    interference_source,
    planning_guard,
    planning_interference,
)
from oxygen_ros.fleet.designs import DEFAULT_DESIGN
from oxygen_ros.fleet.profile_table import ProfileTable, synthetic_table

LUT = synthetic_table({"m0": 1.0, "m1": 1.0})


def measured(slowdown: float) -> ProfileTable:
    return ProfileTable(dict(LUT.entries), {"source": "measured", "co_run_slowdown": slowdown})


def test_the_measured_co_run_slowdown_is_the_guard_and_the_interference():
    assert planning_interference(measured(1.47)) == 1.47 and planning_guard(measured(1.47)) == 1.47
    assert planning_guard(measured(1.02)) == DEFAULT_GUARD  # the guard never drops below the configured one
    assert planning_guard(measured(1.02), guard=1.0) == 1.02
    assert planning_interference(LUT) == ASSUMED_INTERFERENCE and planning_guard(LUT) == DEFAULT_GUARD
    assert "assumed" in interference_source(LUT) and "measured 1.470" in interference_source(measured(1.47))
    with pytest.raises(ValueError, match="co_run_slowdown"):
        planning_interference(measured(0.5))
    with pytest.raises(ValueError, match=">= 1"):
        planning_guard(LUT, guard=0.9)


def test_one_design_default_everywhere():
    import yaml

    from oxygen_ros.commands.fleet_assign import build_parser
    from oxygen_ros.nodes.fleet_node import DEFAULTS

    config = yaml.safe_load(open("config/fleet.yaml"))["/**"]["ros__parameters"]
    args = build_parser().parse_args(["--fleet", "config/fleet.yaml", "--profile", "config/fleet.yaml", "--gpus", "1",
                                      "--out", "x"])
    assert DEFAULT_DESIGN == DEFAULTS["design"] == config["design"] == args.design == SimConfig().design
    assert DEFAULTS["guard"] == config["guard"] == args.guard == DEFAULT_GUARD


def test_fleet_assign_plans_with_the_tables_measured_slowdown(tmp_path, capsys):
    from oxygen_ros.commands.fleet_assign import main

    robots = [{"robot_id": f"robot{i}", "model_id": "m0", "rate_hz": 5.0, "slo_s": 0.2} for i in range(4)]
    (tmp_path / "fleet.json").write_text(json.dumps({"robots": robots}))
    measured(1.3).save(tmp_path / "lut.json")
    argv = ["--fleet", str(tmp_path / "fleet.json"), "--profile", str(tmp_path / "lut.json"), "--gpus", "2",
            "--seeds", "1", "--design", "robion", "--out", str(tmp_path / "a.json")]
    assert main(argv) == 0
    assert "interference measured 1.300 (the table's co-run slowdown), guard 1.300, design robion" in \
        capsys.readouterr().out
