"""How many robots a design serves at a target SLO attainment (98 %), and how sure that figure is.

One simulated run is one draw: robots' phases and jitter come from a seed, and near the knee of the attainment
curve two seeds can differ by several robots. So the count is found per seed by bisection over the robot count
(the largest count whose attainment reaches the target, assuming attainment does not rise with more robots;
`bisect_robots` checks the count it returns and the next one), and reported over several seeds as median, min
and max, with the worst robot's attainment at that count (a fleet can reach 98 % overall while one robot gets far
less).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


def bisect_robots(attainment_of: Callable[[int], Point], high: int, target: float = TARGET,
                  low: int = 1) -> tuple[int, Point | None, Point | None, int]:
    """The largest n in [low, high] with attainment_of(n).attainment >= target, by bisection; returns
    (n or low - 1, the point at n, the point at n + 1 or None when n == high, runs)."""
    if low < 1 or high < low:
        raise ValueError("need 1 <= low <= high")
    seen: dict[int, Point] = {}

    def ok(n: int) -> bool:
        if n not in seen:
            seen[n] = attainment_of(n)
        return seen[n].attainment >= target

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

    @property
    def counts(self) -> list[int]:
        return [s.robots for s in self.per_seed]

    def summary(self) -> dict:
        counts = self.counts
        worst = [s.at.worst_robot for s in self.per_seed if s.at is not None]
        return {
            "target": self.target,
            "robots_median": statistics.median(counts),
            "robots_min": min(counts),
            "robots_max": max(counts),
            "robots_per_seed": counts,
            "worst_robot_attainment_min": min(worst, default=float("nan")),
            "capped": any(s.above is None and s.robots > 0 for s in self.per_seed),
            "runs": sum(s.runs for s in self.per_seed),
        }


def capacity(run: Callable[[int, int], Point], seeds: Sequence[int], high: int, target: float = TARGET) -> Capacity:
    """`run(robots, seed)` -> Point; the bisection per seed."""
    if not seeds:
        raise ValueError("need at least one seed")
    per_seed = []
    for seed in seeds:
        n, at, above, runs = bisect_robots(lambda robots, seed=seed: run(robots, seed), high, target)
        per_seed.append(SeedCapacity(seed, n, at, above, runs))
    return Capacity(tuple(per_seed), target)
