"""What every per-device scheduler shares: stage queues, queue policies, and the jobs it hands out.

A device scheduler never looks at a clock. It is told ``now`` when asked to start jobs and when a job finishes,
so the same object runs under the discrete-event simulator (simulated clock) and under a real executor
(wall clock, with ``run_job`` calling the engine's stage runner).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from oxygen_ros.engine.scheduler import bucket_for
from oxygen_ros.fleet.batching import Batch, form_batch
from oxygen_ros.fleet.policies import RemainingTime, make_policy
from oxygen_ros.fleet.profile_table import ProfileTable, StageRunner
from oxygen_ros.fleet.requests import FleetRequest, Stage, StageQueues


@dataclass
class StageRun:
    """One batch placed on ``share`` of the device, with its LUT latency there."""

    batch: Batch
    share: float
    lut_s: float


@dataclass
class DeviceJob:
    """What one execution lane of a device runs from ``start`` until it completes.

    ``sequential``: the stage runs go one after the other (monolithic call, or a time-sliced lockstep);
    otherwise they run side by side and the job lasts as long as its slowest stage run.
    ``co_run``: its stage runs share the device with other running jobs, so they suffer interference."""

    lane: str
    start: float
    stage_runs: list[StageRun]
    predicted_s: float
    sequential: bool = False
    co_run: bool = False

    def duration(self, interference: float = 1.0) -> float:
        """Latency from the LUT, inflated by ``interference`` (>= 1) when the job co-runs with other jobs."""
        factor = interference if self.co_run else 1.0
        times = [run.lut_s * factor for run in self.stage_runs]
        return sum(times) if self.sequential else max(times)


class QueuedDevice:
    """Base for the device schedulers: requests enter the VLM queues, batches are cut by the stage's policy."""

    lanes = 1
    """How many execution lanes the device has: each runs one job at a time (a real executor runs a
    one-lane design inline)."""

    def __init__(
        self,
        lut: ProfileTable,
        policy: str = "esf",
        max_batch: int = 8,
        guard: float = 1.1,
        drop_expired: bool = True,
        vlm_room: Callable[[str], int] | None = None,
    ):
        """`vlm_room(model_id)`: how many more requests of a model may enter a VLM batch now (real serving: the
        frame slots its KV pool has left, since a request holds its slot until its action stage); None: no
        limit (the simulator)."""
        if guard < 1.0:
            raise ValueError("the interference guard is a latency inflation factor and must be >= 1")
        self.lut = lut
        self.max_batch = max_batch
        self.guard = guard
        self.drop_expired = drop_expired
        self.vlm_room = vlm_room
        self.queues = {Stage.VLM: StageQueues(Stage.VLM), Stage.ACTION: StageQueues(Stage.ACTION)}
        self.policies = {Stage.VLM: make_policy(policy), Stage.ACTION: make_policy(policy)}
        self.dropped: list[FleetRequest] = []

    def submit(self, request: FleetRequest) -> None:
        self.queues[Stage.VLM].push(request)

    def pending(self) -> int:
        return sum(q.total() for q in self.queues.values())

    def remaining_estimate(self, stage: Stage) -> RemainingTime:
        """Service time still ahead of a model's head request, at the batch its queue would form, on the whole
        device (its fastest share). Used by ESF to rank queues; the exact partition is decided later.

        Not inflated by the guard: the guard is headroom for two stages co-running on split shares, and this
        estimate is of whole-device runs. Inflating it too made ESF give up on heads that could still make their
        deadline, and collapse under overload when the guard was set to a measured co-run slowdown.
        """
        queues = self.queues[stage]

        def remaining(model_id: str) -> float:
            bucket = bucket_for(max(queues.length(model_id), 1), self.max_batch)
            seconds = self.solo_latency(model_id, Stage.ACTION, bucket)
            if stage is Stage.VLM:
                seconds += self.solo_latency(model_id, Stage.VLM, bucket)
            return seconds

        return remaining

    def solo_latency(self, model_id: str, stage: Stage, bucket: int) -> float:
        """A stage's LUT latency with the device to itself, on its fastest share."""
        return self.lut.latency(model_id, stage, bucket, self.lut.fastest_share(model_id, stage, bucket))

    def solo_run(self, batch: Batch) -> StageRun:
        """``batch`` with the device to itself, on its fastest share."""
        share = self.lut.fastest_share(batch.model_id, batch.stage, batch.bucket)
        return StageRun(batch, share, self.lut.latency(batch.model_id, batch.stage, batch.bucket, share))

    def next_batch(self, stage: Stage, now: float) -> Batch | None:
        """Cut the next batch for ``stage`` at stage start ``now`` (expired requests are dropped first)."""
        queues = self.queues[stage]
        if self.drop_expired:
            self.dropped.extend(queues.drop_expired(now))
        model_id = self.policies[stage].choose(queues, now, self.remaining_estimate(stage))
        if model_id is None:
            return None
        limit = self.max_batch
        if stage is Stage.VLM and self.vlm_room is not None:
            room = min(limit, self.vlm_room(model_id))
            if room < 1:  # this model's frames wait until its action stage gives slots back
                return None
            limit = 1 << (room.bit_length() - 1)  # a power-of-two bucket
        return form_batch(queues, model_id, limit, now)

    def complete_run(self, run: StageRun, now: float) -> list[FleetRequest]:
        """VLM outputs move on to the action queues; action outputs finish their requests."""
        if run.batch.stage is Stage.VLM:
            for request in run.batch.requests:
                request.vlm_done = now
                self.queues[Stage.ACTION].push(request)
            return []
        for request in run.batch.requests:
            request.finish = now
        return list(run.batch.requests)

    def start(self, now: float) -> list[DeviceJob]:
        """Start a job on every idle lane that has something to do; the caller reports each back to ``finish``."""
        raise NotImplementedError

    def finish(self, job: DeviceJob, now: float) -> list[FleetRequest]:
        """Mark ``job`` done at ``now``; returns the requests that completed."""
        raise NotImplementedError


def run_job(job: DeviceJob, runner: StageRunner) -> float:
    """Run ``job`` for real with a stage runner and return the wall time it took.

    Side-by-side stage runs go concurrently (on a GPU the runner maps a share to its own stream; on a CPU to a thread
    budget): through the runner's own ``submit(model_id, stage, requests, share) -> Future`` when it has one
    (persistent stage workers, as ``model_runner.ModelRunner``), else on one thread per stage run. Sequential ones run
    one after the other."""
    start = time.perf_counter()
    args = [(s.batch.model_id, s.batch.stage, s.batch.requests, s.share) for s in job.stage_runs]
    if job.sequential or len(job.stage_runs) == 1:
        for arg in args:
            runner(*arg)
    elif hasattr(runner, "submit"):
        futures = [runner.submit(*arg) for arg in args]
        for future in futures:
            future.result()
    else:
        with ThreadPoolExecutor(max_workers=len(job.stage_runs)) as pool:
            futures = [pool.submit(runner, *arg) for arg in args]
            for future in futures:
                future.result()
    return time.perf_counter() - start
