"""``oxygen-ros fleet-sim``: robots served at 98 % SLO attainment per serving design, queue policy and
robot-to-GPU assignment, in the fleet simulator, over several seeds.

Each run is a design with a queue policy (``design:policy``) and an assignment; every design gets the same policies,
so a design comparison is made at equal policy. For each run and seed the robot count at the target is found by
bisection (`capacity`), and the report gives its median, min and max over seeds and the worst robot's attainment
at that count. ``--sensitivity`` repeats the monolithic vs Robion comparison on synthetic tables across the
assumptions it depends on (how much the action stage slows on a smaller share; interference between co-running
stages).

Without ``--profile`` the latencies come from the synthetic LUT (``SyntheticLatencyModel``), and the output says
so: those numbers show how the designs compare under a latency model, not how a real device performs. Pass a LUT
measured with ``fleet-profile`` to simulate a real deployment.

The ``omni`` (stage processes, continuous batching) and ``intergpu`` (stages on two GPUs) designs also need the
measured inter-process hand-offs, ``--ipc`` (from ``fleet-ipc``, for the served model's payloads; ``--ipc-way``
picks how they are handed over) and a link (``--link``, assumed figures). An ``intergpu`` device is a pair of GPUs,
so it runs on ``--gpus`` / 2 pairs (one pair at least); compare designs per GPU (the ``per GPU`` column).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from oxygen_ros.command_line import CommandParser, progress
from oxygen_ros.evaluation.fleet.fleets import make_fleet, model_scales
from oxygen_ros.evaluation.fleet.ipc import WAYS, hop_seconds
from oxygen_ros.fleet.baselines import LINKS, attach_hop_costs
from oxygen_ros.fleet.capacity import CRITERIA, TARGET, Point, capacity
from oxygen_ros.fleet.co_run import (
    ASSUMED_INTERFERENCE,
    DEFAULT_GUARD,
    interference_source,
    planning_guard,
    planning_interference,
)
from oxygen_ros.fleet.profile_table import ProfileTable, SyntheticLatencyModel, synthetic_table
from oxygen_ros.fleet.simulator import BASELINES, DESIGNS, SimConfig, simulate
from oxygen_ros.fleet.traffic import (
    RobotSpec,
    assign_even_split,
    assign_milp_relaxed,
    assign_one_model_per_gpu,
    robot_loads,
)

ASSIGNERS = {
    "milp": assign_milp_relaxed,
    "even": assign_even_split,
    "one_model_per_gpu": assign_one_model_per_gpu,
}
DEFAULT_RUNS = "monolithic:esf,monolithic:rr,disaggregated:esf,robion:esf,robion:rr,robion:lqf"
SENSITIVITY = {"action_share_exponent": (0.35, 0.6, 0.9), "interference": (1.05, 1.3)}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser("fleet-sim", __doc__)
    p.add_argument("--runs", default=DEFAULT_RUNS, help=f"design:policy pairs (designs: {', '.join(DESIGNS)}; "
                   "policies: esf, rr, lqf, fifo), each on the MILP assignment; default: %(default)s")
    p.add_argument("--assign", default=",".join(ASSIGNERS), help="assignments to compare (with robion:esf)")
    p.add_argument("--gpus", type=int, default=4, help="GPUs in the fleet")
    p.add_argument("--models", type=int, default=8, help="distinct models served")
    p.add_argument("--profile", help="LUT JSON from fleet-profile; default: the synthetic LUT")
    p.add_argument("--rate", type=_floats, default=[5.0], help="robot request rates in Hz (mixed per robot)")
    p.add_argument("--slo", type=_floats, default=[0.1, 0.2], help="latency budgets in s (mixed per robot)")
    p.add_argument("--duration", type=float, default=5.0, help="simulated seconds of arrivals")
    p.add_argument("--guard", type=float, default=None,
                   help=f"latency inflation assumed for co-running stages (default: {DEFAULT_GUARD}, raised to the "
                   "table's measured co-run slowdown, as a fleet node plans)")
    p.add_argument("--interference", type=float, default=None,
                   help="actual slowdown of co-running stages (default: the table's measured co-run slowdown; "
                   f"{ASSUMED_INTERFERENCE} assumed for a table without one, e.g. the synthetic one)")
    p.add_argument("--sweep-interference", type=_floats, default=[],
                   help="also run every --runs design at each of these interferences, with the guard equal to it "
                   "(planning with the true slowdown), e.g. 1.0,1.1,1.2,1.3,1.4,1.5")
    p.add_argument("--jitter", type=float, default=0.2, help="arrival jitter, as a fraction of a robot's period")
    p.add_argument("--capacity", type=float, default=1.0, help="MILP per-GPU load limit")
    p.add_argument("--max-batch", type=int, default=8, help="largest batch a stage forms")
    p.add_argument("--seeds", type=int, default=5, help="seeds per run (fleet draw, phases and jitter)")
    p.add_argument("--max-robots", type=int, default=128, help="upper end of the bisection")
    p.add_argument("--criterion", choices=CRITERIA, default="overall",
                   help="what must reach 98%%: the fleet's attainment or every robot's")
    p.add_argument("--ipc", help="hand-off costs JSON from fleet-ipc (needed by the omni and intergpu designs)")
    p.add_argument("--ipc-way", choices=WAYS, default="shm_handle", help="which measured hand-off the omni design pays")
    p.add_argument("--link", choices=sorted(LINKS), default="nvlink4",
                   help="GPU-to-GPU link of the intergpu design (assumed bandwidth and latency)")
    p.add_argument("--sensitivity", action="store_true", help="also sweep the synthetic latency assumptions")
    p.add_argument("--out", required=True, help="output folder for results.json and the plot")
    return p


def load_lut(path: str | None, n_models: int) -> tuple[ProfileTable, list[str]]:
    if path is None:
        scales = model_scales(n_models)
        return synthetic_table(scales), list(scales)
    lut = ProfileTable.load(path)
    if len(lut.models()) < n_models:
        raise SystemExit(f"{path} profiles {len(lut.models())} models, {n_models} requested")
    return lut, lut.models()[:n_models]


def with_hop_costs(lut: ProfileTable, args: argparse.Namespace) -> ProfileTable:
    """The LUT with the measured hand-offs and the link attached (unchanged without ``--ipc``)."""
    if args.ipc is None:
        return lut
    ipc = json.loads(Path(args.ipc).read_text())
    return attach_hop_costs(lut, hop_seconds(ipc, args.ipc_way), args.ipc_way, ipc["meta"]["kv_bytes_per_request"],
                            LINKS[args.link], args.link)


def devices_of(design: str, gpus: int) -> tuple[int, int]:
    """(simulated devices, GPUs they use) for ``gpus`` GPUs: an intergpu device is a pair of GPUs."""
    per_device = getattr(BASELINES.get(design), "gpus", 1)
    devices = max(1, gpus // per_device)
    return devices, devices * per_device


def fleet(n: int, seed: int, models: list[str], args: argparse.Namespace) -> list[RobotSpec]:
    """The first ``n`` robots of seed ``seed``'s fleet, on the LUT's model ids."""
    rename = {f"vla{k}": m for k, m in enumerate(models)}
    robots = make_fleet(n, len(models), seed, tuple(args.rate), tuple(args.slo))
    return [RobotSpec(r.robot_id, rename[r.model_id], r.rate_hz, r.slo_s) for r in robots]


def run_capacity(lut: ProfileTable, models: list[str], args: argparse.Namespace, design: str, policy: str,
                 assign: str = "milp", interference: float | None = None, guard: float | None = None) -> dict:
    """Robots at the target for one design:policy on one assignment, over ``args.seeds`` seeds (``interference``
    and ``guard``: instead of the command's)."""
    guard = args.guard if guard is None else guard
    base = SimConfig(design=design, policy=policy, duration_s=args.duration, max_batch=args.max_batch,
                     guard=guard, interference=args.interference if interference is None else interference,
                     jitter=args.jitter)
    extra = {"capacity": args.capacity} if assign == "milp" else {}
    devices, gpus_used = devices_of(design, args.gpus)

    def run(n: int, seed: int) -> Point:
        robots = fleet(n, seed, models, args)
        placement = ASSIGNERS[assign](robots, robot_loads(robots, lut, guard=guard), devices, **extra)
        result = simulate(robots, placement.gpu_of, lut, replace(base, seed=seed))
        return Point(n, result.attainment, min(result.per_robot.values()))

    summary = capacity(run, range(args.seeds), args.max_robots, criterion=args.criterion).summary()
    return {**summary, "gpus_used": gpus_used, "robots_per_gpu_median": summary["robots_median"] / gpus_used}


def resolve_co_run(args: argparse.Namespace, lut: ProfileTable) -> str:
    """Fill in the guard and interference the command was not given, from the table; says where they came from."""
    given = args.interference is not None
    if args.interference is None:
        args.interference = planning_interference(lut)
    if args.guard is None:
        args.guard = planning_guard(lut)
    return "given" if given else interference_source(lut)


def run_sweep(args: argparse.Namespace) -> dict:
    lut, models = load_lut(args.profile, args.models)
    lut = with_hop_costs(lut, args)
    source = resolve_co_run(args, lut)
    runs = {}
    for label in progress(_names(args.runs), desc="runs"):
        design, _, policy = label.partition(":")
        runs[label] = run_capacity(lut, models, args, design, policy or "esf")
    assignments = {name: run_capacity(lut, models, args, "robion", "esf", name) for name in _names(args.assign)}
    report = {"config": dict(vars(args)), "lut": lut.meta, "gpus": args.gpus, "models": models, "runs": runs,
              "assignments": assignments, "interference_source": source}
    if args.sweep_interference:
        report["interference_sweep"] = run_interference_sweep(lut, models, args)
    if args.sensitivity:
        report["sensitivity"] = run_sensitivity(args)
    return report


def run_interference_sweep(lut: ProfileTable, models: list[str], args: argparse.Namespace) -> list[dict]:
    """Every --runs design:policy at each swept interference, planned with a guard equal to it."""
    rows = []
    for interference in progress(args.sweep_interference, desc="interference"):
        row = {"interference": interference}
        for label in _names(args.runs):
            design, _, policy = label.partition(":")
            row[label] = run_capacity(lut, models, args, design, policy or "esf", interference=interference,
                                      guard=interference)
        rows.append(row)
    return rows


def run_sensitivity(args: argparse.Namespace) -> list[dict]:
    """Monolithic vs Robion (both ESF, MILP) on synthetic tables: action-stage share exponent x interference."""
    rows = []
    for exponent in SENSITIVITY["action_share_exponent"]:
        latency_model = SyntheticLatencyModel(action_share_exponent=exponent)
        scales = model_scales(args.models)
        lut, models = synthetic_table(scales, latency_model=latency_model), list(scales)
        for interference in SENSITIVITY["interference"]:
            row = {"action_share_exponent": exponent, "interference": interference}
            for design in ("monolithic", "robion"):
                row[design] = run_capacity(lut, models, args, design, "esf", interference=interference)
            rows.append(row)
    return rows


def _cell(summary: dict) -> str:
    per_gpu = summary.get("robots_per_gpu_median", float("nan"))
    return (f"{summary['robots_median']:>6g}  [{summary['robots_min']:>3}-{summary['robots_max']:<3}]"
            f"{'+' if summary['capped'] else ' '}  {summary['worst_robot_attainment_min']:6.3f}"
            f"  {per_gpu:8.2f} ({summary.get('gpus_used', '?')} GPUs)")


def print_report(report: dict, out=None) -> None:
    out = out or sys.stdout
    config = report["config"]
    if config["profile"] is None:
        print("LUT: SYNTHETIC latency model (no --profile given): " + report["lut"]["formula"], file=out)
    else:
        print(f"LUT: {config['profile']} (source: {report['lut'].get('source', 'unknown')})", file=out)
    print(f"{report['gpus']} GPUs, {len(report['models'])} models, {config['seeds']} seeds, jitter "
          f"{config['jitter']:g} period, interference " + (f"{config['interference']:g}" if
          report.get("interference_source", "given") == "given" else report["interference_source"])
          + f", guard {config['guard']:g}", file=out)
    if config.get("ipc"):
        print(f"hand-offs: {config['ipc']} ({config['ipc_way']}); link {config['link']} "
              f"{report['lut']['link']['bytes_per_s'] / 1e9:g} GB/s (assumed)", file=out)
    title = "robots at 98% SLO" if config["criterion"] == "overall" else "robots, each at 98% SLO"
    header = f"{title:<28}{'median':>6}  [min-max]   worst robot  per GPU (median / GPUs used)"
    print(f"\n{header}", file=out)
    for label, summary in report["runs"].items():
        print(f"{label:<28}{_cell(summary)}", file=out)
    print(f"\n{'robion:esf with assignment':<28}", file=out)
    for label, summary in report["assignments"].items():
        print(f"{label:<28}{_cell(summary)}", file=out)
    if report.get("interference_sweep"):
        labels = _names(config["runs"])
        print("\ninterference sweep (guard = interference): robots at 98%, median [min-max]", file=out)
        print(f"{'interference':>12}" + "".join(f"{label:>20}" for label in labels), file=out)
        for row in report["interference_sweep"]:
            cells = "".join(f"{row[k]['robots_median']:>9g} [{row[k]['robots_min']}-{row[k]['robots_max']}]"
                            .rjust(20) for k in labels)
            print(f"{row['interference']:>12g}{cells}", file=out)
    if report.get("sensitivity"):
        print("\nsensitivity (synthetic LUT, ESF, MILP): robots at 98%, median [min-max]", file=out)
        print(f"{'action exponent':>16}{'interference':>14}{'monolithic':>18}{'robion':>18}", file=out)
        for row in report["sensitivity"]:
            cells = "".join(f"{row[d]['robots_median']:>9g} [{row[d]['robots_min']}-{row[d]['robots_max']}]"
                            .rjust(18) for d in ("monolithic", "robion"))
            print(f"{row['action_share_exponent']:>16g}{row['interference']:>14g}{cells}", file=out)
    print("(+: some seed reached the bisection's upper bound, --max-robots)", file=out)


def plot_report(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {**report["runs"], **{f"robion:esf@{k}": v for k, v in report["assignments"].items()}}
    labels = list(series)
    medians = [series[k]["robots_median"] for k in labels]
    low = [m - series[k]["robots_min"] for k, m in zip(labels, medians)]
    high = [series[k]["robots_max"] - m for k, m in zip(labels, medians)]
    fig, ax = plt.subplots(figsize=(1.2 * len(labels) + 2, 4))
    ax.bar(range(len(labels)), medians, yerr=[low, high], capsize=4)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel(f"robots at {TARGET:.0%} SLO (median, min-max over seeds)")
    source = report["lut"].get("source", "unknown")
    ax.set_title(f"{report['gpus']} GPUs, {len(report['models'])} models, {source} LUT")
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
    plot_report(report, out / "robots_at_98.png")
    print(f"\nwrote {out / 'results.json'} and {out / 'robots_at_98.png'} ({report['wall_s']:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
