"""How long a batched decode step takes as a function of its batch size, learned online.

Adaptive k only decodes in the slack the action leaves in a control period, so the scheduler must predict a
step's time before running it (and earliest-SLO-first an action's). A step costs a fixed part (one pass over the
weights, kernel launches) plus a small part per request; both are fitted by least squares on the recent (batch, seconds) observations. Until two different batch
sizes have been seen, the fixed part is assumed to dominate (true for small batches on both CPUs and GPUs).
"""

from __future__ import annotations

from collections import deque


class StepCostModel:
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
