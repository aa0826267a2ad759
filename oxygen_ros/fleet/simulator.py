"""Discrete-event fleet simulator: the engine's scheduler and the fleet's planners on a simulated clock.

Robots send frames periodically (seeded random phase, and each frame delayed by a random part of its robot's
period: ``jitter``, on by default, since without it robots phase-lock to batch starts and one seed's result says
little about another's). Each GPU runs one `engine.scheduler.Scheduler` with the design's planner (the same
classes a fleet server runs: `designs.make_planner`, plus the simulator-only baselines of `baselines.py`) and the
profile table as its cost model (`profile_table.ProfileCost`); every job lasts its batches' table latency,
inflated by an ``interference`` factor when it co-runs with other work. Time is a simulated clock: nothing
sleeps, and the same inputs and seed give the same result.

At each event time every event due is applied first (finished jobs, then arrivals), and only then are the touched
devices asked to start new jobs, so a batch sees exactly the frames that had arrived by its stage start.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..engine.frames import ActionFrame
from ..engine.planners import StageJob
from ..engine.scheduler import Scheduler, SchedulerConfig
from ..engine.stats import percentile
from .baselines import InterGpuPlanner, OmniPlanner
from .co_run import ASSUMED_INTERFERENCE, DEFAULT_GUARD
from .designs import DEFAULT_DESIGN, make_planner
from .profile_table import ProfileCost, ProfileTable
from .traffic import RobotSpec

BASELINES = {"omni": OmniPlanner, "intergpu": InterGpuPlanner}
DESIGNS = ("monolithic", "disaggregated", "robion", *BASELINES)
"""The device designs: monolithic; stage disaggregation with fixed batching (static split); lockstep guarded
partitioning (Robion); stage processes with continuous batching and measured IPC (omni); the stages on two GPUs
with the K/V sent over the link (intergpu: one device of the simulation is a pair of GPUs). Every design takes the
same queue policy (``SimConfig.policy``, earliest-SLO-first by default): a comparison of designs compares designs,
and a comparison of policies runs one design."""


@dataclass(frozen=True)
class SimConfig:
    design: str = DEFAULT_DESIGN
    policy: str = "esf"  # which model's queue a free stage serves: esf, rr, lqf or fifo
    duration_s: float = 5.0
    seed: int = 0
    max_batch: int = 8
    guard: float = DEFAULT_GUARD
    interference: float = ASSUMED_INTERFERENCE  # a measured table's is `co_run.planning_interference`
    jitter: float = 0.2  # each frame arrives up to this fraction of its robot's period late (uniform)
    drop_expired: bool = True
    # Service-time drift: when given, the k-th job (in start order) lasts its table duration times
    # factor k (cycling), e.g. the wall/table ratios a real run showed, in order, on a shared machine
    # (``cycle_factors``): slow spells stay together as they happened.
    duration_factors: tuple[float, ...] = ()


@dataclass
class JobRecord:
    gpu: int
    job: StageJob
    end: float


@dataclass
class SimResult:
    frames: list[ActionFrame]
    per_robot: dict[str, float]
    attainment: float
    latency_p50_s: float
    latency_p99_s: float
    dropped: int
    jobs: list[JobRecord] = field(default_factory=list)
    arrivals: list[tuple[float, int]] = field(default_factory=list)

    @property
    def miss_ratio(self) -> float:
        return 1.0 - self.attainment

    def summary(self) -> dict:
        return {
            "attainment": self.attainment,
            "miss_ratio": self.miss_ratio,
            "frames": len(self.frames),
            "dropped": self.dropped,
            "latency_p50_ms": 1e3 * self.latency_p50_s,
            "latency_p99_ms": 1e3 * self.latency_p99_s,
            "worst_robot_attainment": min(self.per_robot.values(), default=1.0),
        }


def scheduler_config(config: SimConfig) -> SchedulerConfig:
    return SchedulerConfig(queue=config.policy, max_batch=config.max_batch, drop_expired=config.drop_expired)


def make_scheduler(config: SimConfig, lut: ProfileTable) -> Scheduler:
    """One device's scheduler: the design's planner, the table as its cost model, no language."""
    sched = scheduler_config(config)
    cost = ProfileCost(lut)
    if config.design in BASELINES:
        planner = BASELINES[config.design](lut, policy=config.policy, max_batch=config.max_batch,
                                           guard=config.guard, drop_expired=config.drop_expired)
    elif config.design in DESIGNS:
        planner = make_planner(config.design, sched, cost, lut, config.guard)
    else:
        raise ValueError(f"unknown design {config.design!r}; choose from {sorted(DESIGNS)}")
    return Scheduler(sched, dict.fromkeys(lut.models(), 0), cost, planner)


def make_arrivals(robots: Sequence[RobotSpec], config: SimConfig) -> list[ActionFrame]:
    """Every robot's frames in ``[0, duration_s)``: seeded random phase, then one per period, each delayed by up
    to ``jitter`` periods; each frame's `context` is its index in the list. A real run (`fleet-bench`) replays
    the same list on the wall clock, so a simulation and a real run see the same arrivals."""
    rng = np.random.default_rng(config.seed)
    frames: list[ActionFrame] = []
    for robot in robots:
        t = float(rng.uniform(0.0, robot.period_s))
        while t < config.duration_s:
            arrival = t + (float(rng.uniform(0.0, config.jitter * robot.period_s)) if config.jitter else 0.0)
            frames.append(ActionFrame(robot.model_id, None, False, arrival + robot.slo_s, arrival, robot.robot_id,
                                      context=len(frames)))
            t += robot.period_s
    return frames


def replay(frames: Sequence[ActionFrame], gpu_of: dict[str, int], schedulers: Sequence[Scheduler],
           interference: float = ASSUMED_INTERFERENCE, duration_factors: Sequence[float] = (), keep_log: bool = False
           ) -> tuple[list[JobRecord], list[tuple[float, int]]]:
    """Serve `frames` (robot -> device by `gpu_of`) on the simulated clock until every one has finished or been
    dropped; returns the jobs and the arrivals, (time, context) (with `keep_log`)."""
    events: list[tuple[float, int, int, object]] = []  # (time, kind: 0 finish / 1 arrival, seq, payload)
    seq = itertools.count()
    for frame in frames:
        heapq.heappush(events, (frame.arrival, 1, next(seq), frame))
    jobs: list[JobRecord] = []
    arrivals: list[tuple[float, int]] = []
    factors = np.asarray(duration_factors, dtype=float)
    started = 0
    while events:
        now = events[0][0]
        touched: set[int] = set()
        while events and events[0][0] <= now:
            _, kind, _, payload = heapq.heappop(events)
            if kind == 0:
                record: JobRecord = payload
                schedulers[record.gpu].finish(record.job, now)
                touched.add(record.gpu)
            else:
                gpu = gpu_of[payload.robot_id]
                schedulers[gpu].submit(payload)
                touched.add(gpu)
                if keep_log:
                    arrivals.append((now, payload.context))
        for gpu in sorted(touched):
            for job in schedulers[gpu].start(now):
                duration = job.duration(interference)
                if factors.size:
                    duration *= float(factors[started % factors.size])
                started += 1
                record = JobRecord(gpu, job, now + duration)
                heapq.heappush(events, (record.end, 0, next(seq), record))
                if keep_log:
                    jobs.append(record)
    return jobs, arrivals


def simulate(robots: list[RobotSpec], gpu_of: dict[str, int], lut: ProfileTable, config: SimConfig = SimConfig(),
             keep_log: bool = False, frames: Sequence[ActionFrame] | None = None) -> SimResult:
    """Run the fleet until every frame sent in ``[0, duration_s)`` has finished or been dropped. `frames`: the
    arrivals to serve (fresh frames, not yet scheduled) instead of ``make_arrivals(robots, config)``, e.g. those of
    a real run as its server received them."""
    n_gpus = max(gpu_of.values(), default=-1) + 1
    schedulers = [make_scheduler(config, lut) for _ in range(n_gpus)]
    frames = make_arrivals(robots, config) if frames is None else list(frames)
    jobs, arrivals = replay(frames, gpu_of, schedulers, config.interference, config.duration_factors, keep_log)
    return summarize(robots, frames, jobs, arrivals)


def summarize(robots: Sequence[RobotSpec], frames: Sequence[ActionFrame], jobs=(), arrivals=()) -> SimResult:
    """Per-robot and overall SLO attainment and latency percentiles of finished and dropped frames."""
    met: dict[str, list[bool]] = {r.robot_id: [] for r in robots}
    for frame in frames:
        met[frame.robot_id].append(frame.met_deadline)
    per_robot = {rid: (float(np.mean(flags)) if flags else 1.0) for rid, flags in met.items()}
    latencies = [f.latency for f in frames if f.finish is not None]
    overall = float(np.mean([f.met_deadline for f in frames])) if frames else 1.0
    p50, p99 = (percentile(latencies, q, float("nan")) for q in (0.5, 0.99))
    return SimResult(list(frames), per_robot, overall, p50, p99, sum(f.dropped for f in frames), list(jobs),
                     list(arrivals))


def cycle_factors(jobs: Sequence[StageJob], interference: float = 1.0) -> list[float]:
    """For a one-lane device, how much longer than its table prediction each job kept the device: (time from its
    start to the next job's start) / (table duration, a co-running job inflated by ``interference``). The cycle
    includes the server's own overhead between jobs. Meaningful while the device is kept busy (an overloaded run);
    all 1.0 would mean the machine ran exactly as profiled. ``SimConfig.duration_factors`` takes them, so a
    simulation can replay the run's service-time drift and noise."""
    ordered = sorted(jobs, key=lambda job: job.start)
    return [(b.start - a.start) / a.duration(interference) for a, b in zip(ordered, ordered[1:])]
