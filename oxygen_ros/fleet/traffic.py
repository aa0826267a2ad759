"""Traffic controller: which GPU serves which robot.

A robot's load on a GPU is its frame rate times the per-frame service time from the profile; a GPU's
normalized load is the sum over its robots divided by its capacity and must stay <= 1. The MILP first spreads
the load (a per-GPU load cap a little above the mean GPU load), then, among placements under that cap, keeps robots of the same model together (fewest (model, GPU) pairs), because a
model's requests can only be batched with requests of the same model on the same GPU, and fewer resident models
also means less memory. Ties are broken by the lowest maximum GPU load. Balancing first matters when there are
fewer models than GPUs: fewest pairs alone would leave a GPU idle and load the others up to the capacity. Two simple baselines are provided for
comparison: an even split (every model spread over every GPU) and one model per GPU.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .co_run import DEFAULT_GUARD
from .lockstep import choose_partition
from .profile_table import ProfileTable

if TYPE_CHECKING:  # scipy is imported where a MILP is built: the simulator (fleet-bench) needs only RobotSpec here
    from scipy.optimize import LinearConstraint


@dataclass(frozen=True)
class RobotSpec:
    """A robot as the fleet's placement sees it: which model it needs, how often it sends a frame, and its latency
    budget (SLO)."""

    robot_id: str
    model_id: str
    rate_hz: float
    slo_s: float

    @property
    def period_s(self) -> float:
        return 1.0 / self.rate_hz


class InfeasibleAssignment(ValueError):
    """The robots' demand cannot be placed on the GPUs without some GPU's load exceeding its capacity."""


@dataclass
class Assignment:
    """Robot -> GPU placement with the resulting normalized GPU loads."""

    method: str
    gpu_of: dict[str, int]
    model_of: dict[str, str]
    loads: list[float]
    capacity: float = 1.0
    optimal: bool = True
    load_cap: float | None = None  # the balanced per-GPU load limit the MILP placed under

    @property
    def model_gpu_pairs(self) -> list[tuple[str, int]]:
        """(model, GPU) pairs in use: each is one resident model copy with its own queues."""
        return sorted({(self.model_of[r], g) for r, g in self.gpu_of.items()})

    @property
    def pairs(self) -> int:
        return len(self.model_gpu_pairs)

    @property
    def max_load(self) -> float:
        return max(self.loads, default=0.0)


def load_assignment(path: str | Path) -> dict:
    """The assignment JSON; ``gpu_of`` maps robot id -> GPU index."""
    data = json.loads(Path(path).read_text())
    if "gpu_of" not in data:
        raise ValueError(f"{path}: not an assignment file (no 'gpu_of')")
    data["gpu_of"] = {robot: int(gpu) for robot, gpu in data["gpu_of"].items()}
    return data


def per_frame_cost(lut: ProfileTable, model_id: str, batch: int, guard: float = DEFAULT_GUARD) -> float:
    """Device-seconds one frame of ``model_id`` costs when served in lockstep batches of ``batch``: one lockstep
    carries ``batch`` VLM and ``batch`` action frames, so a frame costs lockstep time / batch."""
    choice = choose_partition(lut, (model_id, batch), (model_id, batch), guard)
    return choice.predicted_s / batch


def robot_loads(robots: list[RobotSpec], lut: ProfileTable, batch: int = 4, guard: float = DEFAULT_GUARD) -> np.ndarray:
    """Fraction of one GPU each robot needs (rate x per-request cost at the reference ``batch``)."""
    cost = {m: per_frame_cost(lut, m, batch, guard) for m in {r.model_id for r in robots}}
    return np.array([r.rate_hz * cost[r.model_id] for r in robots])


def _assignment(
    method: str,
    robots: list[RobotSpec],
    loads: np.ndarray,
    gpus: list[int],
    n_gpus: int,
    capacity: float = 1.0,
) -> Assignment:
    per_gpu = [0.0] * n_gpus
    for robot_load, gpu in zip(loads, gpus):
        per_gpu[gpu] += float(robot_load)
    gpu_of = {r.robot_id: g for r, g in zip(robots, gpus)}
    return Assignment(method, gpu_of, {r.robot_id: r.model_id for r in robots}, per_gpu, capacity)


class LinearRows:
    """The linear constraints of a mixed-integer program, a row at a time: low <= sum(coeffs[i] * x[i]) <= high,
    the coefficients given by variable index (the rest zero)."""

    def __init__(self, n_vars: int):
        self.n_vars = n_vars
        self.rows: list[np.ndarray] = []
        self.low: list[float] = []
        self.high: list[float] = []

    def add(self, coeffs: dict[int, float], low: float, high: float) -> None:
        row = np.zeros(self.n_vars)
        for index, value in coeffs.items():
            row[index] = value
        self.rows.append(row)
        self.low.append(low)
        self.high.append(high)

    def constraint(self) -> LinearConstraint:
        from scipy.optimize import LinearConstraint

        return LinearConstraint(np.array(self.rows), self.low, self.high)


def assign_milp(
    robots: list[RobotSpec],
    loads: np.ndarray,
    n_gpus: int,
    capacity: float = 1.0,
    max_models_per_gpu: int | None = None,
    time_limit_s: float = 10.0,
    balance_slack: float = 0.1,
    previous: dict[str, int] | None = None,
) -> Assignment:
    """Every robot placed, every GPU load <= capacity; lexicographic objective:

    1. spread the load: a per-GPU load cap ``B x (1 + balance_slack)**k`` with B = max(mean GPU load, heaviest
       robot) (a lower bound on any placement's maximum load) and the smallest k >= 1 for which some placement
       fits, never above ``capacity``;
    2. fewest (model, GPU) pairs among placements under that cap;
    3. ties -> lowest maximum load.

    Robots with the same model and the same load are interchangeable, so they form one class and the program
    counts them instead of naming them (far fewer variables and no symmetry between identical robots):
    n[c, g] >= 0 integer robots of class c on GPU g, y[m, g] binary model m resident on GPU g, L >= every GPU
    load. Steps 2-3 minimize sum(y) + eps * L with eps * L < 1 under the cap of step 1.

    ``previous`` (robot -> GPU, a placement in force): a class's robots keep their GPU wherever the new counts
    allow, so a re-solve moves only as many robots as the new counts require (among the optimal placements of
    classes, not the one with fewest moves)."""
    loads = np.asarray(loads, dtype=float)
    if len(robots) == 0:
        return _assignment("milp", robots, loads, [], n_gpus, capacity)
    if (loads > capacity).any():
        worst = robots[int(np.argmax(loads))].robot_id
        raise InfeasibleAssignment(
            f"robot {worst} alone needs {loads.max():.2f} of a GPU (capacity {capacity})"
        )
    if balance_slack <= 0:
        raise ValueError("balance_slack must be > 0")
    members: dict[tuple[str, float], list[int]] = defaultdict(list)
    for i, robot in enumerate(robots):
        members[(robot.model_id, round(float(loads[i]), 12))].append(i)
    classes = sorted(members)
    models = sorted({m for m, _ in classes})
    n_c, n_g, n_m = len(classes), n_gpus, len(models)
    n_n = n_c * n_g
    n_vars = n_n + n_m * n_g + 1
    col_n = lambda c, g: c * n_g + g  # noqa: E731
    col_y = lambda m, g: n_n + m * n_g + g  # noqa: E731
    col_l = n_vars - 1

    def solve(cap: float, pairs_cost: float, load_cost: float):
        rows = LinearRows(n_vars)
        constrain = rows.add
        for c, key in enumerate(classes):
            constrain({col_n(c, g): 1.0 for g in range(n_g)}, len(members[key]), len(members[key]))
            m = models.index(key[0])
            for g in range(n_g):
                constrain({col_n(c, g): 1.0, col_y(m, g): -len(members[key])}, -np.inf, 0.0)
        for g in range(n_g):
            gpu_load = {col_n(c, g): key[1] for c, key in enumerate(classes)}
            constrain(gpu_load, -np.inf, cap)
            constrain({**gpu_load, col_l: -1.0}, -np.inf, 0.0)
            if max_models_per_gpu is not None:
                constrain({col_y(m, g): 1.0 for m in range(n_m)}, -np.inf, max_models_per_gpu)
        cost = np.zeros(n_vars)
        cost[n_n:col_l] = pairs_cost
        cost[col_l] = load_cost
        integrality = np.ones(n_vars)
        integrality[col_l] = 0
        upper_bounds = np.ones(n_vars)
        for c, key in enumerate(classes):
            upper_bounds[c * n_g : (c + 1) * n_g] = len(members[key])
        upper_bounds[col_l] = np.inf
        from scipy.optimize import Bounds, milp

        return milp(
            cost,
            integrality=integrality,
            bounds=Bounds(np.zeros(n_vars), upper_bounds),
            constraints=rows.constraint(),
            options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9},
        )

    def check(result) -> None:
        if result.status == 2:
            raise InfeasibleAssignment(
                f"{len(robots)} robots need {loads.sum():.2f} GPUs of load in total; {n_g} GPUs at capacity "
                f"{capacity}"
                + (f" with at most {max_models_per_gpu} models each" if max_models_per_gpu else "")
                + " cannot hold them"
            )
        if result.x is None:
            raise InfeasibleAssignment(f"no placement found within {time_limit_s} s ({result.message})")

    # The balanced load cap: the lower bound on the maximum load (the mean GPU load, or the heaviest robot),
    # raised in (1 + balance_slack) steps until some placement fits under it. (Minimizing the maximum load
    # exactly is slow to prove for a solver: GPUs are interchangeable, so it explores many equal placements.)
    step = 1.0 + balance_slack
    cap = min(capacity, max(float(loads.sum()) / n_g, float(loads.max())) * (1.0 + balance_slack))
    while True:
        result = solve(cap + 1e-9, 1.0, 0.5 / max(cap, 1e-12))
        if result.status != 2 or cap >= capacity:
            break
        cap = min(capacity, cap * step)
    check(result)
    counts = np.rint(result.x[:n_n]).astype(int).reshape(n_c, n_g)
    gpus = [0] * len(robots)
    previous = previous or {}
    for c, key in enumerate(classes):
        free = {g: int(counts[c, g]) for g in range(n_g)}
        unplaced = []
        for i in members[key]:
            g = previous.get(robots[i].robot_id)
            if g is not None and free.get(g, 0) > 0:
                gpus[i] = g
                free[g] -= 1
            else:
                unplaced.append(i)
        slots = [g for g in range(n_g) for _ in range(free[g])]
        for i, g in zip(unplaced, slots, strict=True):
            gpus[i] = g
    assignment = _assignment("milp", robots, loads, gpus, n_gpus, capacity)
    assignment.optimal = result.status == 0
    assignment.load_cap = cap
    return assignment


def assign_milp_relaxed(
    robots: list[RobotSpec],
    loads: np.ndarray,
    n_gpus: int,
    capacity: float = 1.0,
    step: float = 1.05,
    **kwargs,
) -> Assignment:
    """``assign_milp`` at ``capacity``; when that is infeasible (an overloaded sweep point), raise the capacity in
    ``step`` increments from the tightest possible value until a placement exists. The returned assignment's
    ``capacity`` says how far it had to go, so an overload is reported, never hidden."""
    try:
        return assign_milp(robots, loads, n_gpus, capacity=capacity, **kwargs)
    except InfeasibleAssignment:
        pass
    kwargs.setdefault("time_limit_s", 2.0)
    capacity = max(capacity, float(np.max(loads)), float(np.sum(loads)) / n_gpus) * step
    while capacity <= float(np.sum(loads)) * step:
        try:
            return assign_milp(robots, loads, n_gpus, capacity=capacity, **kwargs)
        except InfeasibleAssignment:
            capacity *= step
    raise InfeasibleAssignment(
        "no placement exists at any capacity (too many models for the per-GPU model limit)"
    )


def assign_even_split(robots: list[RobotSpec], loads: np.ndarray, n_gpus: int) -> Assignment:
    """Deal robots to GPUs in turn, model by model: load-balanced by count, every model spread everywhere."""
    order = sorted(range(len(robots)), key=lambda i: (robots[i].model_id, robots[i].robot_id))
    gpus = [0] * len(robots)
    for position, index in enumerate(order):
        gpus[index] = position % n_gpus
    return _assignment("even", robots, np.asarray(loads), gpus, n_gpus)


def assign_one_model_per_gpu(robots: list[RobotSpec], loads: np.ndarray, n_gpus: int) -> Assignment:
    """Each GPU serves whole models only. With more models than GPUs, models are packed heaviest first onto the
    least-loaded GPU; with fewer, the spare GPUs go to the models with the highest load per GPU and a model's
    robots are spread over its own GPUs."""
    loads = np.asarray(loads, dtype=float)
    model_load: dict[str, float] = defaultdict(float)
    members: dict[str, list[int]] = defaultdict(list)
    for i, robot in enumerate(robots):
        model_load[robot.model_id] += loads[i]
        members[robot.model_id].append(i)
    by_load = sorted(model_load, key=lambda m: (-model_load[m], m))
    gpus_of: dict[str, list[int]] = {}
    if len(by_load) >= n_gpus:
        gpu_load = [0.0] * n_gpus
        for model_id in by_load:
            g = min(range(n_gpus), key=lambda k: (gpu_load[k], k))
            gpus_of[model_id] = [g]
            gpu_load[g] += model_load[model_id]
    else:
        counts = {m: 1 for m in by_load}
        for _ in range(n_gpus - len(by_load)):
            neediest = max(by_load, key=lambda m: (model_load[m] / counts[m], m))
            counts[neediest] += 1
        next_gpu = 0
        for model_id in by_load:
            gpus_of[model_id] = list(range(next_gpu, next_gpu + counts[model_id]))
            next_gpu += counts[model_id]
    gpus = [0] * len(robots)
    for model_id, indices in members.items():
        own = gpus_of[model_id]
        own_load = dict.fromkeys(own, 0.0)
        for i in sorted(indices, key=lambda i: -loads[i]):
            g = min(own, key=lambda k: (own_load[k], k))
            gpus[i] = g
            own_load[g] += loads[i]
    return _assignment("one_model_per_gpu", robots, loads, gpus, n_gpus)
