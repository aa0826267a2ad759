"""A replay's record of its own schedule: when (on its monotonic clock) it published each message and /clock value.

`oxygen-ros replay --schedule-report FILE` keeps one row per publication and writes them, with a summary of how late
the messages went out, as JSON when the replay ends. Times are integer nanoseconds from the replay's time zero (the
moment its first message was due), so a reader can compare them exactly with the bag's log times: message i of a
pass is due `ceil((log_time_i - first_log_time) / rate)` after that pass's zero. `time_zero_monotonic_ns` places
them on the machine's CLOCK_MONOTONIC, the clock other processes on the host read too.

Row fields: `loop` (the pass through the bag: 0, then 1, ... with --loop), `topic` (`/clock` for clock values),
`bag_time_ns` (the message's log time, or the clock value), `due_ns` (when the message was due; null for a /clock
value published between messages) and `at_ns` (when it was published: the monotonic time read just before the
publish call).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from oxygen_ros.data.atomic import atomic_output
from oxygen_ros.engine.stats import percentile


@dataclass(frozen=True)
class Publication:
    loop: int
    topic: str
    bag_time_ns: int
    due_ns: int | None
    at_ns: int


class ScheduleRecord:
    """Publications in the order they were made, on a time zero set by the first `start`."""

    def __init__(self):
        self.zero_ns: int | None = None
        self.rows: list[Publication] = []

    def start(self, monotonic_ns: int) -> None:
        """The replay's time zero (the first message's due time); later passes keep it."""
        if self.zero_ns is None:
            self.zero_ns = monotonic_ns

    def add(self, loop: int, topic: str, bag_time_ns: int, due_monotonic_ns: int | None, at_monotonic_ns: int) -> None:
        due = None if due_monotonic_ns is None else due_monotonic_ns - self.zero_ns
        self.rows.append(Publication(loop, topic, bag_time_ns, due, at_monotonic_ns - self.zero_ns))

    def lateness_s(self) -> list[float]:
        """Per message (not /clock values between them): seconds from its due time to its publication."""
        return [(row.at_ns - row.due_ns) / 1e9 for row in self.rows if row.due_ns is not None and row.topic != "/clock"]

    def summary(self) -> dict:
        late = self.lateness_s()
        return {
            "messages": len(late),
            "clock_values": sum(row.topic == "/clock" for row in self.rows),
            "lateness_ms": {name: round(1e3 * percentile(late, q), 3) for name, q in
                            (("median", 0.5), ("p90", 0.9), ("max", 1.0))},
        }

    def summary_line(self) -> str:
        summary = self.summary()
        late = summary["lateness_ms"]
        return (f"schedule: {summary['messages']} messages published {late['median']:g} ms after their due time at "
                f"the median, {late['p90']:g} ms at the 90th percentile, {late['max']:g} ms at most")

    def write(self, path: str | os.PathLike, bag: str, rate: float) -> None:
        """The report as JSON, written under a temporary name and moved into place (refuses an existing file)."""
        report = {"bag": str(bag), "rate": rate, "time_zero_monotonic_ns": self.zero_ns, **self.summary(),
                  "publications": [asdict(row) for row in self.rows]}
        with atomic_output(path) as target:
            target.write_text(json.dumps(report, indent=1) + "\n")
