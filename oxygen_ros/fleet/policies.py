"""Queue selection: when a stage is free, which model's queue gets it.

All policies see the same thing (the stage's per-model queues, the clock, and an estimate of the service time
still ahead of a model's head request) and answer with a model id, so the lockstep scheduler, the baselines and
the simulator can swap them by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from oxygen_ros.fleet.requests import StageQueues

RemainingTime = Callable[[str], float]


class QueuePolicy(Protocol):
    name: str

    def choose(self, queues: StageQueues, now: float, remaining: RemainingTime) -> str | None:
        """Model id whose queue runs next on this stage, or None when every queue is empty."""


class EarliestSloFirst:
    """Serve the queue whose head request has the least slack (deadline - now - remaining service time).

    Slack rather than the bare deadline, because a request for a heavy model needs to start earlier than a
    request for a light model with the same deadline. A head whose slack is already negative cannot be saved by
    going first, and serving it would make the next most urgent queue late as well (the overload cascade of
    plain earliest-deadline-first), so such queues rank after every queue that can still make it."""

    name = "esf"

    def choose(self, queues: StageQueues, now: float, remaining: RemainingTime) -> str | None:
        models = queues.models_with_requests()
        if not models:
            return None

        def rank(model_id: str) -> tuple[bool, float, str]:
            slack = queues.head(model_id).slack(now, remaining(model_id))
            return (slack < 0, slack, model_id)

        return min(models, key=rank)


class RoundRobin:
    """Serve models in a fixed cyclic order, skipping empty queues: fair in turns, blind to deadlines."""

    name = "rr"

    def __init__(self) -> None:
        self._last: str | None = None

    def choose(self, queues: StageQueues, now: float, remaining: RemainingTime) -> str | None:
        models = queues.models_with_requests()
        if not models:
            return None
        later = [m for m in models if self._last is None or m > self._last]
        self._last = later[0] if later else models[0]
        return self._last


class LargestQueueFirst:
    """Serve the longest queue (ties: earliest head deadline): maximizes batch size, ignores who is in a hurry."""

    name = "lqf"

    def choose(self, queues: StageQueues, now: float, remaining: RemainingTime) -> str | None:
        models = queues.models_with_requests()
        if not models:
            return None
        return min(models, key=lambda m: (-queues.length(m), queues.head(m).deadline, m))


POLICIES: dict[str, type] = {"esf": EarliestSloFirst, "rr": RoundRobin, "lqf": LargestQueueFirst}


def make_policy(name: str) -> QueuePolicy:
    """A fresh policy instance (policies such as round-robin keep state, so each stage needs its own)."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown queue policy {name!r}; choose from {sorted(POLICIES)}") from None
