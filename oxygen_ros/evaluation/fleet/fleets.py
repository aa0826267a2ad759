"""Synthetic fleets for the simulator and the fleet-sim command: robots, their models, rates and SLOs.

Robot ``i``'s attributes are drawn in order from one seeded generator, so the fleet of N robots is the first N
robots of the fleet of N+1: a sweep over robot counts adds robots without reshuffling the ones already there.
"""

from __future__ import annotations

import numpy as np

from ...fleet.traffic import RobotSpec


def model_ids(n_models: int) -> list[str]:
    return [f"vla{k}" for k in range(n_models)]


def model_scales(n_models: int, smallest: float = 0.7, largest: float = 1.3) -> dict[str, float]:
    """Relative compute of each model (variants / architectures of different size), evenly spread."""
    if n_models == 1:
        return {"vla0": 1.0}
    return {m: float(s) for m, s in zip(model_ids(n_models), np.linspace(smallest, largest, n_models))}


def make_fleet(
    n_robots: int,
    n_models: int,
    seed: int = 0,
    rates_hz: tuple[float, ...] = (5.0,),
    slos_s: tuple[float, ...] = (0.1, 0.2),
    popularity_skew: float = 0.8,
) -> list[RobotSpec]:
    """Robots with models drawn by a Zipf-like popularity (weight of model k ~ 1/(k+1)**skew), so some models are
    much more in demand than others, and a mix of latency budgets (tight and loose SLOs)."""
    rng = np.random.default_rng(seed)
    models = model_ids(n_models)
    weights = 1.0 / np.arange(1, n_models + 1) ** popularity_skew
    weights /= weights.sum()
    robots = []
    for i in range(n_robots):
        model = models[int(rng.choice(n_models, p=weights))]
        rate = float(rates_hz[int(rng.integers(len(rates_hz)))])
        slo = float(slos_s[int(rng.integers(len(slos_s)))])
        robots.append(RobotSpec(f"robot{i}", model, rate, slo))
    return robots
