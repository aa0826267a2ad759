"""A camera frame waiting for its action chunk, the one definition of a missed deadline, and batch buckets.

Every server of the package (one robot's node, a fleet server, the fleet simulator) schedules the same frames: a
frame carries its own absolute deadline (the camera stamp + its robot's latency budget), so frames of robots with
different budgets compare by urgency without knowing the robots, and the times it passes its stages, stamped by
the planner that runs it on whichever clock drives it (the wall clock, or the simulator's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def deadline_missed(ready_s: float, deadline_s: float) -> bool:
    """The one definition of a miss: the chunk became usable after its deadline (same clock for both)."""
    return ready_s > deadline_s + 1e-12


def bucket_for(count: int, max_batch: int) -> int:
    """Smallest power of two holding `count` items, capped at `max_batch`."""
    if count < 1:
        raise ValueError("a batch needs at least one item")
    bucket = 1
    while bucket < count and bucket < max_batch:
        bucket *= 2
    return bucket


def power_of_two_buckets(max_batch: int) -> list[int]:
    """Bucket sizes 1, 2, 4, ... up to and including `max_batch` (a power of two): the few batch shapes a
    profile table times and CUDA graphs capture."""
    if max_batch < 1 or max_batch & (max_batch - 1):
        raise ValueError(f"max_batch must be a power of two >= 1, got {max_batch}")
    return [1 << i for i in range(max_batch.bit_length())]


@dataclass(eq=False)
class ActionFrame:
    """One camera frame waiting for its action chunk. `inputs` and `noise` are the model runner's business
    (opaque here; None in the simulator); `context` is the caller's, handed back with the chunk and the frame's
    text. A planner sees the frame from its `arrival` on."""

    model_id: str
    inputs: Any
    narrate: bool
    deadline: float  # seconds on the scheduler's clock
    arrival: float
    robot_id: str = ""
    stamp_ns: int = 0
    max_new_tokens: int | None = None  # None: the configured budget
    noise: Any = None
    context: Any = None
    committed: Any = None  # real-time chunking: the robot's previous chunk and delay (the model runner's business)
    frame_id: int = -1  # set by the scheduler
    # stamped by the planner as the frame moves (a whole-device batch starts both stages at once)
    vlm_start: float | None = None
    vlm_done: float | None = None
    action_start: float | None = None
    finish: float | None = None  # its chunk is ready
    dropped: bool = False  # its deadline passed while it waited: never computed

    def slack(self, now: float, service_s: float) -> float:
        """Time to spare if the rest of its work started now: negative means it is going to miss."""
        return self.deadline - now - service_s

    @property
    def met_deadline(self) -> bool:
        return self.finish is not None and not deadline_missed(self.finish, self.deadline)

    @property
    def latency(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival


def committed(frames: list[ActionFrame]) -> list | None:
    """The frames' previous chunks for the model runner, or None when no frame brings one."""
    chunks = [f.committed for f in frames]
    return chunks if any(c is not None for c in chunks) else None
