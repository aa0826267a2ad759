"""Mutual exclusion between the control path and the language worker, with the control path first.

The action has a hard deadline, the text a soft one. The language worker holds the gate for one decode step (or
a few that the scheduler expects to end before the next tick) at a time; the control path waits at most for
that work in flight, and no new decode step starts while it waits or runs. With a fixed k per frame the control
path *owes* the worker k steps after each frame and waits for them before its next frame (the paper's fixed-k
schedule); with adaptive k nothing is owed. Both threads change the scheduler's state only inside the gate. On a
GPU the gate orders the two threads' host work; the device work is ordered by stream priorities.

Inside its section the control path may open a *shared* window (`share`, the runtime's `overlap_threads`): while
it lasts the worker may start decode steps beside the control path's work (each thread then on its own cores, or
its own stream), and the worker's state changes take the runtime's state lock instead of relying on the gate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager


class ControlGate:
    """`clock` stamps the start of each control section (`last_control_start`, read by adaptive k's slack)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self._cond = threading.Condition()
        self._control_waiting = 0
        self._control_active = False
        self._decoding = False
        self._owed = 0
        self._sharing = False
        self.last_control_start: float | None = None
        self.closed = False

    @contextmanager
    def control(self):
        """The control path's critical section: waits for owed and in-flight decode work, blocks new work."""
        with self._cond:
            self._control_waiting += 1
            while (self._decoding or self._owed > 0) and not self.closed:
                self._cond.wait()
            self._control_waiting -= 1
            self._control_active = True
        self.last_control_start = self.clock()
        try:
            yield
        finally:
            with self._cond:
                self._control_active = False
                self._cond.notify_all()

    @contextmanager
    def share(self):
        """Inside `control`: the worker may start decode steps until this ends (one may still run after it)."""
        with self._cond:
            self._sharing = True
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._sharing = False

    @property
    def sharing(self) -> bool:
        return self._sharing

    def owe(self, steps: int) -> None:
        """The next control section waits until the worker did `steps` more decode steps (or `forgive`)."""
        with self._cond:
            self._owed = steps

    def forgive(self) -> None:
        """Nothing left to decode: the control path owes no steps any more."""
        with self._cond:
            self._owed = 0
            self._cond.notify_all()

    @property
    def owed(self) -> int:
        return self._owed

    @property
    def control_wants_in(self) -> bool:
        return self._control_waiting > 0 or self._control_active

    def acquire_decode(self, timeout_s: float = 0.1) -> bool:
        """Wait until no control work runs or waits (owed steps go first), or the control path shares its section;
        False on timeout or close."""
        deadline = time.perf_counter() + timeout_s
        with self._cond:
            while not self.closed:
                if self._sharing or (not self._control_active and (self._owed > 0 or not self._control_waiting)):
                    self._decoding = True
                    return True
                now = time.perf_counter()
                if now >= deadline:
                    return False
                self._cond.wait(timeout=deadline - now)
            return False

    def release_decode(self, steps_done: int) -> None:
        with self._cond:
            self._decoding = False
            self._owed = max(0, self._owed - steps_done)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()
