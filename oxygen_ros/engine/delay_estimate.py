"""The delay real-time chunking guides with: a robot's next chunk delay, in control steps, from the ones measured.

A chunk's delay is how many control steps pass between its frame's stamp and its arrival (the node knows both).
The guided sampler (`model/rtc.py`) needs the next one before the chunk is computed, so it is estimated from the
last ones: the `quantile` (default 0.9, nearest rank, `engine.stats.percentile`) of the last `window` measured
delays, after the first `warmup` measurements are set aside. Why these:
- a high quantile rather than the mean: guessing the delay short lets the new chunk rewrite actions the robot has
  already executed (the jump RTC is there to remove); guessing it long only freezes a step or two more of the old
  plan. The maximum would be the safest, but one stall (a garbage collection, a burst of other robots) would then
  hold the estimate up for a whole window;
- warm-up set aside: a model's first calls (allocation, compilation, caches filling) are far slower than the rest,
  and counting them inflates the estimate for as long as they stay in the window (LeRobot's `LatencyTracker.max()`
  is the maximum over every call since its reset, warm-up included);
- a sliding window: the delay follows the load (other robots joining a fleet server, narration beside the chunk).
No estimate (None) until one measurement after the warm-up exists: the caller samples without guidance meanwhile.
A measurement that is not a finite number >= 0 is dropped and counted (`dropped`), never an exception.
"""

from __future__ import annotations

import math
from collections import deque

from .stats import percentile


class DelayEstimate:
    def __init__(self, window: int = 32, quantile: float = 0.9, warmup: int = 2):
        if window < 1 or warmup < 0 or not 0.0 <= quantile <= 1.0:
            raise ValueError(f"need window >= 1, warmup >= 0 and a quantile in [0, 1], got {window}, {warmup}, "
                             f"{quantile}")
        self.quantile = quantile
        self.warmup = warmup
        self._recent: deque[float] = deque(maxlen=window)
        self.measured = 0  # valid measurements seen, warm-up included
        self.dropped = 0

    def add(self, steps: float) -> bool:
        """One chunk's measured delay in control steps (fractions allowed); False when it was dropped."""
        if isinstance(steps, bool) or not isinstance(steps, (int, float)) or not math.isfinite(steps) or steps < 0:
            self.dropped += 1
            return False
        self.measured += 1
        if self.measured > self.warmup:
            self._recent.append(float(steps))
        return True

    def next_delay(self) -> int | None:
        """The delay to guide the next chunk with: whole control steps, rounded up; None without a measurement."""
        if not self._recent:
            return None
        return math.ceil(percentile(self._recent, self.quantile))
