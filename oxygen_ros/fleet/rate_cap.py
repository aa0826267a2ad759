"""Admission at arrival: a robot's frames past its rate cap are dropped before any work is spent on them.

The cap is a token bucket: `rate_hz` tokens a second, at most `burst` held, one per frame admitted. A robot
sending at its rate with jitter (a frame late, the next one early) keeps its frames; one sending faster than the
controller placed it for loses the excess, counted, and cannot take the device from the robots placed beside it.
"""

from __future__ import annotations

import math


class RateCap:
    def __init__(self, rate_hz: float, burst: float = 2.0):
        if not (math.isfinite(rate_hz) and rate_hz > 0):
            raise ValueError(f"rate_hz must be a positive number, got {rate_hz!r}")
        if not burst >= 1.0:
            raise ValueError(f"burst must be >= 1 frame, got {burst!r}")
        self.rate_hz = float(rate_hz)
        self.burst = float(burst)
        self._tokens = self.burst
        self._last: float | None = None
        self.dropped = 0

    def admit(self, now_s: float) -> bool:
        """Whether a frame arriving at `now_s` (seconds, any monotonic clock) is within the cap; a refused one is
        counted in `dropped`."""
        if self._last is not None:
            self._tokens = min(self.burst, self._tokens + max(0.0, now_s - self._last) * self.rate_hz)
        self._last = now_s
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.dropped += 1
        return False
