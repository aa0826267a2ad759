"""The lockstep planner with guarded compute partitioning (the Robion device design).

Every lockstep runs one VLM batch and one action batch at the same time on complementary partitions of the
device, and both end together: a lockstep lasts as long as the slower of the two. Outputs of a VLM batch feed the
action queues for a later lockstep, so the two stages of consecutive batches pipeline on one device.

The partition is picked per lockstep from the LUT, never preempted. "Guarded": a co-running stage is predicted
at its LUT latency times a guard (headroom for interference between the partitions), and the lockstep splits the
device only when the guarded split beats running the two batches back to back, each with the device to itself
(on its fastest share: the whole GPU, or on a CPU the thread count the LUT found fastest).

Pipelining costs latency (a frame waits a lockstep between its two stages) and a co-run may be slower than any
profile said. So whether a VLM batch is pipelined or runs its two stages back to back in one job (the monolithic
step: an action batch already waiting first, then the batch's VLM and action stages, each on its fastest share)
is chosen from what this device measures each way, per model and bucket (`split_meter`): the table's figures
(the guard for a split) seed the measurement, every finished job updates it, the way measuring worse is tried
again now and then while nothing waits, and a split is taken only where it measured faster. The guard of a
lockstep with a VLM batch is that batch's measured split / back-to-back ratio.

What holds, and where it was measured: where a split measures slower than back to back, the lockstep runs the
monolithic step but for explorations while the device is idle, so it serves as the monolithic design does up to the
stage workers' own overhead (two calls instead of one); where a split measures faster it pipelines, and a pipelined
frame's extra lockstep of latency can cost more than the throughput gained where the gain is small (in the
simulator's interference sweep, one or two robots fewer than monolithic at 1.3-1.4). Whether Robion serves more or
fewer robots than monolithic is a measurement, not a property: `docs/fleet.md` has the figures, simulated and real,
and where it lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.frames import ActionFrame
from ..engine.planners import Stage, StageBatch, StageJob
from .profile_table import ProfileTable
from .split_meter import EXPLORE_EVERY, Key, SplitMeter, Way, pipeline_pays
from .two_stage import TwoStagePlanner

StageLoad = Key
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


def table_costs(lut: ProfileTable, model_id: str, bucket: int) -> tuple[float | None, float]:
    """The table's two ways for a VLM batch of `model_id` and `bucket`: a split lockstep of it beside an action
    batch of the same model and bucket, on the best complementary shares (unguarded; None where no split share
    was profiled or none beats back to back even unguarded), and its two stages back to back on their fastest
    shares."""
    back_to_back = sum(lut.solo(model_id, stage, bucket)[1] for stage in Stage)
    choice = choose_partition(lut, (model_id, bucket), (model_id, bucket), guard=1.0)
    return (choice.predicted_s if choice.mode == "split" else None), back_to_back


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
    """One device, one lockstep at a time: VLM batch and action batch start together and finish together, or, where
    this device measures that pipelining a batch does not pay, its two stages back to back (the monolithic step).
    `explore_every`: one VLM batch of a (model, bucket) in this many runs the way measuring worse (0: never)."""

    def __init__(self, lut: ProfileTable, explore_every: int = EXPLORE_EVERY, **kwargs):
        super().__init__(lut, **kwargs)
        if explore_every < 0:
            raise ValueError("explore_every must be >= 0")
        self.explore_every = explore_every
        self.meter = SplitMeter(split_prior=self.guard)
        self.busy = False
        self.explored = 0  # VLM batches run the way measuring worse
        self._fused: StageBatch | None = None  # the running job's VLM batch whose action stage follows it in the job
        self._table: dict[Key, tuple[float | None, float]] = {}
        self._since: dict[Key, int] = {}  # VLM batches of a key since its last exploration
        self._split_next = False  # an explored split left its action batch waiting: split the next lockstep beside it
        self._ways: dict[StageJob, tuple[Key, Way]] = {}  # running jobs that measure a way

    def costs(self, key: Key) -> tuple[float | None, float]:
        """What a split lockstep (None: never) and back to back take for a VLM batch of `key`, as measured here."""
        if key not in self._table:
            self._table[key] = table_costs(self.lut, *key)
        split, back_to_back = self._table[key]
        measured_b2b = back_to_back * self.meter.ratio(key, Way.BACK_TO_BACK)
        return (None if split is None else split * self.meter.ratio(key, Way.SPLIT)), measured_b2b

    def measured_guard(self, key: Key) -> float:
        """The co-run slowdown measured for `key`: its split ratio over its back-to-back ratio."""
        return self.meter.ratio(key, Way.SPLIT) / self.meter.ratio(key, Way.BACK_TO_BACK)

    def way_for(self, vlm: StageBatch, action_waiting: bool, now: float) -> tuple[Way, bool]:
        """How `vlm` runs, and whether that is an exploration: pipelined where a split measures faster than back to
        back (`pipeline_pays`), else back to back; the other way once `explore_every` batches of its (model,
        bucket) ran since it was last tried, at the first batch that leaves no frame waiting (a split only where
        the batch's frames would still make their deadline through two split locksteps)."""
        key = (vlm.model_id, vlm.bucket)
        split_s, back_to_back_s = self.costs(key)
        if split_s is None:
            return Way.BACK_TO_BACK, False
        split_fits = 2.0 * split_s <= min(f.deadline for f in vlm.frames) - now
        preferred = Way.SPLIT if pipeline_pays(split_s, back_to_back_s) else Way.BACK_TO_BACK
        since = self._since[key] = self._since.get(key, 0) + 1
        if self._split_next:  # an explored batch's action stage waits: this lockstep measures the split beside it
            self._split_next = False
            if preferred is Way.BACK_TO_BACK and split_fits:
                self.explored += 1
                return Way.SPLIT, True
        # trying the way that measures worse never delays a frame waiting behind it
        idle = not self.queues[Stage.VLM].total() and not action_waiting
        if self.explore_every and since >= self.explore_every and idle:
            if preferred is Way.BACK_TO_BACK and not split_fits:
                return preferred, False
            self._since[key] = 0
            self.explored += 1
            self._split_next = preferred is Way.BACK_TO_BACK  # alone now: the split is measured in the next lockstep
            return (Way.SPLIT if preferred is Way.BACK_TO_BACK else Way.BACK_TO_BACK), True
        return preferred, False

    def start(self, now: float) -> list[StageJob]:
        if self.busy:
            return []
        vlm = self.next_batch(Stage.VLM, now)
        action = self.next_batch(Stage.ACTION, now)
        if vlm is None and action is None:
            return []
        self.busy = True
        guard = self.guard
        if vlm is not None:
            way, explored = self.way_for(vlm, action is not None, now)
            if way is Way.BACK_TO_BACK:
                return [self._monolithic_step(vlm, action, now)]
            # an explored split is tried wherever the table has one, whatever the co-run measured so far
            guard = 1.0 if explored else self.measured_guard((vlm.model_id, vlm.bucket))
        choice = choose_partition(self.lut, (vlm.model_id, vlm.bucket) if vlm else None,
                                  (action.model_id, action.bucket) if action else None, guard)
        if vlm is not None and choice.mode == "serial":  # this pair does not split: the monolithic step
            return [self._monolithic_step(vlm, action, now)]
        batches = []
        if vlm:
            batches.append(self.on_share(vlm, choice.vlm_share))
        if action:
            batches.append(self.on_share(action, choice.action_share))
        job = StageJob("lockstep", now, batches, choice.predicted_s, co_run=choice.mode == "split")
        if job.co_run:  # predicted as measured here, also where an exploration chose the split unguarded
            key = (vlm.model_id, vlm.bucket)
            job.predicted_s = self.measured_guard(key) * max(batch.seconds for batch in batches)
            self._ways[job] = (key, Way.SPLIT)
        return [job]

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
        job = StageJob("lockstep", now, batches, sum(batch.seconds for batch in batches), sequential=True)
        self._ways[job] = ((vlm.model_id, vlm.bucket), Way.BACK_TO_BACK)
        return job

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        self.busy = False
        measured = self._ways.pop(job, None)
        if measured is not None:  # predicted: the table's seconds of its batches (a split's without the guard)
            seconds = [batch.seconds for batch in job.batches]
            self.meter.record(*measured, now - job.start, sum(seconds) if job.sequential else max(seconds))
        done = []
        for batch, end in zip(job.batches, batch_ends(job, now), strict=True):
            if batch is self._fused:  # its frames' action batch follows in this job, not in the queue
                for frame in batch.frames:
                    frame.vlm_done = end
                continue
            done += self.complete(batch, end)
        self._fused = None
        return done
