"""How a checkpoint's state and actions are normalized: a mode per feature, its statistics and the formulas.

The modes are LeRobot's `NormalizationMode` (`lerobot/configs/types.py` lines 34-39): `MEAN_STD`, `MIN_MAX`,
`QUANTILES`, `QUANTILE10`, `IDENTITY`. A LeRobot policy picks one per feature type (`STATE`, `ACTION`, `VISUAL`,
its `norm_map`); the state feature `observation.state` has type STATE, `action` type ACTION. The formulas follow
the stack the checkpoint was trained with, eps included (`convention`):

- `lerobot` (`lerobot/processor/normalize_processor.py` at LeRobot 7427f31, `_apply_transform`, lines 329-421;
  eps default 1e-8, line 97, or the pipeline step's `eps`):
  IDENTITY, or a feature without stats: unchanged (lines 329-331);
  MEAN_STD: `(x - mean) / (std + eps)`, back `y * std + mean` (no eps on the way back; lines 349-362);
  MIN_MAX: `d = max - min`, eps where d == 0; `2 (x - min) / d - 1`, back `(y + 1) / 2 * d + min` (lines 364-384);
  QUANTILES: the same with q01, q99 (lines 386-401); QUANTILE10: with q10, q90 (lines 403-418).
- `openpi` (`src/openpi/transforms.py` at openpi 15a9616, lines 137-145 and 170-181; pi0.5 trains with quantiles,
  `training/config.py` line 187): MEAN_STD `(x - mean) / (std + 1e-6)`, back `y * (std + 1e-6) + mean`;
  QUANTILES `(x - q01) / (q99 - q01 + 1e-6) * 2 - 1`, back `(y + 1) / 2 * (q99 - q01 + 1e-6) + q01`.

Only the first dims of a statistic wider than the robot's vector are used (the stats may be the model's width).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

# {"observation.state": {"q01": array, "q99": array, ...}, "action": {...}} as in LeRobot's stats files.
NormStats = dict[str, dict[str, np.ndarray]]
STATE_KEY = "observation.state"
ACTION_KEY = "action"
FEATURE_TYPES = {STATE_KEY: "STATE", ACTION_KEY: "ACTION"}

MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10, IDENTITY = "MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10", "IDENTITY"
MODES = (MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10, IDENTITY)
# The statistics each mode reads: (the low or centre, the high or spread).
REQUIRED = {MEAN_STD: ("mean", "std"), MIN_MAX: ("min", "max"), QUANTILES: ("q01", "q99"),
            QUANTILE10: ("q10", "q90"), IDENTITY: ()}
LEROBOT, OPENPI = "lerobot", "openpi"
CONVENTION_MODES = {LEROBOT: MODES, OPENPI: (MEAN_STD, QUANTILES)}
LEROBOT_EPS = 1e-8
OPENPI_EPS = 1e-6


def _default_modes() -> dict[str, str]:
    return {STATE_KEY: QUANTILES, ACTION_KEY: QUANTILES}  # pi0.5's in both stacks


@dataclass(frozen=True)
class Normalization(Mapping):
    """A checkpoint's statistics (read as a mapping feature -> {stat: vector}) with the mode of each feature, the
    eps and the convention (`LEROBOT` or `OPENPI`) that say how they are applied."""

    stats: NormStats
    modes: dict[str, str] = field(default_factory=_default_modes)
    eps: float = LEROBOT_EPS
    convention: str = LEROBOT

    def __getitem__(self, feature: str) -> dict[str, np.ndarray]:
        return self.stats[feature]

    def __iter__(self) -> Iterator[str]:
        return iter(self.stats)

    def __len__(self) -> int:
        return len(self.stats)

    def mode(self, feature: str) -> str:
        return self.modes.get(feature, IDENTITY)

    def width(self, feature: str) -> int | None:
        """How many dims the feature's statistics cover; None for IDENTITY (any width)."""
        needed = REQUIRED[self.mode(feature)]
        return int(np.asarray(self.stats[feature][needed[0]]).size) if needed else None

    def normalize(self, feature: str, x: np.ndarray) -> np.ndarray:
        """Raw values (last axis: the feature's dims) -> the model's."""
        return self._apply(feature, np.asarray(x, dtype=np.float64), inverse=False)

    def unnormalize(self, feature: str, y: np.ndarray) -> np.ndarray:
        """The model's values -> raw ones."""
        return self._apply(feature, np.asarray(y, dtype=np.float64), inverse=True)

    def describe(self) -> str:
        modes = ", ".join(f"{feature} {self.mode(feature)}" for feature in (STATE_KEY, ACTION_KEY))
        return f"{modes} ({self.convention}'s formulas, eps {self.eps:g})"

    def _apply(self, feature: str, x: np.ndarray, inverse: bool) -> np.ndarray:
        mode = self.mode(feature)
        if mode == IDENTITY:
            return x
        low_name, high_name = REQUIRED[mode]
        low, high = (_first(self.stats[feature], name, x.shape[-1]) for name in (low_name, high_name))
        if mode == MEAN_STD:
            mean, std = low, high
            if inverse:  # LeRobot adds no eps on the way back, openpi does
                return x * (std + self.eps if self.convention == OPENPI else std) + mean
            return (x - mean) / (std + self.eps)
        if self.convention == OPENPI:  # QUANTILES
            span = high - low + self.eps
            return (x + 1.0) / 2.0 * span + low if inverse else (x - low) / span * 2.0 - 1.0
        span = np.where(high - low == 0, self.eps, high - low)
        return (x + 1.0) * span / 2.0 + low if inverse else 2.0 * (x - low) / span - 1.0


def as_normalization(norm: Normalization | Mapping | None) -> Normalization | None:
    """`norm` as a `Normalization`: plain stats get pi0.5's quantiles with LeRobot's formulas (what a folder
    `save_checkpoint` writes declares)."""
    if norm is None or isinstance(norm, Normalization):
        return norm
    return Normalization(dict(norm))


def _first(stats: Mapping[str, np.ndarray], name: str, dims: int) -> np.ndarray:
    value = np.asarray(stats[name], dtype=np.float64).reshape(-1)
    if value.size < dims:
        raise ValueError(f"norm stat {name} has {value.size} dims, need {dims}")
    return value[:dims]
