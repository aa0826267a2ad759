"""Device designs Robion is compared against, on the same queues, policies and LUT.

- ``MonolithicScheduler``: one model call per batch runs VLM then action back to back, each on the share where the
  LUT says it runs fastest (the whole GPU; on a CPU its best thread count); the next batch waits for the whole call
  (no stage split, no pipelining).
- ``StaticSplitScheduler``: stage-disaggregated with fixed batching, but each stage owns a fixed share of the
  device and runs its own batches independently (no lockstep, no per-batch partition choice).
"""

from __future__ import annotations

from oxygen_ros.engine.scheduler import bucket_for
from oxygen_ros.fleet.batching import Batch
from oxygen_ros.fleet.device import DeviceJob, QueuedDevice, StageRun
from oxygen_ros.fleet.lockstep import split_candidates
from oxygen_ros.fleet.profile_table import ProfileTable
from oxygen_ros.fleet.requests import FleetRequest, Stage


class MonolithicScheduler(QueuedDevice):
    """One lane; a batch of one model is served end to end (both stages) before the next one starts."""

    lane = "device"

    def __init__(self, lut: ProfileTable, **kwargs):
        super().__init__(lut, **kwargs)
        self.busy = False

    def start(self, now: float) -> list[DeviceJob]:
        if self.busy:
            return []
        batch = self.next_batch(Stage.VLM, now)
        if batch is None:
            return []
        action = Batch(batch.model_id, Stage.ACTION, batch.requests, batch.bucket)
        runs = [self.solo_run(b) for b in (batch, action)]
        self.busy = True
        job = DeviceJob(self.lane, now, runs, 0.0, sequential=True)
        job.predicted_s = job.duration()
        return [job]

    def finish(self, job: DeviceJob, now: float) -> list[FleetRequest]:
        self.busy = False
        vlm_end = job.start + job.stage_runs[0].lut_s
        for request in job.stage_runs[0].batch.requests:
            request.vlm_done = vlm_end
            request.action_start = vlm_end
            request.finish = now
        return list(job.stage_runs[0].batch.requests)


class StaticSplitScheduler(QueuedDevice):
    """Two independent lanes, VLM on ``vlm_share`` of the device and action on the rest, each starting a new
    batch as soon as it is free. They always share the device, so both suffer interference. By default the
    split is the one fixed split that best balances the two stages over all models in the LUT (so the baseline
    is a fair static choice, not a strawman 50/50)."""

    lanes = 2

    def __init__(self, lut: ProfileTable, vlm_share: float | None = None, **kwargs):
        super().__init__(lut, **kwargs)
        if vlm_share is None:
            vlm_share = best_static_share(lut, bucket_for(max(self.max_batch // 2, 1), self.max_batch))
        self.shares = {Stage.VLM: round(vlm_share, 6), Stage.ACTION: round(1 - vlm_share, 6)}
        self.busy = {Stage.VLM: False, Stage.ACTION: False}

    def start(self, now: float) -> list[DeviceJob]:
        started = []
        for stage in (Stage.VLM, Stage.ACTION):
            if self.busy[stage]:
                continue
            batch = self.next_batch(stage, now)
            if batch is None:
                continue
            share = self.shares[stage]
            lut_s = self.lut.latency(batch.model_id, stage, batch.bucket, share)
            self.busy[stage] = True
            started.append(
                DeviceJob(stage.value, now, [StageRun(batch, share, lut_s)], self.guard * lut_s, co_run=True)
            )
        return started

    def finish(self, job: DeviceJob, now: float) -> list[FleetRequest]:
        stage = job.stage_runs[0].batch.stage
        self.busy[stage] = False
        return self.complete_run(job.stage_runs[0], now)


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
