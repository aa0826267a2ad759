"""At most one log line per key and period, so that one repeating fault never hides another.

rclpy's `throttle_duration_sec` throttles per call site: every drop reason logged from one line would share one
throttle, and the first fault to repeat would silence the rest. Here each key (e.g. topic and drop reason) has its
own period, and the line that goes out says how many of its kind were held back since the last one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


class LogThrottle:
    def __init__(self, period_s: float, clock: Callable[[], float] = time.monotonic):
        self.period_s = period_s
        self.clock = clock
        self._last: dict[Hashable, float] = {}  # keys come from fixed sets (topics x reasons): bounded
        self._held: dict[Hashable, int] = {}

    def allow(self, key: Hashable) -> int | None:
        """None when a line for `key` went out less than a period ago (it is counted as held back); otherwise
        the number held back since the last line, and the period restarts."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.period_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)

    @staticmethod
    def suffix(held: int) -> str:
        return f" ({held} more since the last such line)" if held else ""
