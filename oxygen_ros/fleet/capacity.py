"""How many robots a design serves at a target SLO attainment (98 %), and how sure that figure is.

One simulated run is one draw: robots' phases and jitter come from a seed, and near the knee of the attainment
curve two seeds can differ by several robots. So the count is found per seed by bisection over the robot count
(the largest count whose attainment reaches the target, assuming attainment does not rise with more robots;
`bisect_robots` checks the count it returns and the next one), and reported over several seeds as median, min
and max, with the worst robot's attainment at that count (a fleet can reach 98 % overall while one robot gets far
less).

The traffic controller's loads come from the same search (`SloSafeLoads`): a robot's load is 1 / the number of
robots like it (same model, rate and SLO) that one device serves at the target on its own, in the simulator on
the profiled table, the fewest over seeds. A device holding robots of one class is then SLO-safe at load <= 1 by
construction; robots of several classes sum their fractions, which is optimistic (several models on a device
batch less and take turns). `place_slo_safe` therefore checks a placement in the simulator and lowers the
capacity until every device reaches the target on every seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .profile_table import ProfileTable
from .simulator import SimConfig, simulate
from .traffic import Assignment, InfeasibleAssignment, RobotSpec, assign_milp

TARGET = 0.98


def robots_at_target(points: dict[int, float], target: float = TARGET) -> int:
    """On a grid of robot counts -> attainment: the largest count such that it and every smaller count reach
    ``target`` (0 if none)."""
    served = 0
    for n in sorted(points):
        if points[n] < target:
            break
        served = n
    return served


@dataclass(frozen=True)
class Point:
    """One simulated (or served) robot count: overall and worst-robot attainment."""

    robots: int
    attainment: float
    worst_robot: float


@dataclass(frozen=True)
class SeedCapacity:
    seed: int
    robots: int  # largest count at the target (0: not even one robot)
    at: Point | None  # that count's run (None when robots == 0)
    above: Point | None  # the next count's run, which missed (None when the search hit its upper bound)
    runs: int  # simulations the bisection needed


CRITERIA = ("overall", "worst_robot")
"""What must reach the target: the fleet's attainment, or every robot's (the worst robot's)."""


def bisect_robots(attainment_of: Callable[[int], Point], high: int, target: float = TARGET,
                  low: int = 1, criterion: str = "overall") -> tuple[int, Point | None, Point | None, int]:
    """The largest n in [low, high] whose point reaches ``target`` (overall or worst-robot attainment, by
    ``criterion``), by bisection; returns (n or low - 1, the point at n, the point at n + 1 or None when
    n == high, runs)."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    if low < 1 or high < low:
        raise ValueError("need 1 <= low <= high")
    seen: dict[int, Point] = {}

    def ok(n: int) -> bool:
        if n not in seen:
            seen[n] = attainment_of(n)
        point = seen[n]
        return (point.attainment if criterion == "overall" else point.worst_robot) >= target

    if ok(high):
        return high, seen[high], None, len(seen)
    if not ok(low):
        return low - 1, None, seen[low], len(seen)
    good, bad = low, high  # invariant: ok(good), not ok(bad)
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, seen[good], seen[bad], len(seen)


@dataclass(frozen=True)
class Capacity:
    """Robots at the target over seeds."""

    per_seed: tuple[SeedCapacity, ...]
    target: float = TARGET
    criterion: str = "overall"

    @property
    def counts(self) -> list[int]:
        return [s.robots for s in self.per_seed]

    def summary(self) -> dict:
        counts = self.counts
        worst = [s.at.worst_robot for s in self.per_seed if s.at is not None]
        return {
            "target": self.target,
            "criterion": self.criterion,
            "robots_median": statistics.median(counts),
            "robots_min": min(counts),
            "robots_max": max(counts),
            "robots_per_seed": counts,
            "worst_robot_attainment_min": min(worst, default=float("nan")),
            "capped": any(s.above is None and s.robots > 0 for s in self.per_seed),
            "runs": sum(s.runs for s in self.per_seed),
        }


def capacity(run: Callable[[int, int], Point], seeds: Sequence[int], high: int, target: float = TARGET,
             criterion: str = "overall") -> Capacity:
    """`run(robots, seed)` -> Point; the bisection per seed."""
    if not seeds:
        raise ValueError("need at least one seed")
    per_seed = []
    for seed in seeds:
        n, at, above, runs = bisect_robots(lambda robots, seed=seed: run(robots, seed), high, target,
                                           criterion=criterion)
        per_seed.append(SeedCapacity(seed, n, at, above, runs))
    return Capacity(tuple(per_seed), target, criterion)


class SloSafeLoads:
    """``loads(robot)`` -> the robot's SLO-safe fraction of one device (see the module docstring); each class's
    count is simulated once and kept (``counts``)."""

    def __init__(self, lut: ProfileTable, config: SimConfig, seeds: Sequence[int] = range(3), high: int = 256,
                 target: float = TARGET):
        self.lut, self.config, self.seeds, self.high, self.target = lut, config, list(seeds), high, target
        self.counts: dict[tuple[str, float, float], int] = {}

    def robots_per_device(self, model_id: str, rate_hz: float, slo_s: float) -> int:
        key = (model_id, float(rate_hz), float(slo_s))
        if key not in self.counts:
            def run(n: int, seed: int) -> Point:
                robots = [RobotSpec(f"r{i}", model_id, rate_hz, slo_s) for i in range(n)]
                result = simulate(robots, dict.fromkeys((r.robot_id for r in robots), 0), self.lut,
                                  replace(self.config, seed=seed))
                return Point(n, result.attainment, min(result.per_robot.values()))

            self.counts[key] = min(capacity(run, self.seeds, self.high, self.target).counts)
        return self.counts[key]

    def __call__(self, robot: RobotSpec) -> float:
        count = self.robots_per_device(robot.model_id, robot.rate_hz, robot.slo_s)
        return 1.0 / count if count else math.inf


@dataclass
class SafePlacement:
    assignment: Assignment  # its ``capacity`` is the load limit at which the check passed
    device_attainment: list[float]  # per device, the lowest over seeds
    worst_robot: float  # lowest per-robot attainment over seeds
    tries: int


def place_slo_safe(robots: Sequence[RobotSpec], n_devices: int, loads: SloSafeLoads, step: float = 0.9,
                   min_capacity: float = 0.3) -> SafePlacement:
    """The MILP placement at capacity 1, checked in the simulator (the loads' table, config and seeds): while
    some device misses the target on some seed, re-solve at ``step`` x the capacity. Raises InfeasibleAssignment
    when the robots do not fit even at capacity 1, or no capacity down to ``min_capacity`` passes."""
    robots = list(robots)
    vector = [loads(r) for r in robots]
    capacity_now, tries = 1.0, 0
    while capacity_now >= min_capacity:
        assignment = assign_milp(robots, vector, n_devices, capacity=capacity_now)
        tries += 1
        per_device = [1.0] * n_devices
        worst = 1.0
        for seed in loads.seeds:
            result = simulate(robots, assignment.gpu_of, loads.lut, replace(loads.config, seed=seed))
            for device in range(n_devices):
                flags = [f.met_deadline for f in result.frames if assignment.gpu_of[f.robot_id] == device]
                if flags:
                    per_device[device] = min(per_device[device], sum(flags) / len(flags))
            worst = min(worst, min(result.per_robot.values(), default=1.0))
        if min(per_device) >= loads.target:
            return SafePlacement(assignment, per_device, worst, tries)
        capacity_now *= step
    raise InfeasibleAssignment(f"no placement of {len(robots)} robots on {n_devices} devices reaches "
                               f"{loads.target:.0%} on every device down to capacity {min_capacity}")
