"""Inputs stamped on another clock than the node's: which source, how far off, and the fix, in words.

A frame that is stale or ahead by a fraction of a second is a late camera or a slow link; one that arrives already
hours away from the node clock was stamped on another timeline. The usual causes: a bag played without `--clock`
to a node on wall time (stamps from the recording, hours or days old), or wall-clock stamps reaching a node on sim
time (`use_sim_time`: years ahead of /clock), or a node on sim time that has received no /clock at all (its clock
reads 0). Each message's offset is taken when it arrives, so a camera that merely stopped (its last image
growing old) is never mistaken for a clock problem. A condition counts once it has lasted `PERSIST_S` of wall
time: the first images a node on sim time gets before its first /clock message are not one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CLOCK_MISMATCH = "clock_mismatch"  # the node's state while ticks are skipped because of it
MISMATCH_S = 10.0  # an input arriving this far from the node clock was stamped on another clock
PERSIST_S = 1.0  # wall seconds a condition must last before it is reported

NO_CLOCK, BEHIND, AHEAD = "no /clock", "behind", "ahead"


def _fix(kind: str, sim_time: bool) -> str:
    if kind == NO_CLOCK:
        return ("this node runs on sim time (use_sim_time) but no /clock has arrived: play the bag with "
                "`ros2 bag play --clock` (or start what publishes /clock), or start the node with use_sim_time:=false")
    if kind == BEHIND and not sim_time:
        return ("a bag played without --clock? play it with `ros2 bag play --clock` and start the node with "
                "use_sim_time:=true")
    if kind == BEHIND:
        return "/clock and the stamps come from different sources: publish /clock from the source of the stamps"
    if sim_time:
        return ("wall-clock stamps while this node runs on sim time? start the node with use_sim_time:=false, or "
                "stamp the inputs with /clock time (use_sim_time:=true on their publisher)")
    return "the publisher's clock is ahead of this machine's: synchronize the machines' clocks (NTP, chrony)"


class ClockCheck:
    """`observe` every arriving message; `hint()` says what is off now and how to fix it ("" when nothing is)."""

    def __init__(self, threshold_s: float = MISMATCH_S, persist_s: float = PERSIST_S,
                 monotonic: Callable[[], float] = time.monotonic):
        self.threshold_ns = round(threshold_s * 1e9)
        self.persist_s, self._monotonic = persist_s, monotonic
        self._off: dict[str, tuple[str, int, bool]] = {}  # source -> (kind, stamp - node clock, on sim time)
        self._seen: dict[str, tuple[str, float]] = {}  # source -> (kind, wall time first seen) not yet reported

    def observe(self, source: str, stamp_ns: int, now_ns: int, sim_time: bool) -> tuple[bool, str] | None:
        """Record one message's offset. Returns (True, warning) when `source` enters a mismatch (or another
        kind of one), (False, note) when it leaves one, None otherwise: one log line per condition."""
        offset = stamp_ns - now_ns
        if sim_time and now_ns == 0:
            kind = NO_CLOCK
        elif abs(offset) > self.threshold_ns:
            kind = BEHIND if offset < 0 else AHEAD
        else:
            kind = None
        before = self._off.get(source)
        if kind is None:
            self._seen.pop(source, None)
            if before is None:
                return None
            del self._off[source]
            return False, f"{source}: stamps are on the node's clock again"
        if before is not None and before[0] == kind:
            self._off[source] = (kind, offset, sim_time)
            return None
        now = self._monotonic()
        seen = self._seen.get(source)
        if seen is None or seen[0] != kind:
            self._seen[source] = seen = (kind, now)
        if now - seen[1] < self.persist_s:
            return None
        del self._seen[source]
        self._off[source] = (kind, offset, sim_time)
        return True, self._describe(source, kind, offset, sim_time)

    def hint(self) -> str:
        return "; ".join(self._describe(source, *off) for source, off in self._off.items())

    def _describe(self, source: str, kind: str, offset: int, sim_time: bool) -> str:
        if kind == NO_CLOCK:
            what = f"{source} arrives while the node clock reads 0"
        else:
            what = f"{source} arrives stamped {abs(offset) / 1e9:.1f} s {'behind' if kind == BEHIND else 'ahead of'} " \
                   "the node clock"
        return f"{what} ({_fix(kind, sim_time)})"
