"""Fleet requests and the per-model queues they wait in.

A robot's control loop produces one request per inference period. Every request carries its own absolute
deadline (arrival + that robot's latency budget) so that schedulers can compare urgency across robots with
different SLOs without knowing anything about the robots themselves.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any

from oxygen_ros.engine.stage_workers import Stage


@dataclass(frozen=True)
class RobotSpec:
    """A robot as the fleet sees it: which model it needs, how often it asks, and how long it can wait."""

    robot_id: str
    model_id: str
    rate_hz: float
    slo_s: float

    @property
    def period_s(self) -> float:
        return 1.0 / self.rate_hz


@dataclass(eq=False)
class FleetRequest:
    """One inference request; timestamps are filled in as it moves through the stages (simulated or real clock)."""

    request_id: int
    robot_id: str
    model_id: str
    arrival: float
    deadline: float
    vlm_start: float | None = None
    vlm_done: float | None = None
    action_start: float | None = None
    finish: float | None = None
    dropped: bool = False
    # Real execution only (the simulator leaves them None): the observation in model space (a batch of one),
    # the KV slot it occupies between its VLM and action stages, the action chunk it produced, and whatever the
    # front end needs to route the answer back (e.g. the source frame's stamp).
    inputs: Any = None
    slot: int | None = None
    actions: Any = None
    context: Any = None

    @property
    def met_slo(self) -> bool:
        return self.finish is not None and self.finish <= self.deadline + 1e-12

    @property
    def latency(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    def slack(self, now: float, remaining_service_s: float) -> float:
        """Time to spare if the rest of the work started now: negative means it is already going to miss."""
        return self.deadline - now - remaining_service_s


class StageQueues:
    """Per-model queues for one stage, each ordered by deadline so a batch takes the most urgent requests first."""

    def __init__(self, stage: Stage):
        self.stage = stage
        self._heaps: dict[str, list[tuple[float, int, FleetRequest]]] = {}
        self._seq = itertools.count()

    def push(self, request: FleetRequest) -> None:
        heap = self._heaps.setdefault(request.model_id, [])
        heapq.heappush(heap, (request.deadline, next(self._seq), request))

    def models_with_requests(self) -> list[str]:
        return sorted(m for m, heap in self._heaps.items() if heap)

    def length(self, model_id: str) -> int:
        return len(self._heaps.get(model_id, ()))

    def total(self) -> int:
        return sum(len(heap) for heap in self._heaps.values())

    def head(self, model_id: str) -> FleetRequest:
        """The earliest-deadline request of a model's queue (the one ESF judges the queue by)."""
        return self._heaps[model_id][0][2]

    def pop_earliest(self, model_id: str, count: int) -> list[FleetRequest]:
        heap = self._heaps[model_id]
        return [heapq.heappop(heap)[2] for _ in range(min(count, len(heap)))]

    def drop_expired(self, now: float) -> list[FleetRequest]:
        """Remove requests whose deadline has passed: a late action chunk is useless to a robot, so serving it
        would only push other requests past their deadlines too."""
        dropped: list[FleetRequest] = []
        for heap in self._heaps.values():
            while heap and heap[0][0] < now:
                request = heapq.heappop(heap)[2]
                request.dropped = True
                dropped.append(request)
        return dropped
