"""Two stage-split baselines for the simulator, planners on the same queues, policies and LUT as the other designs.

- ``OmniPlanner`` (vLLM-Omni-like): the VLM stage and the action stage are separate processes on one GPU, each
  with its own queue and continuous batching: a stage starts its next batch as soon as it is free, taking what is
  queued (up to the max batch). Nothing coordinates the two: a stage that starts while the other stage's process
  is busy shares the device with it, modelled as the LUT latency on its share of the one fixed split that best
  balances the stages (``static_split.best_static_share``, as a per-process limit of the device's compute could
  give) inflated by the simulator's interference; a stage that starts alone runs on its fastest share. All three
  choices favour the baseline: the best split, the whole device when alone, and a running stage is not slowed
  when the other starts later. Plain time-slicing of two processes would cost more. Every batch pays the
  measured inter-process hand-offs (``evaluation/fleet/ipc.py``): the client's inputs into the VLM process, the
  prefix K/V from the VLM process to the action process, the action chunk back; the sending stage's process is
  busy until its hand-off is done.
- ``InterGpuPlanner``: the VLM stage on one GPU and the action stage on another, each with the whole device and
  continuous batching; a VLM batch's prefix K/V then crosses the link between the GPUs (``Link``: bytes /
  bandwidth + latency, one transfer at a time, overlapping the next VLM batch) before it joins the action queue.
  One planner stands for a pair of GPUs: compare it per GPU.

Their costs come from the LUT's ``meta``: ``ipc_s`` (hop -> bucket -> seconds, from ``fleet-ipc``) for the omni
design, ``kv_bytes_per_request`` and ``link`` (``{"bytes_per_s", "latency_s"}``) for the inter-GPU split
(``attach_hop_costs``). These designs exist in the simulator only; no server runs them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..engine.frames import ActionFrame, bucket_for, power_of_two_buckets
from ..engine.planners import Stage, StageBatch, StageJob
from ..engine.queues import Remaining
from .profile_table import ProfileTable
from .static_split import best_static_share
from .two_stage import TwoStagePlanner


@dataclass(eq=False)
class HopJob(StageJob):
    """A job whose lane is also busy ``hop_s`` (an inter-process hand-off or a link transfer) after its batch
    runs; the hop is host or link time, so interference does not inflate it. ``payload``: a batch in transit (a
    transfer runs no batch)."""

    hop_s: float = 0.0
    payload: StageBatch | None = None

    def duration(self, interference: float = 1.0) -> float:
        return (super().duration(interference) if self.batches else 0.0) + self.hop_s


@dataclass(frozen=True)
class Link:
    """A GPU-to-GPU link: a transfer of n bytes takes n / bytes_per_s + latency_s."""

    bytes_per_s: float
    latency_s: float

    def transfer_s(self, n_bytes: int) -> float:
        return n_bytes / self.bytes_per_s + self.latency_s


LINKS = {
    # Assumed effective figures, not measured here: PCIe 4.0 x16 peer-to-peer (32 GB/s raw per direction) and
    # NVLink 4 on H100 / H200 (450 GB/s per direction); about 10 us to launch and complete one copy.
    "pcie4": Link(25e9, 10e-6),
    "nvlink4": Link(450e9, 10e-6),
}


def attach_hop_costs(lut: ProfileTable, ipc_s: dict[str, dict[int, float]], ipc_way: str,
                     kv_bytes_per_request: int, link: Link, link_name: str) -> ProfileTable:
    """A copy of ``lut`` whose meta carries the hop costs the omni and inter-GPU designs read."""
    meta = {**lut.meta, "ipc_s": ipc_s, "ipc_way": ipc_way, "kv_bytes_per_request": kv_bytes_per_request,
            "link": {"name": link_name, "bytes_per_s": link.bytes_per_s, "latency_s": link.latency_s}}
    return ProfileTable(dict(lut.entries), meta)


def _needs(lut: ProfileTable, key: str, design: str):
    if key not in lut.meta:
        raise ValueError(f"the {design} design needs meta[{key!r}] in the LUT: measure it with fleet-ipc and pass "
                         "it to fleet-sim with --ipc")
    return lut.meta[key]


class _StagePipeline(TwoStagePlanner):
    """Continuous batching on two independent stage lanes; subclasses say what a batch costs beyond the LUT."""

    needs_hop_costs = True
    """It reads hand-off or link costs from the LUT's meta (``attach_hop_costs``)."""

    def __init__(self, lut: ProfileTable, **kwargs):
        super().__init__(lut, **kwargs)
        self.busy = {Stage.VLM: False, Stage.ACTION: False}

    def stage_job(self, batch: StageBatch, now: float, other_running: bool) -> HopJob:
        """The job of ``batch`` on its stage's lane; ``other_running``: the other stage runs at the same time."""
        raise NotImplementedError

    def remaining_extra(self, stage: Stage, bucket: int) -> float:
        """Hop time still ahead of a request at ``stage``'s queue, beyond the stages' LUT latencies."""
        raise NotImplementedError

    def remaining(self, stage: Stage) -> Remaining:
        base = super().remaining(stage)
        queues = self.queues[stage]

        def remaining(model_id: str) -> float:
            bucket = bucket_for(max(queues.length(model_id), 1), self.max_batch)
            return base(model_id) + self.remaining_extra(stage, bucket)

        return remaining

    def start_stages(self, now: float) -> list[StageJob]:
        """Every free stage takes its next batch; a stage starting together with the other one co-runs with it."""
        batches = {stage: self.next_batch(stage, now) for stage in (Stage.VLM, Stage.ACTION) if not self.busy[stage]}
        batches = {stage: batch for stage, batch in batches.items() if batch is not None}
        for stage in batches:
            self.busy[stage] = True
        return [self.stage_job(batch, now, self.busy[_other(stage)]) for stage, batch in batches.items()]

    def finish_stage(self, job: StageJob, now: float) -> list[ActionFrame]:
        (batch,) = job.batches
        self.busy[Stage(batch.stage)] = False
        return self.complete(batch, now)


def _other(stage: Stage) -> Stage:
    return Stage.ACTION if stage is Stage.VLM else Stage.VLM


class OmniPlanner(_StagePipeline):
    """Stage processes on one GPU with continuous batching and measured IPC per hop (see the module doc)."""

    lanes = 2

    def __init__(self, lut: ProfileTable, vlm_share: float | None = None, **kwargs):
        super().__init__(lut, **kwargs)
        self.ipc = _needs(lut, "ipc_s", "omni")
        for hop in ("input", "kv", "output"):
            missing = [b for b in power_of_two_buckets(self.max_batch) if b not in self.ipc.get(hop, {})]
            if missing:
                raise ValueError(f"no measured {hop!r} hand-off for batch buckets {missing}")
        if vlm_share is None:
            vlm_share = best_static_share(lut, bucket_for(max(self.max_batch // 2, 1), self.max_batch))
        self.co_shares = {Stage.VLM: round(vlm_share, 6), Stage.ACTION: round(1 - vlm_share, 6)}

    def hop(self, name: str, bucket: int) -> float:
        return self.ipc[name][bucket]

    def remaining_extra(self, stage: Stage, bucket: int) -> float:
        extra = self.hop("output", bucket)
        if stage is Stage.VLM:
            extra += self.hop("input", bucket) + self.hop("kv", bucket)
        return extra

    def stage_job(self, batch: StageBatch, now: float, other_running: bool) -> HopJob:
        """``batch`` alone on its fastest share, or co-running with the other stage's process on its stage's share
        of the split."""
        stage = Stage(batch.stage)
        if other_running:
            self.on_share(batch, self.co_shares[stage])
        else:
            self.solo(batch)
        if stage is Stage.VLM:
            hop = self.hop("input", batch.bucket) + self.hop("kv", batch.bucket)
        else:
            hop = self.hop("output", batch.bucket)
        predicted = (self.guard if other_running else 1.0) * batch.seconds + hop
        return HopJob(stage.value, now, [batch], predicted, co_run=other_running, hop_s=hop)

    def start(self, now: float) -> list[StageJob]:
        return self.start_stages(now)

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        return self.finish_stage(job, now)


class InterGpuPlanner(_StagePipeline):
    """VLM on one GPU, action on another, the prefix K/V sent over the link between them (see the module doc)."""

    lanes = 3
    gpus = 2

    def __init__(self, lut: ProfileTable, **kwargs):
        super().__init__(lut, **kwargs)
        self.kv_bytes = int(_needs(lut, "kv_bytes_per_request", "intergpu"))
        link = _needs(lut, "link", "intergpu")
        self.link = Link(float(link["bytes_per_s"]), float(link["latency_s"]))
        self.in_transit: deque[StageBatch] = deque()
        self.link_busy = False

    def transfer_s(self, frames: int) -> float:
        """Only the batch's real frames' K/V crosses, not the padding."""
        return self.link.transfer_s(frames * self.kv_bytes)

    def remaining_extra(self, stage: Stage, bucket: int) -> float:
        return self.transfer_s(bucket) if stage is Stage.VLM else 0.0

    def stage_job(self, batch: StageBatch, now: float, other_running: bool) -> HopJob:
        self.solo(batch)  # its own GPU: the other stage does not matter
        return HopJob(batch.stage, now, [batch], batch.seconds)

    def start(self, now: float) -> list[StageJob]:
        started: list[StageJob] = []
        if not self.link_busy and self.in_transit:
            batch = self.in_transit.popleft()
            seconds = self.transfer_s(len(batch.frames))
            self.link_busy = True
            started.append(HopJob("link", now, [], seconds, hop_s=seconds, payload=batch))
        return started + self.start_stages(now)

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        if job.lane == "link":
            self.link_busy = False
            for frame in job.payload.frames:
                self.queues[Stage.ACTION].push(frame)
            return []
        (batch,) = job.batches
        if Stage(batch.stage) is Stage.ACTION:
            return self.finish_stage(job, now)
        self.busy[Stage.VLM] = False
        for frame in batch.frames:
            frame.vlm_done = now
        self.in_transit.append(batch)
        return []
