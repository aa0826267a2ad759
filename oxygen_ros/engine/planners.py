"""How the device runs frames: stage planners, the jobs they hand out, and the monolithic planner.

A pi0.5-shaped call has two stages, the VLM prefill of the image + prompt prefix and the action denoising from it.
A planner keeps the frames' queues and, when asked `start(now)`, cuts batches and says how each job uses the
device: both stages in one call on the whole device (`MonolithicPlanner`, here: one robot's node and the fleet's
`monolithic` design), or the stages apart on shares of the device (the fleet's Robion lockstep and static split,
`fleet/lockstep.py`, `fleet/static_split.py`). The scheduler owns the planner; the runtime executes the jobs on the
wall clock and the fleet simulator on a simulated one, both telling the planner when each job ended (`finish`).

A job carries the seconds its batches are predicted to take (the planner's cost model), so the simulator knows
how long to run it and a report can compare prediction and run. Planners never look at a clock: `now` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from .cost_models import CostModel
from .frames import ActionFrame, bucket_for
from .queues import frame_queues, make_policy


class Stage(StrEnum):
    """The two stages of a pi0.5-shaped call: VLM prefill of the image+prompt prefix, then action denoising."""

    VLM = "vlm"
    ACTION = "action"


WHOLE = "whole"
"""A batch's stage when both stages run in one call on the whole device."""


@dataclass
class StageBatch:
    """A batch of one model's frames for one stage (or `WHOLE`) on `share` of the device, padded to `bucket`;
    `seconds`: what the planner's cost model predicts for it there with no other job beside it."""

    model_id: str
    stage: str
    frames: list[ActionFrame]
    bucket: int
    share: float = 1.0
    seconds: float = 0.0


@dataclass(eq=False)
class StageJob:
    """What one execution lane runs from `start` until it ends: its batches side by side, or one after the
    other (`sequential`). `co_run`: it shares the device with another running job or batch (its batches then
    suffer interference). `predicted_s`: the planner's prediction, guard included."""

    lane: str
    start: float
    batches: list[StageBatch]
    predicted_s: float = 0.0
    sequential: bool = False
    co_run: bool = False
    end: float | None = None  # set when the scheduler is told it finished

    def duration(self, interference: float = 1.0) -> float:
        """Its batches' predicted seconds, inflated by `interference` (>= 1) when it co-runs."""
        factor = interference if self.co_run else 1.0
        times = [batch.seconds * factor for batch in self.batches]
        return sum(times) if self.sequential else max(times, default=0.0)


class StagePlanner(Protocol):
    """Queues frames and hands out jobs. `lanes`: how many jobs it may have running at once."""

    lanes: int

    def submit(self, frame: ActionFrame) -> None: ...

    def pending(self) -> int:
        """Frames queued or between their stages."""
        ...

    def start(self, now: float) -> list[StageJob]:
        """A job for every idle lane that has work (expired frames are dropped first)."""
        ...

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        """`job` ended at `now`; returns the frames whose chunk it completed."""
        ...

    def take_expired(self) -> list[ActionFrame]:
        """Frames dropped from its queues since the last call because their deadline passed."""
        ...


class MonolithicPlanner:
    """One lane: a batch of one model's frames (up to `max_batch`, padded to a power-of-two bucket) is prefilled
    and denoised in one call on the device (on the share the cost model finds fastest for it: all of it on a GPU,
    a thread budget on a loaded CPU); the next batch waits for it. Which model goes first is the queue policy's
    choice, with the cost model's prediction for the batch the queue would form."""

    lanes = 1

    def __init__(self, queue: str, max_batch: int, drop_expired: bool, cost: CostModel):
        self.max_batch = max_batch
        self.drop_expired = drop_expired
        self.cost = cost
        self.queues = frame_queues(queue)
        self.policy = make_policy(queue)
        self.busy = False
        self._expired: list[ActionFrame] = []

    def submit(self, frame: ActionFrame) -> None:
        self.queues.push(frame)

    def pending(self) -> int:
        return self.queues.total()

    def _remaining(self, model_id: str) -> float:
        return self.cost.action_s(model_id, bucket_for(max(self.queues.length(model_id), 1), self.max_batch))

    def start(self, now: float) -> list[StageJob]:
        if self.busy:
            return []
        if self.drop_expired:
            self._expired += self.queues.take_expired(now)
        model_id = self.policy.choose(self.queues, now, self._remaining)
        if model_id is None:
            return []
        frames = self.queues.cut(model_id, self.max_batch, now)
        bucket = bucket_for(len(frames), self.max_batch)
        for frame in frames:
            frame.vlm_start = frame.action_start = now
        seconds = self.cost.action_s(model_id, bucket)
        batch = StageBatch(model_id, WHOLE, frames, bucket, self.cost.action_share(model_id, bucket), seconds)
        self.busy = True
        return [StageJob("device", now, [batch], seconds)]

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        self.busy = False
        frames = job.batches[0].frames
        for frame in frames:
            frame.finish = now
        return list(frames)

    def take_expired(self) -> list[ActionFrame]:
        expired, self._expired = self._expired, []
        return expired
