"""A robot's side of a fleet run, without ROS: when it sends frames, and how it scores the chunks that come back.

`FrameSchedule` gives a robot's send times: one frame per period from a phase offset, each frame up to `jitter`
of a period late (as the simulator's arrivals), so robots on one server neither start together nor phase-lock to
its batches. `FrameLedger` records every frame a robot sent (send time, header stamp) and the receipt time of the
chunk computed from it (matched by the chunk's header stamp, which the fleet node copies from the frame).
`score(frames, slo_s, start_ns, end_ns)` judges the frames sent in a window from the robot's own clock: latency =
chunk receipt - frame stamp; on time when within the SLO; a late chunk and a frame with no chunk at all are both
misses. `pool(scores)` combines robots: overall attainment (chunks on time / frames), the worst robot's, and
latency percentiles over every chunk received.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from oxygen_ros.engine.frames import deadline_missed
from oxygen_ros.engine.stats import percentile


class FrameSchedule:
    """Send times (ns) of a robot at `rate_hz` from `start_ns` + `phase_s`, each up to `jitter` periods late."""

    def __init__(self, rate_hz: float, start_ns: int, phase_s: float = 0.0, jitter: float = 0.0, seed: int = 0):
        if rate_hz <= 0:
            raise ValueError(f"rate must be positive, got {rate_hz}")
        if not 0.0 <= jitter < 1.0:
            raise ValueError(f"jitter is a fraction of the period in [0, 1), got {jitter}")
        self.period_ns = round(1e9 / rate_hz)
        self.first_ns = start_ns + round(phase_s * 1e9)
        self.jitter_ns = jitter * self.period_ns
        self.random = random.Random(seed)
        self.index = 0

    def next_ns(self) -> int:
        """The next frame's send time (never earlier than the one before: jitter is below one period)."""
        nominal = self.first_ns + self.index * self.period_ns
        self.index += 1
        return nominal + round(self.random.random() * self.jitter_ns)


@dataclass
class SentFrame:
    """A frame a test robot sent: when, its stamp, and when its chunk came back (None: never)."""

    sent_ns: int
    stamp_ns: int
    received_ns: int | None = None


@dataclass
class FrameLedger:
    """Every frame a robot sent and when its chunk came back. Not thread-safe: the caller holds a lock."""

    frames: list[SentFrame] = field(default_factory=list)
    by_stamp: dict[int, SentFrame] = field(default_factory=dict)
    unknown_chunks: int = 0  # a chunk whose stamp is no frame this robot sent
    duplicate_chunks: int = 0  # a second chunk for one frame

    def sent(self, sent_ns: int, stamp_ns: int) -> None:
        frame = SentFrame(sent_ns, stamp_ns)
        self.frames.append(frame)
        self.by_stamp[stamp_ns] = frame

    def received(self, stamp_ns: int, received_ns: int) -> bool:
        """Record a chunk; False when it matches no frame or its frame already had one (counted)."""
        frame = self.by_stamp.get(stamp_ns)
        if frame is None:
            self.unknown_chunks += 1
            return False
        if frame.received_ns is not None:
            self.duplicate_chunks += 1
            return False
        frame.received_ns = received_ns
        return True

    def rows(self) -> list[list[int | None]]:
        """[sent, stamp, received or None] per frame, for JSON."""
        return [[f.sent_ns, f.stamp_ns, f.received_ns] for f in self.frames]


def frames_from_rows(rows) -> list[SentFrame]:
    return [SentFrame(int(sent), int(stamp), None if received is None else int(received)) for sent, stamp, received in rows]


@dataclass
class RobotScore:
    frames: int
    on_time: int
    late: int  # a chunk arrived after the deadline
    missed: int  # no chunk at all (dropped by the server, or lost)
    latencies_ms: list[float]

    @property
    def attainment(self) -> float:
        return self.on_time / self.frames if self.frames else 0.0

    def summary(self) -> dict:
        latencies = self.latencies_ms
        return {"frames": self.frames, "on_time": self.on_time, "late": self.late, "missed": self.missed,
                "attainment": self.attainment, "latency_ms_p50": percentile(latencies, 0.5),
                "latency_ms_p99": percentile(latencies, 0.99), "latency_ms_max": max(latencies, default=0.0)}


def score(frames: list[SentFrame], slo_s: float, start_ns: int = 0, end_ns: int | None = None) -> RobotScore:
    """The frames sent in [start_ns, end_ns) judged against `slo_s` from their header stamps."""
    chosen = [f for f in frames if f.sent_ns >= start_ns and (end_ns is None or f.sent_ns < end_ns)]
    latencies = [(f.received_ns - f.stamp_ns) / 1e6 for f in chosen if f.received_ns is not None]
    on_time = sum(not deadline_missed(latency / 1e3, slo_s) for latency in latencies)  # stamp as time zero
    return RobotScore(frames=len(chosen), on_time=on_time, late=len(latencies) - on_time,
                      missed=len(chosen) - len(latencies), latencies_ms=latencies)


@dataclass
class PooledScore:
    robots: int
    frames: int
    on_time: int
    late: int
    missed: int
    attainment: float
    worst_robot: float
    latency_ms_p50: float
    latency_ms_p99: float

    def as_dict(self) -> dict:
        return asdict(self)


def pool(scores: list[RobotScore]) -> PooledScore:
    """Several robots' scores as one: attainment over all their frames, the worst robot's, pooled latencies."""
    frames = sum(s.frames for s in scores)
    on_time = sum(s.on_time for s in scores)
    latencies = [x for s in scores for x in s.latencies_ms]
    return PooledScore(robots=len(scores), frames=frames, on_time=on_time, late=sum(s.late for s in scores),
                       missed=sum(s.missed for s in scores), attainment=on_time / frames if frames else 0.0,
                       worst_robot=min((s.attainment for s in scores), default=0.0),
                       latency_ms_p50=percentile(latencies, 0.5), latency_ms_p99=percentile(latencies, 0.99))
