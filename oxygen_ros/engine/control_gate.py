"""Priority between the control path and the language worker on one device.

The action has a hard deadline, the text a soft one. The language worker asks the gate before every decode step;
the gate lets it start only when the control path is not running and, if the control period is known, when the
step is expected to end before the next control tick. The control path never waits for more than the one decode
step that may be in flight. On a GPU the gate still orders the two threads' host work (the scheduler's state);
the device work is ordered by stream priorities (`PathStreams`).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


class ControlGate:
    def __init__(self, control_period_s: float | None = None, margin_s: float = 0.0, trace: bool = False):
        self.control_period_s = control_period_s
        self.margin_s = margin_s
        self._cond = threading.Condition()
        self._control_active = False
        self._decoding = False
        self._last_control_start: float | None = None
        self.closed = False
        # (kind, start, end) intervals, for tests that check the two paths never overlap
        self.trace: list[tuple[str, float, float]] | None = [] if trace else None

    @contextmanager
    def control(self):
        """The control path's critical section: waits for an in-flight decode step, blocks new ones."""
        with self._cond:
            self._control_active = True
            while self._decoding:
                self._cond.wait()
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            with self._cond:
                self._control_active = False
                self._last_control_start = start
                if self.trace is not None:
                    self.trace.append(("control", start, end))
                self._cond.notify_all()

    def _fits(self, now: float, step_estimate_s: float) -> bool:
        if self.control_period_s is None or self._last_control_start is None:
            return True
        next_tick = self._last_control_start + self.control_period_s
        if now >= next_tick + 0.5 * self.control_period_s:  # the control path is late or idle: don't starve text
            return True
        return now + step_estimate_s <= next_tick - self.margin_s

    def acquire_decode(self, step_estimate_s: float, timeout_s: float = 0.1) -> bool:
        """Wait until a decode step may start; False on timeout or close (then the caller just asks again)."""
        deadline = time.perf_counter() + timeout_s
        with self._cond:
            while not self.closed:
                now = time.perf_counter()
                if not self._control_active and self._fits(now, step_estimate_s):
                    self._decoding = True
                    return True
                if now >= deadline:
                    return False
                self._cond.wait(timeout=min(0.002, deadline - now))
            return False

    def release_decode(self, start: float) -> None:
        with self._cond:
            self._decoding = False
            if self.trace is not None:
                self.trace.append(("decode", start, time.perf_counter()))
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
