"""The fleet's device schedulers as the engine runtime's stage plug-in, and the runtime's runners as a stage runner.

`FleetStagePlanner` wraps a `QueuedDevice` (the Robion lockstep, or the static split) so that the engine's
runtime asks it which stage batches run next and on which shares (`engine.scheduler.StagePlanner`): each engine
frame rides in a `FleetRequest` (its `context`), with the frame's own arrival and camera-anchored deadline. Frames
the device drops from its queues because their deadline passed come back through `take_expired`.

`stage_runner(runners, workers)` times the runtime's own model runners on their stage workers, so a server can
profile its table (`profile_table.profile_stages`) with exactly what will serve, and `stage_submitter` starts them
without waiting, so it can also measure what the two stages cost side by side (`profile_table.measure_co_run`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

from oxygen_ros.engine.model_runner import ModelRunner
from oxygen_ros.engine.scheduler import ActionFrame, StageBatch, StageJob
from oxygen_ros.engine.stage_workers import StageWorkers
from oxygen_ros.fleet.device import QueuedDevice
from oxygen_ros.fleet.requests import FleetRequest, Stage


class FleetStagePlanner:
    """`device` may be set after construction (a server profiles its runners first), before the first frame."""

    def __init__(self, device: QueuedDevice | None = None):
        self.device = device
        self._ids = itertools.count()

    def submit(self, frame: ActionFrame) -> None:
        self.device.submit(FleetRequest(next(self._ids), frame.robot_id, frame.model_id, frame.arrival,
                                        frame.deadline, context=frame))

    @property
    def lanes(self) -> int:
        return self.device.lanes

    def pending(self) -> int:
        return self.device.pending()

    def start(self, now: float) -> list[StageJob]:
        return [StageJob([StageBatch(s.batch.model_id, s.batch.stage.value, [r.context for r in s.batch.requests],
                                      s.batch.bucket, s.share) for s in job.stage_runs], job.sequential, job)
                for job in self.device.start(now)]

    def finish(self, job: StageJob, now: float) -> None:
        self.device.finish(job.token, now)

    def take_expired(self) -> list[ActionFrame]:
        expired = [request.context for request in self.device.dropped]
        self.device.dropped.clear()
        return expired


def stage_submitter(runners: Mapping[str, ModelRunner], workers: StageWorkers):
    """`submit(model_id, stage, requests, share) -> Future` on placeholder requests (zero-filled rows), for
    profiling: the VLM stage prefills and gives the slots back, the action stage denoises padding rows only."""

    def submit(model_id: str, stage: Stage, requests: Sequence[FleetRequest], share: float) -> Future:
        runner = runners[model_id]
        bucket = len(requests)
        if Stage(stage) is Stage.VLM:
            def call():
                runner.free(runner.prefill_stage([None] * bucket, bucket).slots)
        else:
            def call():
                runner.denoise_stage([], [], bucket).cpu()
        return workers.submit(stage, share, call)

    return submit


def stage_runner(runners: Mapping[str, ModelRunner], workers: StageWorkers):
    """`run(model_id, stage, requests, share)`: `stage_submitter`'s call, returning when it is done."""
    submit = stage_submitter(runners, workers)

    def run(model_id: str, stage: Stage, requests: Sequence[FleetRequest], share: float) -> None:
        submit(model_id, stage, requests, share).result()

    return run
