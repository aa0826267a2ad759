"""``oxygen-ros fleet-bench``: real fleet serving on this machine, robots served at >= 98% SLO per design.

Co-located models (default: two variants of the tiny preset with different weights) are profiled on the engine's
runners and stage workers (`profiler.StageProfiler`), then for every robot count and design a `FleetServer` of
that design (the one a `fleet_node` runs, with the profile as its table) serves that many simulated robots: the
simulator's arrival list for them (each robot at its control rate with its SLO) is replayed into it on the wall
clock for ``--duration`` seconds. Designs run interleaved per robot count, so a change in machine load hits all of
them alike. Next to each real point the simulator's prediction for the same arrival list and table is printed
(the same scheduler and planner on a simulated clock, interference = the profiled co-run slowdown). A design's
sweep stops at its first point below the target, unless ``--all-counts``. Each design's server is made once and
kept (its models loaded once per design). For Robion, each point also says what its lockstep measured of its two
ways per model and bucket (``lockstep``: measured/predicted ratios, jobs, batches explored; cumulative over the
points, as the server is kept). The load average before and after the run goes into ``results.json``.

``--profile LUT.json`` serves from a table profiled before (``fleet-profile`` with the same model ids) instead of
profiling here. On a GPU, ``--require-sm-partitions`` refuses to run (status 1) where the stage shares would be
plain streams rather than green-context SM partitions.

``--reprofile``: profile again after every robot count, so that each count is served between two profiles, and
predict it also from the profile after it and from the mean of the two (``profile_table.mean_table``); the two
single-profile predictions give a band. On a machine whose load drifts, one profile taken minutes before a run
predicts it poorly; the profiles on both sides of it bracket it. A last prediction also replays the two profiles'
own noise (each timed call / its entry's median, ``meta["noise_factors"]``) as service-time drift on the mean
table: a median-only table has no tail. Nothing from the run itself is replayed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from oxygen_ros.command_line import CommandParser, add_device_options, check_device_options, existing_file
from oxygen_ros.engine.frames import ActionFrame
from oxygen_ros.engine.model_runner import zero_inputs
from oxygen_ros.engine.runtime import RuntimeConfig
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.fleet.capacity import TARGET, robots_at_target
from oxygen_ros.fleet.co_run import planning_guard
from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.profile_table import ProfileTable, mean_table
from oxygen_ros.fleet.profiler import StageProfiler
from oxygen_ros.fleet.server import FleetServer, ServedRobot
from oxygen_ros.fleet.simulator import (
    JobRecord,
    SimConfig,
    SimResult,
    cycle_factors,
    make_arrivals,
    simulate,
    summarize,
)
from oxygen_ros.fleet.traffic import RobotSpec


def make_robots(n: int, models: Sequence[str], rate_hz: float, slos: Sequence[float]) -> list[RobotSpec]:
    """Robot i uses model i mod len(models) and SLO (i // len(models)) mod len(slos): every model sees every SLO."""
    return [
        RobotSpec(f"robot{i}", models[i % len(models)], rate_hz, slos[(i // len(models)) % len(slos)])
        for i in range(n)
    ]


def fleet_server(specs: Sequence[ModelSpec], robots: Sequence[RobotSpec], design: str, lut: ProfileTable,
                 args: argparse.Namespace) -> FleetServer:
    """A server of `design` for every robot of the sweep, planning from `lut` (no narration: actions only)."""
    staged = design != "monolithic"
    frame_slots = 8 * args.max_batch if staged else args.max_batch  # a stage split holds frames between stages
    config = RuntimeConfig(SchedulerConfig(queue="esf", max_batch=args.max_batch, max_new_tokens=1),
                           pool_slots=frame_slots + 1, frame_slots=frame_slots)
    served = [ServedRobot(r.robot_id, r.model_id, r.slo_s) for r in robots]
    return FleetServer(specs, served, config, device=args.device, design=design, profile=lut,
                       cpu_threads=args.cpu_threads, cuda_graphs=args.cuda_graphs, publish_late=True).start()


def serve(server: FleetServer, robots: Sequence[RobotSpec], arrivals: Sequence[ActionFrame],
          timeout_s: float = 600.0) -> SimResult:
    """Replay `arrivals` into `server` on the wall clock (each frame at its time, stamped then: a replay that falls
    behind sends frames already aged), wait until every frame is answered, and judge each by its deadline."""
    inputs = {m: zero_inputs(s.model.config, 1, s.model.device, s.model.dtype) for m, s in server.runtime.served.items()}
    server.runtime.scheduler.log = []
    frames = []
    start = time.perf_counter()
    for frame in sorted(arrivals, key=lambda f: f.arrival):
        due = start + frame.arrival
        time.sleep(max(0.0, due - time.perf_counter()))
        now = time.perf_counter()
        queued = server.submit_inputs(frame.robot_id, inputs[frame.model_id], False, stamp_ns=0, age_s=now - due,
                                      context=frame.context, arrival=now)
        if queued is None:  # so late already that its deadline has passed: a miss, never served
            frame.dropped = True
        frames.append(queued or frame)
    if not server.runtime.drain(timeout_s):
        raise RuntimeError(f"the {server.design} server did not answer every frame in {timeout_s:.0f} s")
    jobs = [JobRecord(0, job, job.end) for job in server.runtime.scheduler.log]
    server.runtime.scheduler.log = None
    return summarize(robots, frames, jobs)


def warm_up(server: FleetServer, robots: Sequence[RobotSpec], max_batch: int) -> None:
    """A burst of a batch of frames per model, so first-call costs (allocations) stay out of the measured runs."""
    first = list({r.model_id: r for r in reversed(robots)}.values())  # one robot of each model
    burst = [ActionFrame(r.model_id, None, False, 60.0, 0.0, r.robot_id, context=i)
             for i, r in enumerate(first * max_batch)]
    serve(server, first, burst)


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser("fleet-bench", __doc__)
    p.add_argument("--models", default="a=tiny:0,b=tiny:1", help="served models, id=source[:seed] (comma separated)")
    p.add_argument("--robots", default="10,20,30,40,50,60", help="robot counts (comma separated)")
    p.add_argument("--designs", default="monolithic,robion", help="serving designs to compare (comma separated)")
    p.add_argument("--rate", type=float, default=20.0, help="robot control rate (Hz)")
    p.add_argument("--slo", default="0.03,0.06", help="latency budgets in s (mixed over robots)")
    p.add_argument("--duration", type=float, default=3.0, help="wall seconds of arrivals per point")
    p.add_argument("--cpu-threads", type=int, default=None, help="cores that make up the CPU device")
    add_device_options(p)
    p.add_argument("--max-batch", type=int, default=8, help="largest batch a stage forms")
    p.add_argument("--repeats", type=int, default=7, help="profiling repeats")
    p.add_argument("--seed", type=int, default=0, help="seed of the fleet, its arrivals and the weights")
    p.add_argument("--reprofile", action="store_true",
                   help="profile after every robot count too; predict each count from the profiles on both sides")
    p.add_argument("--profile", type=existing_file, default=None,
                   help="serve from this table (fleet-profile, the same model ids) instead of profiling first")
    p.add_argument("--all-counts", action="store_true",
                   help="serve every robot count, also after a design fell below the target")
    p.add_argument("--require-sm-partitions", action="store_true",
                   help="fail (status 1) where a GPU's stage shares would be plain streams (a CUDA device only)")
    p.add_argument("--out", default=None, help="folder for results.json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_device_options(parser, args)
    if args.require_sm_partitions and not args.device.startswith("cuda"):
        parser.error(f"--require-sm-partitions needs a CUDA device, not {args.device}")
    if args.profile and args.reprofile:
        parser.error("--profile serves from one table; --reprofile profiles again after every count")
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    specs = [ModelSpec.parse(x) for x in args.models.split(",") if x]
    designs = [d for d in args.designs.split(",") if d]
    slos = [float(x) for x in args.slo.split(",") if x]
    counts = [int(x) for x in args.robots.split(",") if x]
    models = [s.model_id for s in specs]
    everyone = make_robots(max(counts), models, args.rate, slos)
    started = time.perf_counter()
    load_before = os.getloadavg()

    def config_of(design: str, table: ProfileTable) -> SimConfig:
        slowdown = table.meta["co_run_slowdown"]
        return SimConfig(design=design, duration_s=args.duration, seed=args.seed, max_batch=args.max_batch,
                         guard=planning_guard(table), interference=slowdown)

    profiler = None if args.profile else StageProfiler(specs, args.device, max_batch=args.max_batch,
                                                       cpu_threads=args.cpu_threads, cuda_graphs=args.cuda_graphs)
    if profiler is not None and args.require_sm_partitions and profiler.partitions is None:
        profiler.close()
        print(f"fleet-bench: no SM partitions here: shares would be {profiler.partition_mode}", file=sys.stderr)
        return 1
    servers: dict[str, FleetServer] = {}
    try:
        lut = ProfileTable.load(args.profile) if args.profile else profiler.profile(repeats=args.repeats)
        missing = sorted(set(models) - set(lut.models()))
        if missing:
            parser.error(f"the profile {args.profile} has no entries for models {missing}")
        profiles = [lut.to_dict()]
        slowdown = lut.meta["co_run_slowdown"]
        for design in designs:
            servers[design] = fleet_server(specs, everyone, design, lut, args)
            if args.require_sm_partitions and design != "monolithic" and "green" not in servers[design].partition_mode:
                print(f"fleet-bench: no SM partitions here: the {design} server runs on "
                      f"{servers[design].partition_mode}", file=sys.stderr)
                return 1
            warm_up(servers[design], everyone, args.max_batch)
        modes = {d: server.partition_mode for d, server in servers.items()}
        threads = f" ({lut.meta['cpu_threads']} threads)" if lut.meta.get("cpu_threads") else ""
        print(f"device {args.device}{threads}, models {models}, torch "
              f"{torch.__version__}, co-run slowdown {slowdown:.2f}, shares {modes}, CUDA graphs "
              f"{'on' if args.cuda_graphs else 'off'}; robots at {args.rate} Hz, SLOs {slos} s; load average "
              f"{load_before[0]:.1f}")
        points: dict[str, dict[int, dict]] = {d: {} for d in designs}
        active = set(designs)
        for n in counts:
            robots = everyone[:n]
            served_now = [d for d in designs if d in active]
            for design in served_now:
                config = config_of(design, lut)
                slowdown = lut.meta["co_run_slowdown"]
                real = serve(servers[design], robots, make_arrivals(robots, config))
                sim = simulate(robots, {r.robot_id: 0 for r in robots}, lut, config)
                factors = cycle_factors([r.job for r in real.jobs], slowdown)
                points[design][n] = {
                    "real": real.summary(),
                    "sim": sim.summary(),
                    "median_cycle_factor": statistics.median(factors) if factors else None,
                    "load_average": os.getloadavg()[0],
                }
                measured = lockstep_measured(servers[design])
                if measured is not None:
                    points[design][n]["lockstep"] = measured
                print(
                    f"{design:<13} robots {n:>4}: real attainment {real.attainment:.3f} "
                    f"(p50 {1e3 * real.latency_p50_s:.1f} ms, p99 {1e3 * real.latency_p99_s:.1f} ms)   "
                    f"simulated {sim.attainment:.3f}" + (f"   {lockstep_text(measured)}" if measured else "")
                )
                if real.attainment < TARGET and not args.all_counts:
                    active.discard(design)
            if args.reprofile:
                after = profiler.profile(repeats=args.repeats)
                profiles.append(after.to_dict())
                mean = mean_table(lut, after)
                noise = tuple(lut.meta.get("noise_factors", ())) + tuple(after.meta.get("noise_factors", ()))
                gpu_of = {r.robot_id: 0 for r in robots}
                for design in served_now:
                    point = points[design][n]
                    point["sim_after"] = simulate(robots, gpu_of, after, config_of(design, after)).summary()
                    point["sim_mean"] = simulate(robots, gpu_of, mean, config_of(design, mean)).summary()
                    noisy = replace(config_of(design, mean), duration_factors=noise)
                    point["sim_noise"] = simulate(robots, gpu_of, mean, noisy).summary()
                    band = sorted((point["sim"]["attainment"], point["sim_after"]["attainment"]))
                    point["band"] = band
                    point["real_in_band"] = band[0] - 1e-9 <= point["real"]["attainment"] <= band[1] + 1e-9
                    print(f"{design:<13} robots {n:>4}: predicted from the profiles before / after / their mean / "
                          f"the mean with their noise: {band_text(point)}   real {point['real']['attainment']:.3f}, "
                          f"{'inside' if point['real_in_band'] else 'outside'} the before/after band")
                lut = after
            if not active:
                break
    finally:
        for server in servers.values():
            server.close()
        if profiler is not None:
            profiler.close()
    load_after = os.getloadavg()
    served = {d: robots_at_target({n: p["real"]["attainment"] for n, p in pts.items()}) for d, pts in points.items()}
    simulated = {d: robots_at_target({n: p["sim"]["attainment"] for n, p in pts.items()}) for d, pts in points.items()}
    print(f"\nrobots served at >= {TARGET:.0%} SLO (real): {served}   simulated at the same points: {simulated}")
    if args.reprofile:
        for key, what in (("sim_mean", "the mean of the profiles around each point"), ("sim_noise", "that mean "
                          "with the profiles' noise")):
            predicted = {d: robots_at_target({n: p[key]["attainment"] for n, p in pts.items()})
                         for d, pts in points.items()}
            print(f"predicted from {what}: {predicted}")
        inside = sum(p["real_in_band"] for pts in points.values() for p in pts.values())
        total = sum(len(pts) for pts in points.values())
        print(f"real attainment inside the before/after band at {inside} of {total} points")
    print(f"({time.perf_counter() - started:.0f} s; load average {load_before[0]:.1f} before, {load_after[0]:.1f} "
          f"after, {os.cpu_count()} cores)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report = {
            "config": vars(args),
            "load_average": {"before": load_before, "after": load_after, "cores": os.cpu_count()},
            "partition_mode": modes,
            "luts": profiles,
            "points": points,
            "robots_at_98pct": served,
            "simulated_robots_at_98pct": simulated,
        }
        (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {out / 'results.json'}")
    return 0


def lockstep_measured(server: FleetServer) -> dict | None:
    """What a Robion server's lockstep measured of its two ways so far (None for another design)."""
    planner = server.runtime.scheduler.planner
    meter = getattr(planner, "meter", None)
    if meter is None:
        return None
    return {"explored": planner.explored, "ratios": meter.report()}


def lockstep_text(measured: dict) -> str:
    """Jobs measured each way (split / back to back) over all models and buckets, and batches explored."""
    ratios = measured["ratios"].values()
    split, back = (sum(r[f"{way}_jobs"] for r in ratios) for way in ("split", "back_to_back"))
    return f"lockstep jobs split {split} / back to back {back}, explored {measured['explored']}"


def band_text(point: dict) -> str:
    return " / ".join(f"{point[k]['attainment']:.3f}" for k in ("sim", "sim_after", "sim_mean", "sim_noise"))


if __name__ == "__main__":
    raise SystemExit(main())
