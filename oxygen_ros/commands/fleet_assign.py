"""``oxygen-ros fleet-assign``: place a fleet's robots on GPUs with the traffic controller and write the JSON
that each fleet server node reads (``assignment_file``, with its own ``gpu_index``).

Fleet file: ``{"robots": [{"robot_id": "robot1", "model_id": "a", "rate_hz": 10, "slo_s": 0.1}, ...]}``.
Assignment file: ``{"method", "gpus", "gpu_of": {robot: gpu}, "model_of": {robot: model}, "slo_of": {robot:
seconds}, "loads", "pairs", "capacity", "load_cap"}``; a fleet node serves the robots of its GPU with their models
and SLOs from it.

Loads (``--loads``): ``slo_safe`` (default) gives each robot 1 / the robots like it (model, rate, SLO) that one
device serves at 98 % in the simulator on the profiled table, then checks the MILP placement in the simulator and
lowers the capacity until every device reaches 98 % (`capacity.place_slo_safe`); ``throughput`` is the older
rate x lockstep cost at batch 4, which does not see SLOs (98 % was reached near load 0.6 with it).

Both plan with the table's measured figures, as the fleet nodes serve (`fleet.co_run`): co-running stages slow down
by the table's measured co-run slowdown (``meta["co_run_slowdown"]``; a table without one, such as the synthetic
one, is assumed at 1.05 and the command says so), and the lockstep's guard is ``--guard`` raised to it. The design
defaults to the nodes' (`designs.DEFAULT_DESIGN`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from oxygen_ros.command_line import CommandParser, existing_file
from oxygen_ros.fleet.capacity import SloSafeLoads, place_slo_safe
from oxygen_ros.fleet.co_run import DEFAULT_GUARD, interference_source, planning_guard, planning_interference
from oxygen_ros.fleet.designs import DEFAULT_DESIGN, DESIGNS
from oxygen_ros.fleet.profile_table import ProfileTable
from oxygen_ros.fleet.simulator import SimConfig
from oxygen_ros.fleet.traffic import (
    Assignment,
    RobotSpec,
    assign_even_split,
    assign_milp_relaxed,
    assign_one_model_per_gpu,
    robot_loads,
)

METHODS = {"milp": assign_milp_relaxed, "even": assign_even_split, "one_model_per_gpu": assign_one_model_per_gpu}


def load_fleet(path: str | Path) -> list[RobotSpec]:
    data = json.loads(Path(path).read_text())
    return [RobotSpec(r["robot_id"], r["model_id"], float(r["rate_hz"]), float(r["slo_s"])) for r in data["robots"]]


def assignment_to_dict(assignment: Assignment, robots: Sequence[RobotSpec]) -> dict:
    return {
        "method": assignment.method,
        "gpus": len(assignment.loads),
        "gpu_of": dict(assignment.gpu_of),
        "model_of": dict(assignment.model_of),
        "slo_of": {r.robot_id: r.slo_s for r in robots},
        "loads": list(assignment.loads),
        "pairs": assignment.pairs,
        "capacity": assignment.capacity,
        "load_cap": assignment.load_cap,
    }


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser("fleet-assign", __doc__)
    p.add_argument("--fleet", required=True, type=existing_file, help="fleet JSON (robots with model, rate and SLO)")
    p.add_argument("--profile", required=True, type=existing_file, help="LUT JSON (fleet-profile)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs to place the robots on")
    p.add_argument("--method", choices=sorted(METHODS), default="milp", help="placement method")
    p.add_argument("--capacity", type=float, default=1.0, help="MILP per-GPU load limit (throughput loads)")
    p.add_argument("--loads", choices=("slo_safe", "throughput"), default="slo_safe",
                   help="a robot's load: from simulated robots-at-98%% per device (slo_safe) or from throughput")
    # the serving designs (fleet-sim's baselines omni and intergpu are comparisons, not placements)
    p.add_argument("--design", choices=sorted(DESIGNS), default=DEFAULT_DESIGN,
                   help="device design the nodes serve with (slo_safe loads); default: %(default)s, as fleet_node's")
    p.add_argument("--guard", type=float, default=DEFAULT_GUARD,
                   help="the lockstep's guard (fleet_node's guard), raised to the table's measured co-run slowdown")
    p.add_argument("--seeds", type=int, default=3, help="simulator seeds (slo_safe loads)")
    p.add_argument("--out", required=True, help="assignment JSON to write")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    robots = load_fleet(args.fleet)
    lut = ProfileTable.load(args.profile)
    guard, interference = planning_guard(lut, args.guard), planning_interference(lut)
    print(f"planning with interference {interference_source(lut)}, guard {guard:.3f}, design {args.design}")
    if args.loads == "slo_safe" and args.method == "milp":
        config = SimConfig(design=args.design, guard=guard, interference=interference)
        safe = SloSafeLoads(lut, config, seeds=range(args.seeds))
        placed = place_slo_safe(robots, args.gpus, safe)
        assignment = placed.assignment
        print(f"SLO-safe at capacity {assignment.capacity:.2f} after {placed.tries} placement(s): devices at "
              f"{[round(a, 3) for a in placed.device_attainment]}, worst robot {placed.worst_robot:.3f}")
    else:
        loads = robot_loads(robots, lut, guard=guard)
        extra = {"capacity": args.capacity} if args.method == "milp" else {}
        assignment = METHODS[args.method](robots, loads, args.gpus, **extra)
    Path(args.out).write_text(json.dumps(assignment_to_dict(assignment, robots), indent=1))
    for gpu, load in enumerate(assignment.loads):
        served = sorted(r for r, g in assignment.gpu_of.items() if g == gpu)
        print(f"gpu {gpu}: load {load:.2f}  robots {served}")
    print(f"{assignment.pairs} model/GPU pairs -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
