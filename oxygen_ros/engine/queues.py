"""Where frames wait, and which model's frames run next: the one family of queue policies.

`FrameQueues` keeps one queue per model for one stage (a whole-device planner has one set, a stage split one per
stage), in arrival order (FIFO, one robot) or deadline order (fleets). A frame is visible from its arrival time on,
so a simulator or a replay can queue a whole arrival list up front and every decision still sees only the frames
that had arrived by then.

A policy answers "which model next" from the visible queues, the clock and `remaining(model_id)`, the predicted
service time still ahead of that model's frames (the planner's cost model: a learned fit, or a profile table):
- `fifo`: the model of the oldest frame (one robot: simply the next frame);
- `esf`: earliest-SLO-first, the least slack (deadline - now - remaining); a frame that can no longer make it
  ranks after every one that still can, since serving it would only make others late too;
- `rr`: models in turn, blind to deadlines;
- `lqf`: largest queue first (ties: earliest deadline), the biggest batches, blind to urgency.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Protocol

from .frames import ActionFrame, deadline_missed

Remaining = Callable[[str], float]
"""`remaining(model_id)`: predicted seconds of work still ahead of that model's most urgent frame."""


class FrameQueues:
    """Per-model queues of one stage; `by_deadline` orders each by deadline (else by arrival), ties by arrival."""

    def __init__(self, by_deadline: bool = True):
        self.by_deadline = by_deadline
        self._heaps: dict[str, list[tuple[float, float, int, ActionFrame]]] = {}
        self._future: list[tuple[float, int, ActionFrame]] = []  # not yet arrived, by arrival
        self._seq = itertools.count()

    def push(self, frame: ActionFrame) -> None:
        heapq.heappush(self._future, (frame.arrival, next(self._seq), frame))

    def _arrive(self, now: float) -> None:
        while self._future and self._future[0][0] <= now:
            _, seq, frame = heapq.heappop(self._future)
            key = frame.deadline if self.by_deadline else frame.arrival
            heapq.heappush(self._heaps.setdefault(frame.model_id, []), (key, frame.arrival, seq, frame))

    def models(self, now: float) -> list[str]:
        """Models with a frame arrived by `now`, sorted."""
        self._arrive(now)
        return sorted(m for m, heap in self._heaps.items() if heap)

    def length(self, model_id: str) -> int:
        """Frames of `model_id` arrived by the last `models` / `cut` call."""
        return len(self._heaps.get(model_id, ()))

    def total(self) -> int:
        """Every queued frame, arrived or not."""
        return len(self._future) + sum(len(heap) for heap in self._heaps.values())

    def earliest_deadline(self, model_id: str) -> float:
        heap = self._heaps[model_id]
        return heap[0][0] if self.by_deadline else min(item[3].deadline for item in heap)

    def oldest_arrival(self, model_id: str) -> float:
        heap = self._heaps[model_id]
        return heap[0][0] if not self.by_deadline else min(item[1] for item in heap)

    def cut(self, model_id: str, limit: int, now: float) -> list[ActionFrame]:
        """Up to `limit` of the model's frames arrived by `now`, first in order first: a batch closed from now on
        (a frame arriving while it runs waits for the next one)."""
        self._arrive(now)
        heap = self._heaps.get(model_id, [])
        return [heapq.heappop(heap)[3] for _ in range(min(limit, len(heap)))]

    def take_expired(self, now: float) -> list[ActionFrame]:
        """Remove the arrived frames whose deadline has passed at `now` (marked dropped): their chunk could only be
        late, and computing it would make other frames late too."""
        self._arrive(now)
        expired = []
        for model_id, heap in self._heaps.items():
            if self.by_deadline:
                while heap and deadline_missed(now, heap[0][0]):
                    expired.append(heapq.heappop(heap)[3])
            elif any(deadline_missed(now, item[3].deadline) for item in heap):
                expired += [item[3] for item in heap if deadline_missed(now, item[3].deadline)]
                self._heaps[model_id] = [item for item in heap if not deadline_missed(now, item[3].deadline)]
                heapq.heapify(self._heaps[model_id])
        for frame in expired:
            frame.dropped = True
        return sorted(expired, key=lambda f: f.frame_id)


class QueuePolicy(Protocol):
    def choose(self, queues: FrameQueues, now: float, remaining: Remaining) -> str | None:
        """The model whose frames run next (None when no frame has arrived)."""


class Fifo:
    def choose(self, queues, now, remaining):
        models = queues.models(now)
        return min(models, key=lambda m: (queues.oldest_arrival(m), m)) if models else None


class EarliestSloFirst:
    def choose(self, queues, now, remaining):
        def rank(model_id: str) -> tuple[bool, float, str]:
            slack = queues.earliest_deadline(model_id) - now - remaining(model_id)
            return (slack < 0, slack, model_id)

        models = queues.models(now)
        return min(models, key=rank) if models else None


class RoundRobin:
    def __init__(self):
        self._last: str | None = None

    def choose(self, queues, now, remaining):
        models = queues.models(now)
        if not models:
            return None
        later = [m for m in models if self._last is None or m > self._last]
        self._last = later[0] if later else models[0]
        return self._last


class LargestQueueFirst:
    def choose(self, queues, now, remaining):
        models = queues.models(now)
        return min(models, key=lambda m: (-queues.length(m), queues.earliest_deadline(m), m)) if models else None


QUEUE_POLICIES: dict[str, type] = {"fifo": Fifo, "esf": EarliestSloFirst, "rr": RoundRobin, "lqf": LargestQueueFirst}


def make_policy(name: str) -> QueuePolicy:
    """A fresh policy (round-robin keeps state, so each queue set needs its own)."""
    try:
        return QUEUE_POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown queue policy {name!r}; choose from {sorted(QUEUE_POLICIES)}") from None


def frame_queues(policy: str) -> FrameQueues:
    """The queues a policy reads: arrival order for FIFO, deadline order for the others."""
    return FrameQueues(by_deadline=policy != "fifo")
