"""What the stage-split planners share: a VLM queue and an action queue per model, cut by one queue policy.

A frame enters its model's VLM queue; when its VLM batch ends it waits in the action queue (holding its KV slot)
for an action batch. A batch is cut when its stage starts (closed from then on), as the power-of-two bucket
covering the queue, of the most urgent frames first, and the policy picks the model with what the profile table
says is still ahead of it (both stages from the VLM queue, the action stage from the action queue, each with the
device to itself: the exact shares are decided later). Frames whose deadline passed in a queue are dropped when a
batch of that stage is cut. Subclasses (the lockstep, the static split, and the simulator's baselines) decide
when a stage starts and on which share.
"""

from __future__ import annotations

from collections.abc import Callable

from ..engine.frames import ActionFrame, bucket_for
from ..engine.planners import Stage, StageBatch, StageJob
from ..engine.queues import Remaining, frame_queues, make_policy
from .co_run import DEFAULT_GUARD
from .profile_table import ProfileTable


class TwoStagePlanner:
    lanes = 1

    def __init__(self, lut: ProfileTable, policy: str = "esf", max_batch: int = 8, guard: float = DEFAULT_GUARD,
                 drop_expired: bool = True, vlm_room: Callable[[str], int] | None = None):
        """`guard` (>= 1): the latency inflation assumed for a stage co-running with another. `vlm_room(model_id)`:
        how many more frames of a model may start a VLM batch now (real serving: the frame slots its KV pool has
        left, since a frame holds its slot until its action stage); None: no limit (the simulator)."""
        if guard < 1.0:
            raise ValueError("the interference guard is a latency inflation factor and must be >= 1")
        self.lut = lut
        self.max_batch = max_batch
        self.guard = guard
        self.drop_expired = drop_expired
        self.vlm_room = vlm_room
        self.queues = {stage: frame_queues(policy) for stage in Stage}
        self.policies = {stage: make_policy(policy) for stage in Stage}
        self._expired: list[ActionFrame] = []

    def submit(self, frame: ActionFrame) -> None:
        self.queues[Stage.VLM].push(frame)

    def pending(self) -> int:
        return sum(q.total() for q in self.queues.values())

    def take_expired(self) -> list[ActionFrame]:
        expired, self._expired = self._expired, []
        return expired

    def remaining(self, stage: Stage) -> Remaining:
        """Service time still ahead of a model's frames at `stage`, at the batch its queue would form, each stage
        with the device to itself. Not inflated by the guard: the guard is headroom for two stages co-running on
        split shares, and inflating this whole-device estimate too made ESF give up on frames that could still make
        their deadline, and collapse under overload when the guard was set to a measured co-run slowdown."""
        queues = self.queues[stage]

        def remaining(model_id: str) -> float:
            bucket = bucket_for(max(queues.length(model_id), 1), self.max_batch)
            seconds = self.lut.solo(model_id, Stage.ACTION, bucket)[1]
            if stage is Stage.VLM:
                seconds += self.lut.solo(model_id, Stage.VLM, bucket)[1]
            return seconds

        return remaining

    def next_batch(self, stage: Stage, now: float) -> StageBatch | None:
        """Cut the next batch for `stage` at its start `now` (expired frames are dropped first); its share and
        seconds are the caller's to set (`solo`, `on_share`)."""
        queues = self.queues[stage]
        if self.drop_expired:
            self._expired += queues.take_expired(now)
        model_id = self.policies[stage].choose(queues, now, self.remaining(stage))
        if model_id is None:
            return None
        limit = self.max_batch
        if stage is Stage.VLM and self.vlm_room is not None:
            room = min(limit, self.vlm_room(model_id))
            if room < 1:  # this model's frames wait until its action stage gives slots back
                return None
            limit = 1 << (room.bit_length() - 1)  # a power-of-two bucket
        bucket = bucket_for(queues.length(model_id), limit)
        frames = queues.cut(model_id, bucket, now)
        for frame in frames:
            if stage is Stage.VLM:
                frame.vlm_start = now
            else:
                frame.action_start = now
        return StageBatch(model_id, stage.value, frames, bucket)

    def solo(self, batch: StageBatch) -> StageBatch:
        """`batch` with the device to itself, on its fastest share."""
        batch.share, batch.seconds = self.lut.solo(batch.model_id, Stage(batch.stage), batch.bucket)
        return batch

    def on_share(self, batch: StageBatch, share: float) -> StageBatch:
        batch.share, batch.seconds = share, self.lut.latency(batch.model_id, Stage(batch.stage), batch.bucket, share)
        return batch

    def complete(self, batch: StageBatch, now: float) -> list[ActionFrame]:
        """A batch's stage ended at `now`: VLM frames move on to the action queue, action frames are done."""
        if Stage(batch.stage) is Stage.VLM:
            for frame in batch.frames:
                frame.vlm_done = now
                self.queues[Stage.ACTION].push(frame)
            return []
        for frame in batch.frames:
            frame.finish = now
        return list(batch.frames)

    def start(self, now: float) -> list[StageJob]:
        raise NotImplementedError

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        raise NotImplementedError
