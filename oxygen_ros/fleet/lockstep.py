"""The lockstep planner with guarded compute partitioning (the Robion device design).

Every lockstep runs one VLM batch and one action batch at the same time on complementary partitions of the
device, and both end together: a lockstep lasts as long as the slower of the two. Outputs of a VLM batch feed the
action queues for a later lockstep, so the two stages of consecutive batches pipeline on one device.

The partition is picked per lockstep from the LUT, never preempted. "Guarded": a co-running stage is predicted
at its LUT latency times ``guard`` (>= 1, headroom for interference between the partitions, which the offline
profile did not see), and the scheduler only splits the device when the guarded split beats running the two
batches back to back, each with the device to itself (on its fastest share: the whole GPU, or on a CPU the thread
count the LUT found fastest).

Pipelining costs latency: a frame waits a whole lockstep between its two stages. Where splitting does not pay for
a VLM batch (`split_pays`: a VLM batch of its model and bucket beside an action batch of the same is predicted no
faster side by side than back to back), the lockstep runs that batch's two stages back to back in one job, the
monolithic step, each stage on its fastest share; an action batch already waiting runs first in the same job. So
where a split never pays the planner serves as the monolithic design does, and Robion never loses to its own
degenerate case.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.frames import ActionFrame
from ..engine.planners import Stage, StageBatch, StageJob
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


MIN_SPLIT_GAIN = 0.15
"""How much faster than back to back a split lockstep must be predicted for pipelining to pay: a pipelined frame
waits a lockstep between its two stages, so a split has to buy throughput worth that latency. Tuned in the
simulator's sweep (synthetic table, 4 GPUs, 8 models, guard = interference from 1.0 to 1.5, 5 seeds): the
smallest margin tried (0, 0.05, 0.1, 0.15) at which Robion's robots at 98 % were at least monolithic's at every
interference (docs/fleet.md)."""


def split_pays(lut: ProfileTable, model_id: str, bucket: int, guard: float,
               min_gain: float = MIN_SPLIT_GAIN) -> bool:
    """Whether pipelining a VLM batch of `model_id` and `bucket` pays: a lockstep of such a VLM batch beside an
    action batch of the same model and bucket, split (guarded), is predicted at least `min_gain` faster than the
    two back to back."""
    if min_gain < 0:
        raise ValueError("min_gain must be >= 0")
    choice = choose_partition(lut, (model_id, bucket), (model_id, bucket), guard)
    back_to_back = sum(lut.solo(model_id, stage, bucket)[1] for stage in Stage)
    return choice.mode == "split" and choice.predicted_s * (1.0 + min_gain) <= back_to_back


def batch_ends(job: StageJob, now: float) -> list[float]:
    """When each batch of `job` (ended at `now`) ended: all at `now` side by side; one after the other, the job's
    run time divided in proportion to the batches' predicted seconds."""
    total = sum(batch.seconds for batch in job.batches)
    if not job.sequential or total <= 0:
        return [now] * len(job.batches)
    ends, done = [], 0.0
    for batch in job.batches:
        done += batch.seconds
        ends.append(job.start + (now - job.start) * done / total)
    ends[-1] = now
    return ends


class LockstepPlanner(TwoStagePlanner):
    """One device, one lockstep at a time: VLM batch and action batch start together and finish together, or,
    where splitting does not pay, a VLM batch's two stages run back to back (the monolithic step)."""

    def __init__(self, lut: ProfileTable, min_split_gain: float = MIN_SPLIT_GAIN, **kwargs):
        super().__init__(lut, **kwargs)
        if min_split_gain < 0:
            raise ValueError("min_split_gain must be >= 0")
        self.min_split_gain = min_split_gain
        self.busy = False
        self._fused: StageBatch | None = None  # the running job's VLM batch whose action stage follows it in the job
        self._pays: dict[tuple[str, int], bool] = {}

    def split_pays(self, batch: StageBatch) -> bool:
        key = (batch.model_id, batch.bucket)
        if key not in self._pays:
            self._pays[key] = split_pays(self.lut, batch.model_id, batch.bucket, self.guard, self.min_split_gain)
        return self._pays[key]

    def start(self, now: float) -> list[StageJob]:
        if self.busy:
            return []
        vlm = self.next_batch(Stage.VLM, now)
        action = self.next_batch(Stage.ACTION, now)
        if vlm is None and action is None:
            return []
        choice = choose_partition(self.lut, (vlm.model_id, vlm.bucket) if vlm else None,
                                  (action.model_id, action.bucket) if action else None, self.guard)
        self.busy = True
        if vlm is not None and self.run_back_to_back(vlm, choice):
            return [self._monolithic_step(vlm, action, now)]
        batches = []
        if vlm:
            batches.append(self.on_share(vlm, choice.vlm_share))
        if action:
            batches.append(self.on_share(action, choice.action_share))
        return [StageJob("lockstep", now, batches, choice.predicted_s, sequential=choice.mode == "serial",
                         co_run=choice.mode == "split")]

    def run_back_to_back(self, vlm: StageBatch, choice: PartitionChoice) -> bool:
        """Whether `vlm`'s two stages run back to back now (the monolithic step) rather than pipelined: when this
        lockstep would not split anyway, or pipelining a batch like it does not pay (`split_pays`)."""
        return choice.mode == "serial" or not self.split_pays(vlm)

    def _monolithic_step(self, vlm: StageBatch, waiting: StageBatch | None, now: float) -> StageJob:
        """One job, back to back: the action batch already waiting (if any), then `vlm`'s two stages, each batch
        with the device to itself."""
        batches = [self.solo(waiting)] if waiting else []
        batches.append(self.solo(vlm))
        own = self.solo(StageBatch(vlm.model_id, Stage.ACTION.value, list(vlm.frames), vlm.bucket))
        action_start = now + sum(batch.seconds for batch in batches)
        for frame in own.frames:
            frame.action_start = action_start
        batches.append(own)
        self._fused = vlm
        return StageJob("lockstep", now, batches, sum(batch.seconds for batch in batches), sequential=True)

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        self.busy = False
        done = []
        for batch, end in zip(job.batches, batch_ends(job, now), strict=True):
            if batch is self._fused:  # its frames' action batch follows in this job, not in the queue
                for frame in batch.frames:
                    frame.vlm_done = end
                continue
            done += self.complete(batch, end)
        self._fused = None
        return done
