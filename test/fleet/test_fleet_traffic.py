"""Robot -> GPU assignment: the MILP against brute force, and the two baselines."""

import itertools
import json

import numpy as np
import pytest

from oxygen_ros.evaluation.fleet.fleets import make_fleet, model_scales
from oxygen_ros.fleet.profile_table import synthetic_table
from oxygen_ros.fleet.traffic import (
    InfeasibleAssignment,
    RobotSpec,
    assign_even_split,
    assign_milp,
    assign_milp_relaxed,
    assign_one_model_per_gpu,
    load_assignment,
    per_frame_cost,
    robot_loads,
)


def brute_force(robots, loads, n_gpus, capacity=1.0, balance_slack=0.1):
    """The MILP's lexicographic objective by enumeration of every placement: the load cap B x (1 + slack)**k
    (B = max(mean GPU load, heaviest robot), smallest k >= 1 with a placement under it, at most capacity), then
    fewest model/GPU pairs under the cap, then lowest max load."""
    placements = []
    for gpus in itertools.product(range(n_gpus), repeat=len(robots)):
        per_gpu = np.zeros(n_gpus)
        for load, g in zip(loads, gpus):
            per_gpu[g] += load
        placements.append((len({(r.model_id, g) for r, g in zip(robots, gpus)}), per_gpu.max()))
    cap = min(capacity, max(sum(loads) / n_gpus, max(loads)) * (1 + balance_slack))
    while True:
        fits = [p for p in placements if p[1] <= cap + 1e-9]
        if fits or cap >= capacity:
            return min(fits) if fits else None
        cap = min(capacity, cap * (1 + balance_slack))


def check_feasible(assignment, robots, loads, capacity=1.0):
    assert set(assignment.gpu_of) == {r.robot_id for r in robots}  # every robot (all demand) placed once
    per_gpu = np.zeros(len(assignment.loads))
    for robot, load in zip(robots, loads):
        per_gpu[assignment.gpu_of[robot.robot_id]] += load
    np.testing.assert_allclose(per_gpu, assignment.loads)
    assert per_gpu.max() <= capacity + 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_milp_is_feasible_and_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n_robots, n_gpus = 7, 3
    robots = [RobotSpec(f"r{i}", f"m{int(rng.integers(3))}", 5.0, 0.1) for i in range(n_robots)]
    loads = rng.choice([0.15, 0.25, 0.4], size=n_robots)  # repeated values exercise the class aggregation
    best = brute_force(robots, loads, n_gpus)
    if best is None:
        with pytest.raises(InfeasibleAssignment):
            assign_milp(robots, loads, n_gpus)
        return
    assignment = assign_milp(robots, loads, n_gpus)
    check_feasible(assignment, robots, loads)
    assert assignment.pairs == best[0]
    assert assignment.max_load == pytest.approx(best[1], abs=1e-6)


def test_milp_concentrates_models_where_even_split_spreads_them():
    robots = [RobotSpec(f"r{i}", f"m{i % 3}", 5.0, 0.1) for i in range(9)]
    loads = np.full(9, 0.2)
    milp = assign_milp(robots, loads, 3)
    even = assign_even_split(robots, loads, 3)
    check_feasible(milp, robots, loads)
    assert milp.pairs == 3 and even.pairs == 9
    assert assign_one_model_per_gpu(robots, loads, 3).pairs == 3


def test_milp_spreads_load_when_there_are_fewer_models_than_gpus():
    """3 models on 4 GPUs: fewest pairs alone would use 3 GPUs and leave one idle; balancing first uses all four.
    (Whether that serves more robots than an even split is a simulator result, reported in the docs: over seeds
    with jitter it does not.)"""
    robots = [RobotSpec(f"r{i}", f"m{i % 3}", 5.0, 0.1) for i in range(12)]
    loads = np.full(12, 0.2)
    assignment = assign_milp(robots, loads, 4)
    check_feasible(assignment, robots, loads)
    assert assignment.max_load == pytest.approx(0.6) and min(assignment.loads) > 0
    assert assignment.pairs <= assign_even_split(robots, loads, 4).pairs


def test_one_model_per_gpu_gives_spare_gpus_to_the_heaviest_model():
    robots = [RobotSpec(f"a{i}", "a", 5.0, 0.1) for i in range(6)] + [RobotSpec("b0", "b", 5.0, 0.1)]
    assignment = assign_one_model_per_gpu(robots, np.full(7, 0.3), 3)
    assert {g for r, g in assignment.gpu_of.items() if r.startswith("a")} == {0, 1}
    assert assignment.gpu_of["b0"] == 2
    assert max(assignment.loads) == pytest.approx(0.9)


def test_infeasible_demand_raises_a_clear_error():
    robots = [RobotSpec(f"r{i}", "m0", 5.0, 0.1) for i in range(5)]
    with pytest.raises(InfeasibleAssignment, match="5 robots need 3.00 GPUs of load"):
        assign_milp(robots, np.full(5, 0.6), 2)
    with pytest.raises(InfeasibleAssignment, match="alone needs 1.50"):
        assign_milp(robots, np.array([0.1, 0.1, 1.5, 0.1, 0.1]), 4)
    with pytest.raises(InfeasibleAssignment, match="at most 1 models each"):
        mixed = [RobotSpec(f"r{i}", f"m{i}", 5.0, 0.1) for i in range(3)]
        assign_milp(mixed, np.full(3, 0.1), 2, max_models_per_gpu=1)
    relaxed = assign_milp_relaxed(robots, np.full(5, 0.6), 2)
    assert relaxed.capacity > 1.0 and relaxed.max_load <= relaxed.capacity + 1e-9


def test_loads_come_from_the_profile():
    lut = synthetic_table(model_scales(2))
    robots = make_fleet(20, 2, seed=1)
    loads = robot_loads(robots, lut, batch=4)
    cost = per_frame_cost(lut, "vla1", 4)
    assert 0 < cost < lut.latency("vla1", "vlm", 4) + lut.latency("vla1", "action", 4)
    assert all(
        load == pytest.approx(r.rate_hz * per_frame_cost(lut, r.model_id, 4))
        for r, load in zip(robots, loads)
    )
    assignment = assign_milp(robots, loads, 2)
    check_feasible(assignment, robots, loads)


def test_milp_scales_to_64_robots_8_models_4_gpus():
    lut = synthetic_table(model_scales(8))
    robots = make_fleet(64, 8, seed=0, rates_hz=(3.0, 5.0))
    loads = robot_loads(robots, lut)
    assignment = assign_milp(robots, loads, 4)
    check_feasible(assignment, robots, loads)
    assert assignment.pairs <= assign_even_split(robots, loads, 4).pairs


def test_fleet_assign_command_writes_the_file_fleet_nodes_read(tmp_path, capsys):
    from oxygen_ros.commands.fleet_assign import main
    from oxygen_ros.fleet.server import served_robots

    robots = [{"robot_id": f"robot{i}", "model_id": f"vla{i % 3}", "rate_hz": 5.0, "slo_s": 0.1 + 0.01 * i}
              for i in range(12)]
    (tmp_path / "fleet.json").write_text(json.dumps({"robots": robots}))
    synthetic_table(model_scales(3)).save(tmp_path / "lut.json")
    argv = ["--fleet", str(tmp_path / "fleet.json"), "--profile", str(tmp_path / "lut.json"), "--gpus", "4",
            "--seeds", "2"]
    assert main([*argv, "--out", str(tmp_path / "assignment.json")]) == 0
    data = load_assignment(tmp_path / "assignment.json")
    assert set(data["gpu_of"]) == {r["robot_id"] for r in robots} and set(data["gpu_of"].values()) == {0, 1, 2, 3}
    printed = capsys.readouterr().out
    assert data["method"] == "milp" and data["pairs"] >= 4 and "gpu 3" in printed and "SLO-safe at capacity" in printed
    # what a fleet node serves: its GPU's robots, each with its model and SLO
    mine = served_robots([], [], 1.0, data, gpu_index=0)
    assert mine and all(r.model_id == f"vla{int(r.robot_id[5:]) % 3}" for r in mine)
    assert all(r.slo_s == pytest.approx(0.1 + 0.01 * int(r.robot_id[5:])) for r in mine)
