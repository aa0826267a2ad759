"""The static split planner: stage disaggregation on fixed shares (the fleet's `disaggregated` design).

Two independent lanes, the VLM stage on `vlm_share` of the device and the action stage on the rest, each starting
its next batch as soon as it is free (no lockstep, no per-batch partition choice). The two always share the
device, so both suffer interference. By default the split is the one fixed split that best balances the two
stages over all models in the profile table, so the design is compared at its best fixed choice, not at 50/50.
"""

from __future__ import annotations

from ..engine.frames import ActionFrame, bucket_for
from ..engine.planners import Stage, StageJob
from .lockstep import split_candidates
from .profile_table import ProfileTable
from .two_stage import TwoStagePlanner


class StaticSplitPlanner(TwoStagePlanner):
    lanes = 2

    def __init__(self, lut: ProfileTable, vlm_share: float | None = None, **kwargs):
        super().__init__(lut, **kwargs)
        if vlm_share is None:
            vlm_share = best_static_share(lut, bucket_for(max(self.max_batch // 2, 1), self.max_batch))
        self.shares = {Stage.VLM: round(vlm_share, 6), Stage.ACTION: round(1 - vlm_share, 6)}
        self.busy = {Stage.VLM: False, Stage.ACTION: False}

    def start(self, now: float) -> list[StageJob]:
        started = []
        for stage in (Stage.VLM, Stage.ACTION):
            if self.busy[stage]:
                continue
            batch = self.next_batch(stage, now)
            if batch is None:
                continue
            self.on_share(batch, self.shares[stage])
            self.busy[stage] = True
            started.append(StageJob(stage.value, now, [batch], self.guard * batch.seconds, co_run=True))
        return started

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        (batch,) = job.batches
        self.busy[Stage(batch.stage)] = False
        return self.complete(batch, now)


def best_static_share(lut: ProfileTable, bucket: int) -> float:
    """The VLM share, among those every model has profiled, that minimizes the mean over models of the slower
    stage at ``bucket`` (a split that keeps the two independent stages' throughputs matched)."""
    models = lut.models()
    common = set(split_candidates(lut, models[0], models[0]))
    for model_id in models[1:]:
        common &= set(split_candidates(lut, model_id, model_id))
    if not common:
        raise ValueError("the LUT has no VLM/action share pair profiled for every model")

    def mean_bottleneck(share: float) -> float:
        return sum(
            max(
                lut.latency(m, Stage.VLM, bucket, share),
                lut.latency(m, Stage.ACTION, bucket, round(1 - share, 6)),
            )
            for m in models
        ) / len(models)

    return min(sorted(common), key=mean_bottleneck)
