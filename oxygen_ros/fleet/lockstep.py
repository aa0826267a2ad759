"""The lockstep planner with guarded compute partitioning (the Robion device design).

Every lockstep runs one VLM batch and one action batch at the same time on complementary partitions of the
device, and both end together: a lockstep lasts as long as the slower of the two. Outputs of a VLM batch feed the
action queues for a later lockstep, so the two stages of consecutive batches pipeline on one device.

The partition is picked per lockstep from the LUT, never preempted. "Guarded": a co-running stage is predicted
at its LUT latency times ``guard`` (>= 1, headroom for interference between the partitions, which the offline
profile did not see), and the scheduler only splits the device when the guarded split beats running the two
batches back to back, each with the device to itself (on its fastest share: the whole GPU, or on a CPU the thread
count the LUT found fastest).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.frames import ActionFrame
from ..engine.planners import Stage, StageJob
from .profile_table import ProfileTable
from .two_stage import TwoStagePlanner

StageLoad = tuple[str, int]
"""(model id, batch bucket) of a batch waiting to be placed."""


@dataclass(frozen=True)
class PartitionChoice:
    """How one lockstep uses the device. ``mode``: "single" (one stage, device to itself), "split" (both stages
    side by side on vlm_share / action_share) or "serial" (both stages back to back, each with the device to
    itself); a stage with the device to itself runs on its fastest share."""

    mode: str
    vlm_share: float
    action_share: float
    vlm_s: float
    action_s: float
    predicted_s: float


def split_candidates(lut: ProfileTable, vlm_model: str, action_model: str) -> list[float]:
    """VLM shares s with 0 < s < 1 for which both s (VLM) and 1 - s (action) were profiled."""
    action_shares = {round(s, 6) for s in lut.shares(action_model, Stage.ACTION)}
    return [s for s in lut.shares(vlm_model, Stage.VLM) if 0 < s < 1 and round(1 - s, 6) in action_shares]


def choose_partition(
    lut: ProfileTable, vlm: StageLoad | None, action: StageLoad | None, guard: float
) -> PartitionChoice:
    """The LUT-optimal way to run this lockstep: minimum guarded predicted lockstep time."""
    if vlm is None and action is None:
        raise ValueError("a lockstep needs at least one batch")
    if vlm is None or action is None:
        model_id, bucket = vlm or action
        stage = Stage.VLM if vlm else Stage.ACTION
        share = lut.fastest_share(model_id, stage, bucket)
        seconds = lut.latency(model_id, stage, bucket, share)
        if vlm:
            return PartitionChoice("single", share, 0.0, seconds, 0.0, seconds)
        return PartitionChoice("single", 0.0, share, 0.0, seconds, seconds)
    (vm, vb), (am, ab) = vlm, action
    sv, sa = lut.fastest_share(vm, Stage.VLM, vb), lut.fastest_share(am, Stage.ACTION, ab)
    tv_full, ta_full = lut.latency(vm, Stage.VLM, vb, sv), lut.latency(am, Stage.ACTION, ab, sa)
    best = PartitionChoice("serial", sv, sa, tv_full, ta_full, tv_full + ta_full)
    for share in split_candidates(lut, vm, am):
        tv = guard * lut.latency(vm, Stage.VLM, vb, share)
        ta = guard * lut.latency(am, Stage.ACTION, ab, round(1 - share, 6))
        if max(tv, ta) < best.predicted_s:
            best = PartitionChoice("split", share, round(1 - share, 6), tv, ta, max(tv, ta))
    return best


class LockstepPlanner(TwoStagePlanner):
    """One device, one lockstep at a time: VLM batch and action batch start together and finish together."""

    def __init__(self, lut: ProfileTable, **kwargs):
        super().__init__(lut, **kwargs)
        self.busy = False

    def start(self, now: float) -> list[StageJob]:
        if self.busy:
            return []
        vlm = self.next_batch(Stage.VLM, now)
        action = self.next_batch(Stage.ACTION, now)
        if vlm is None and action is None:
            return []
        choice = choose_partition(self.lut, (vlm.model_id, vlm.bucket) if vlm else None,
                                  (action.model_id, action.bucket) if action else None, self.guard)
        batches = []
        if vlm:
            batches.append(self.on_share(vlm, choice.vlm_share))
        if action:
            batches.append(self.on_share(action, choice.action_share))
        self.busy = True
        return [StageJob("lockstep", now, batches, choice.predicted_s, sequential=choice.mode == "serial",
                         co_run=choice.mode == "split")]

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        self.busy = False
        return [frame for batch in job.batches for frame in self.complete(batch, now)]
