"""Does a policy see the cube? Its first chunk on transfer_cube, against the scripted plan's, as a function of where
the cube is.

Every episode starts at the same joint state, so at the first frame only the camera tells where the cube is: a
policy that localizes it plans its first chunk as a function of the cube's position, as the scripted demonstrations
do (their targets are a near-linear function of the cube's x and y over the first second). The probe fits, per
right-arm joint, a linear function from the cube's (x, y) to the chunk's last target, and reports how much of the
targets' spread across episodes it explains (R^2), for the policy and for the scripted plan on the same seeds, and
the policy's mean distance to the scripted targets over the chunk. A policy near R^2 = 0 plans the same reach
whatever the camera shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

RIGHT_ARM = slice(7, 13)  # ALOHA's 14 joint targets: left arm 0-5, left gripper 6, right arm 7-12, right gripper 13
RIGHT_ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate")


def explained_variance(features: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """R^2 of the least-squares fit `targets ~ features @ w + b`, per target column ([n, k], [n, m] -> [m]); a
    column that does not vary across the rows has nothing to explain: 0."""
    features, targets = np.asarray(features, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    design = np.column_stack([features, np.ones(len(features))])
    weights, *_ = np.linalg.lstsq(design, targets, rcond=None)
    residual = ((targets - design @ weights) ** 2).sum(axis=0)
    spread = ((targets - targets.mean(axis=0)) ** 2).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(spread > 1e-12, 1.0 - residual / spread, 0.0)


@dataclass
class Probe:
    seeds: list[int]
    cube_xy: np.ndarray  # [n, 2] the cube's position on the table (m)
    policy: np.ndarray  # [n, 6] the policy's last right-arm target of its first chunk
    scripted: np.ndarray  # [n, 6] the scripted plan's target at the same step
    gap_rad: float  # mean |policy - scripted| over the chunk's steps and the right arm's joints

    @property
    def policy_r2(self) -> np.ndarray:
        return explained_variance(self.cube_xy, self.policy)

    @property
    def scripted_r2(self) -> np.ndarray:
        return explained_variance(self.cube_xy, self.scripted)

    def as_dict(self) -> dict:
        return {"seeds": self.seeds, "cube_xy": self.cube_xy.tolist(), "policy_last": self.policy.tolist(),
                "scripted_last": self.scripted.tolist(), "policy_r2": self.policy_r2.tolist(),
                "scripted_r2": self.scripted_r2.tolist(), "gap_rad": self.gap_rad}


def probe_first_chunks(first_chunk: Callable[[int], np.ndarray], scripted_plan: Callable[[int], np.ndarray],
                       cube_xy: Callable[[int], np.ndarray], seeds: Sequence[int]) -> Probe:
    """`first_chunk(seed)`: the policy's [H, 14] chunk at the episode's first frame; `scripted_plan(seed)`: the
    scripted [T >= H, 14] joint targets of that episode; `cube_xy(seed)`: where the cube is."""
    if len(seeds) < 4:
        raise ValueError(f"a fit on the cube's x and y needs at least 4 episodes, got {len(seeds)}")
    last_policy, last_script, gaps, cubes = [], [], [], []
    for seed in seeds:
        chunk = np.asarray(first_chunk(seed), dtype=np.float64)
        plan = np.asarray(scripted_plan(seed), dtype=np.float64)[: len(chunk)]
        if plan.shape != chunk.shape:
            raise ValueError(f"seed {seed}: the chunk is {chunk.shape}, the scripted plan's first steps {plan.shape}")
        last_policy.append(chunk[-1, RIGHT_ARM])
        last_script.append(plan[-1, RIGHT_ARM])
        gaps.append(np.abs(chunk[:, RIGHT_ARM] - plan[:, RIGHT_ARM]).mean())
        cubes.append(np.asarray(cube_xy(seed), dtype=np.float64)[:2])
    return Probe(list(seeds), np.array(cubes), np.array(last_policy), np.array(last_script), float(np.mean(gaps)))


def probe_lines(probe: Probe, horizon: int) -> list[str]:
    lines = [f"the first chunk ({horizon} steps) at the start pose on {len(probe.seeds)} seeds: how much of its "
             "last right-arm target a linear fit on the cube's x, y explains (R^2)",
             f"  {'joint':<14}{'policy':>8}{'scripted':>10}"]
    for name, ours, theirs in zip(RIGHT_ARM_JOINTS, probe.policy_r2, probe.scripted_r2, strict=True):
        lines.append(f"  {name:<14}{ours:>8.2f}{theirs:>10.2f}")
    lines.append(f"  {'mean':<14}{probe.policy_r2.mean():>8.2f}{probe.scripted_r2.mean():>10.2f}")
    lines.append(f"  mean distance to the scripted targets over the chunk: {probe.gap_rad:.3f} rad")
    return lines
