"""``oxygen-ros fleet-sim``: SLO attainment vs robot count for the serving designs, queue policies and
robot-to-GPU assignments, in the fleet simulator.

Without ``--profile`` the latencies come from the synthetic LUT (``SyntheticLatencyModel``), and the output says
so: those numbers show how the designs compare under a plausible latency model, not how a real GPU performs.
Pass a LUT measured with ``profile_stages`` to simulate a real deployment.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from oxygen_ros.command_line import CommandParser, progress
from oxygen_ros.fleet.profile_table import ProfileTable, synthetic_table
from oxygen_ros.fleet.simulator import DESIGNS, SimConfig, simulate
from oxygen_ros.fleet.traffic import (
    assign_even_split,
    assign_milp_relaxed,
    assign_one_model_per_gpu,
    robot_loads,
)
from oxygen_ros.fleet.workload import make_fleet, model_scales

TARGET = 0.98
ASSIGNERS = {
    "milp": assign_milp_relaxed,
    "even": assign_even_split,
    "one_model_per_gpu": assign_one_model_per_gpu,
}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser("fleet-sim", __doc__)
    p.add_argument(
        "--robots", default="8,16,24,32,40,48,56,64", help="robot counts to sweep (comma separated)"
    )
    p.add_argument("--gpus", type=int, default=4, help="GPUs in the fleet")
    p.add_argument("--models", type=int, default=8, help="distinct models served")
    p.add_argument("--policy", default="esf,rr,lqf", help="queue policies to compare on the lockstep design")
    p.add_argument("--designs", default=",".join(DESIGNS), help=f"designs to compare ({', '.join(DESIGNS)})")
    p.add_argument("--assign", default=",".join(ASSIGNERS), help="robot->GPU assignments to compare")
    p.add_argument("--profile", help="LUT JSON from profile_stages; default: the synthetic LUT")
    p.add_argument("--rate", type=_floats, default=[5.0], help="robot request rates in Hz (mixed per robot)")
    p.add_argument("--slo", type=_floats, default=[0.1, 0.2], help="latency budgets in s (mixed per robot)")
    p.add_argument("--duration", type=float, default=5.0, help="simulated seconds of arrivals")
    p.add_argument("--guard", type=float, default=1.1, help="latency inflation assumed for co-running stages")
    p.add_argument("--interference", type=float, default=1.05, help="actual slowdown of co-running stages")
    p.add_argument(
        "--capacity", type=float, default=1.0, help="MILP per-GPU load limit (below 1 leaves SLO headroom)"
    )
    p.add_argument("--max-batch", type=int, default=8, help="largest batch a stage forms")
    p.add_argument("--seed", type=int, default=0, help="seed of the fleet and its arrivals")
    p.add_argument("--out", required=True, help="output folder for results.json and plots")
    return p


def load_lut(path: str | None, n_models: int) -> tuple[ProfileTable, list[str]]:
    if path is None:
        scales = model_scales(n_models)
        return synthetic_table(scales), list(scales)
    lut = ProfileTable.load(path)
    if len(lut.models()) < n_models:
        raise SystemExit(f"{path} profiles {len(lut.models())} models, {n_models} requested")
    return lut, lut.models()[:n_models]


def robots_at_target(points: dict[int, float], target: float = TARGET) -> int:
    """Largest robot count of the sweep such that it and every smaller count reach ``target`` (0 if none)."""
    served = 0
    for n in sorted(points):
        if points[n] < target:
            break
        served = n
    return served


def run_sweep(args: argparse.Namespace) -> dict:
    lut, models = load_lut(args.profile, args.models)
    rename = {f"vla{k}": m for k, m in enumerate(models)}
    base = SimConfig(
        duration_s=args.duration,
        seed=args.seed,
        max_batch=args.max_batch,
        guard=args.guard,
        interference=args.interference,
    )
    groups: dict[str, dict[str, dict[int, dict]]] = {"design": {}, "policy": {}, "assign": {}}
    assignments: dict[int, dict] = {}
    for n in progress([int(x) for x in _names(args.robots)], desc="robot counts"):
        robots = make_fleet(n, len(models), args.seed, tuple(args.rate), tuple(args.slo))
        robots = [r.__class__(r.robot_id, rename[r.model_id], r.rate_hz, r.slo_s) for r in robots]
        loads = robot_loads(robots, lut, guard=args.guard)
        placed = {
            name: ASSIGNERS[name](
                robots, loads, args.gpus, **({"capacity": args.capacity} if name == "milp" else {})
            )
            for name in ["milp", *_names(args.assign)]
        }
        milp = placed["milp"]
        assignments[n] = {
            name: {"pairs": a.pairs, "max_load": a.max_load, "capacity": a.capacity}
            for name, a in placed.items()
        }
        runs = [("design", d, milp, {"design": d}) for d in _names(args.designs)]
        runs += [("policy", p, milp, {"design": "lockstep", "policy": p}) for p in _names(args.policy)]
        runs += [("assign", a, placed[a], {"design": "robion"}) for a in _names(args.assign)]
        for group, name, assignment, overrides in runs:
            config = SimConfig(**{**base.__dict__, **overrides})
            result = simulate(robots, assignment.gpu_of, lut, config)
            groups[group].setdefault(name, {})[n] = result.summary()
    at_target = {
        group: {
            name: robots_at_target({n: s["attainment"] for n, s in pts.items()})
            for name, pts in series.items()
        }
        for group, series in groups.items()
    }
    return {
        "config": {k: v for k, v in vars(args).items()},
        "lut": lut.meta,
        "gpus": args.gpus,
        "models": models,
        "results": groups,
        "assignments": assignments,
        "robots_at_98pct": at_target,
    }


def print_report(report: dict, out=None) -> None:
    out = out or sys.stdout
    source = report["lut"].get("source", "unknown")
    if report["config"]["profile"] is None:
        print("LUT: SYNTHETIC latency model (no --profile given): " + report["lut"]["formula"], file=out)
    else:
        print(f"LUT: {report['config']['profile']} (source: {source})", file=out)
    print(f"{report['gpus']} GPUs, {len(report['models'])} models; SLO attainment per robot count", file=out)
    titles = {"design": "design", "policy": "queue policy (lockstep)", "assign": "assignment (robion)"}
    for group, series in report["results"].items():
        if not series:
            continue
        counts = sorted({n for pts in series.values() for n in pts})
        print(f"\n{titles[group]:<26}" + "".join(f"{n:>7}" for n in counts) + "   robots@98%", file=out)
        for name, pts in series.items():
            cells = "".join(f"{pts[n]['attainment']:7.3f}" for n in counts)
            print(f"{name:<26}{cells}   {report['robots_at_98pct'][group][name]:>5}", file=out)


def plot_report(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [g for g, series in report["results"].items() if series]
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, group in zip(axes[0], groups):
        for name, pts in report["results"][group].items():
            counts = sorted(pts)
            ax.plot(counts, [pts[n]["attainment"] for n in counts], marker="o", label=name)
        ax.axhline(TARGET, color="grey", linestyle="--", linewidth=0.8)
        ax.set(xlabel="robots", ylabel="SLO attainment", title=group, ylim=(0, 1.02))
        ax.legend()
    source = report["lut"].get("source", "unknown")
    fig.suptitle(f"{report['gpus']} GPUs, {len(report['models'])} models, {source} LUT")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report = run_sweep(args)
    report["wall_s"] = time.perf_counter() - started
    print_report(report)
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    plot_report(report, out / "attainment_vs_robots.png")
    print(f"\nwrote {out / 'results.json'} and {out / 'attainment_vs_robots.png'} ({report['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
