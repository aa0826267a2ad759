"""Discrete-event fleet simulator driven by LUT latencies.

Robots send requests periodically (seeded random phase, and each request delayed by a random part of its
robot's period: ``jitter``, on by default, since without it robots phase-lock to batch starts and one seed's result
says little about another's); each GPU runs one device scheduler
(lockstep, static split or monolithic) and every job lasts its LUT latency, inflated by an
``interference`` factor when it co-runs with other jobs. Time is a simulated clock: nothing sleeps, and the same
inputs and seed give the same result.

At each event time every event due is applied first (finished jobs, then arrivals), and only then are idle
devices asked to start new jobs, so a batch sees exactly the requests that had arrived by its stage start.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from oxygen_ros.engine.stats import percentile
from oxygen_ros.fleet.baselines import MonolithicScheduler, StaticSplitScheduler
from oxygen_ros.fleet.device import DeviceJob, QueuedDevice
from oxygen_ros.fleet.lockstep import LockstepScheduler
from oxygen_ros.fleet.omni import InterGpuScheduler, OmniScheduler
from oxygen_ros.fleet.profile_table import ProfileTable
from oxygen_ros.fleet.requests import FleetRequest, RobotSpec

DESIGNS: dict[str, type[QueuedDevice]] = {
    "monolithic": MonolithicScheduler,
    "disaggregated": StaticSplitScheduler,
    "robion": LockstepScheduler,
    "omni": OmniScheduler,
    "intergpu": InterGpuScheduler,
}
"""The device designs: monolithic; stage disaggregation with fixed batching (static split); lockstep guarded
partitioning (Robion); stage processes with continuous batching and measured IPC (omni); the stages on two GPUs
with the K/V sent over the link (intergpu: one device of the simulation is a pair of GPUs). Every design takes the
same queue policy (``SimConfig.policy``, earliest-SLO-first by default): a comparison of designs compares designs,
and a comparison of policies runs one design."""


@dataclass(frozen=True)
class SimConfig:
    design: str = "robion"
    policy: str = "esf"  # which model's queue a free stage serves: esf, rr or lqf
    duration_s: float = 5.0
    seed: int = 0
    max_batch: int = 8
    guard: float = 1.1
    interference: float = 1.05
    jitter: float = 0.2  # each request arrives up to this fraction of its robot's period late (uniform)
    drop_expired: bool = True
    # Service-time drift: when given, the k-th job (in start order) lasts its LUT duration times
    # factor k (cycling), e.g. the wall/LUT ratios a real run showed, in order, on a shared machine
    # (``executor.cycle_factors``): slow spells stay together as they happened.
    duration_factors: tuple[float, ...] = ()


@dataclass
class JobRecord:
    gpu: int
    job: DeviceJob
    end: float


@dataclass
class SimResult:
    requests: list[FleetRequest]
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
            "requests": len(self.requests),
            "dropped": self.dropped,
            "latency_p50_ms": 1e3 * self.latency_p50_s,
            "latency_p99_ms": 1e3 * self.latency_p99_s,
            "worst_robot_attainment": min(self.per_robot.values(), default=1.0),
        }


def make_device(config: SimConfig, lut: ProfileTable) -> QueuedDevice:
    try:
        cls = DESIGNS[config.design]
    except KeyError:
        raise ValueError(f"unknown design {config.design!r}; choose from {sorted(DESIGNS)}") from None
    return cls(
        lut,
        policy=config.policy,
        max_batch=config.max_batch,
        guard=config.guard,
        drop_expired=config.drop_expired,
    )


def make_arrivals(robots: list[RobotSpec], config: SimConfig) -> list[FleetRequest]:
    """Every robot's requests in ``[0, duration_s)``: seeded random phase, then one per period, each delayed by
    up to ``jitter`` periods.
    The real executor replays the same list on the wall clock, so a simulation and a real run see the same
    arrivals."""
    rng = np.random.default_rng(config.seed)
    requests: list[FleetRequest] = []
    ids = itertools.count()
    for robot in robots:
        t = float(rng.uniform(0.0, robot.period_s))
        while t < config.duration_s:
            arrival = t + (float(rng.uniform(0.0, config.jitter * robot.period_s)) if config.jitter else 0.0)
            requests.append(
                FleetRequest(next(ids), robot.robot_id, robot.model_id, arrival, arrival + robot.slo_s)
            )
            t += robot.period_s
    return requests


def simulate(
    robots: list[RobotSpec],
    gpu_of: dict[str, int],
    lut: ProfileTable,
    config: SimConfig = SimConfig(),
    keep_log: bool = False,
) -> SimResult:
    """Run the fleet until every request generated in ``[0, duration_s)`` has finished or been dropped."""
    n_gpus = max(gpu_of.values(), default=-1) + 1
    devices = [make_device(config, lut) for _ in range(n_gpus)]
    requests = make_arrivals(robots, config)
    events: list[tuple[float, int, int, object]] = []  # (time, kind: 0 finish / 1 arrival, seq, payload)
    seq = itertools.count()
    for request in requests:
        heapq.heappush(events, (request.arrival, 1, next(seq), request))
    jobs: list[JobRecord] = []
    arrivals: list[tuple[float, int]] = []
    factors = np.asarray(config.duration_factors, dtype=float)
    started = 0
    while events:
        now = events[0][0]
        touched: set[int] = set()
        while events and events[0][0] <= now:
            _, kind, _, payload = heapq.heappop(events)
            if kind == 0:
                record: JobRecord = payload
                devices[record.gpu].finish(record.job, now)
                touched.add(record.gpu)
            else:
                request: FleetRequest = payload
                gpu = gpu_of[request.robot_id]
                devices[gpu].submit(request)
                touched.add(gpu)
                if keep_log:
                    arrivals.append((now, request.request_id))
        for gpu in sorted(touched):
            for job in devices[gpu].start(now):
                duration = job.duration(config.interference)
                if factors.size:
                    duration *= float(factors[started % factors.size])
                started += 1
                record = JobRecord(gpu, job, now + duration)
                heapq.heappush(events, (record.end, 0, next(seq), record))
                if keep_log:
                    jobs.append(record)
    return summarize(robots, requests, sum(len(d.dropped) for d in devices), jobs, arrivals)


def summarize(robots, requests, dropped: int, jobs=(), arrivals=()) -> SimResult:
    """Per-robot and overall SLO attainment and latency percentiles of finished/dropped requests."""
    met: dict[str, list[bool]] = {r.robot_id: [] for r in robots}
    for request in requests:
        met[request.robot_id].append(request.met_slo)
    per_robot = {rid: (float(np.mean(flags)) if flags else 1.0) for rid, flags in met.items()}
    latencies = [r.latency for r in requests if r.finish is not None]
    overall = float(np.mean([r.met_slo for r in requests])) if requests else 1.0
    p50, p99 = (percentile(latencies, q, float("nan")) for q in (0.5, 0.99))
    return SimResult(requests, per_robot, overall, p50, p99, dropped, list(jobs), list(arrivals))
