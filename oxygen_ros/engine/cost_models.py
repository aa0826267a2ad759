"""Predicted seconds of work: the cost models the scheduler plans with, and the online fit behind the learned one.

Adaptive k only decodes in the slack the action leaves in a control period, so the scheduler must predict a decode
step's time before running it (and earliest-SLO-first an action batch's). A robot's node learns both online
(`LearnedCost`): a batch costs a fixed part (one pass over the weights, kernel launches) plus a small part per item,
both fitted by least squares on the recent (batch, seconds) observations (`StepCostModel`). Until two different
batch sizes have been seen, the fixed part is assumed to dominate (true for small batches on CPUs and GPUs).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol


class StepCostModel:
    """Seconds of one kind of batch as fixed + per item, fitted on a window of recent observations."""

    def __init__(self, window: int = 64):
        self._samples: deque[tuple[int, float]] = deque(maxlen=window)

    def observe(self, batch: int, seconds: float) -> None:
        self._samples.append((batch, seconds))

    def _fit(self) -> tuple[float, float]:
        """(fixed seconds, seconds per request); per-request cost never negative."""
        n = len(self._samples)
        mean_b = sum(b for b, _ in self._samples) / n
        mean_t = sum(t for _, t in self._samples) / n
        spread = sum((b - mean_b) ** 2 for b, _ in self._samples)
        if spread == 0:
            return mean_t, 0.0
        slope = max(0.0, sum((b - mean_b) * (t - mean_t) for b, t in self._samples) / spread)
        return max(0.0, mean_t - slope * mean_b), slope

    def predict(self, batch: int) -> float:
        """Expected seconds for a step over `batch` requests (0 before any observation)."""
        if not self._samples:
            return 0.0
        fixed, per_request = self._fit()
        return fixed + per_request * batch


class CostModel(Protocol):
    """Predicted seconds of work: fits of the runner's measurements (`LearnedCost`), or a profile table
    (`fleet/profile_table.ProfileCost`: a fleet server that profiled its models, and the simulator).
    `action_s`: a batch's prefill + denoising in one call, on `action_share` of the device."""

    def action_s(self, model_id: str, batch: int) -> float: ...

    def action_share(self, model_id: str, batch: int) -> float:
        """The share of the device such a call runs fastest on (1.0: all of it)."""
        ...

    def decode_s(self, model_id: str, batch: int) -> float: ...

    def observe(self, model_id: str, kind: str, batch: int, seconds: float) -> None:
        """A measured batch of `kind` ("action" or "decode")."""


class LearnedCost:
    """Per model, per kind of work: a fixed + per-item fit of recent observations (`StepCostModel`)."""

    def __init__(self):
        self._fits: dict[tuple[str, str], StepCostModel] = {}

    def _fit(self, model_id: str, kind: str) -> StepCostModel:
        return self._fits.setdefault((model_id, kind), StepCostModel())

    def observe(self, model_id: str, kind: str, batch: int, seconds: float) -> None:
        self._fit(model_id, kind).observe(batch, seconds)

    def action_s(self, model_id: str, batch: int) -> float:
        return self._fit(model_id, "action").predict(batch)

    def action_share(self, model_id: str, batch: int) -> float:
        return 1.0  # measured on the whole device only

    def decode_s(self, model_id: str, batch: int) -> float:
        return self._fit(model_id, "decode").predict(batch)
