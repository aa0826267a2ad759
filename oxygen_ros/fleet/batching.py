"""Fixed-size batching: power-of-two buckets, formed only when a stage starts.

Latencies are profiled only for a few batch sizes, so a batch is padded up to the next bucket (a few fixed shapes
are also what CUDA graphs need: with `cuda_graphs` on a GPU each bucket's action stage replays a graph per SM
partition, `model_runner.use_stage_graphs`). A batch is cut from the queue at the moment its stage starts and is
closed from then on: a request that arrives while the stage runs waits for the next stage start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oxygen_ros.engine.scheduler import bucket_for
from oxygen_ros.fleet.requests import FleetRequest, Stage, StageQueues


def power_of_two_buckets(max_batch: int) -> list[int]:
    """Bucket sizes 1, 2, 4, ... up to and including ``max_batch`` (which must itself be a power of two)."""
    if max_batch < 1 or max_batch & (max_batch - 1):
        raise ValueError(f"max_batch must be a power of two >= 1, got {max_batch}")
    return [1 << i for i in range(max_batch.bit_length())]


@dataclass
class Batch:
    """Requests of one model that run one stage together, padded to ``bucket`` for latency purposes."""

    model_id: str
    stage: Stage
    requests: list[FleetRequest] = field(default_factory=list)
    bucket: int = 1

    @property
    def padding(self) -> int:
        return self.bucket - len(self.requests)


def form_batch(queues: StageQueues, model_id: str, max_batch: int, now: float) -> Batch:
    """Cut a batch for ``model_id`` at stage start ``now``: the bucket covering the queue (capped at max_batch),
    filled with that model's earliest-deadline requests. Only requests already queued at ``now`` can be taken,
    which is what makes batches closed once their stage has started."""
    bucket = bucket_for(queues.length(model_id), max_batch)
    requests = queues.pop_earliest(model_id, bucket)
    for request in requests:
        if request.arrival > now + 1e-12:
            raise RuntimeError(
                f"request {request.request_id} arrives at {request.arrival} after stage start {now}"
            )
        if queues.stage is Stage.VLM:
            request.vlm_start = now
        else:
            request.action_start = now
    return Batch(model_id, queues.stage, requests, bucket)
