"""The real stage runner: executes fleet batches on pi0.5-shaped models that share one device.

Each served model id (a preset, a model config JSON, or a LeRobot checkpoint folder, with a seed for random
weights, so "two fine-tuned variants" of one architecture and a second architecture can be co-located) gets its
model and its own ``KVPool``. A batch's VLM stage prefills the requests' observations into KV slots of that pool,
padded to the power-of-two bucket; the requests carry their slot to the action stage, which denoises an action
chunk from it and frees the slot.

What a device *share* means here:

- CPU: the device is ``cpu_threads`` cores. A stage given share ``s`` runs with an intra-op budget of
  ``max(1, round(s * cpu_threads))`` threads. ``torch.set_num_threads`` also writes a process-wide default, but the
  OpenMP backend keeps the effective value per calling thread once that thread has run an op; so each stage runs on
  its own persistent worker thread that sets its budget before every call, and two co-running stages really hold
  their own budgets (``test_fleet_runner`` checks this). Both workers are Python threads of one process, so
  co-running stages also contend for the interpreter lock between kernels: that slowdown is measured by
  ``fleet-profile`` (``co_run_slowdown``), not assumed away.
- CUDA: a share is a number of SMs. Each stage worker issues its kernels on a stream of a green context that holds
  its share of the SMs, the VLM stage and the action stage of a split on disjoint groups (``sm_partition``), so a
  VLM batch and an action batch overlap on the GPU without taking each other's SMs; share 1.0 is a plain stream on
  the whole device. Green contexts need NVIDIA's ``cuda-bindings`` package and a driver that has them; without
  them the runner says why once and falls back to one plain stream per stage (shares then overlap, not enforced),
  and ``partition_mode`` records which of the two ran.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from oxygen_ros.engine.kv_pool import KVPool
from oxygen_ros.engine.model_runner import concat_inputs, zero_inputs
from oxygen_ros.engine.scheduler import bucket_for
from oxygen_ros.fleet.requests import FleetRequest, Stage
from oxygen_ros.fleet.sm_partition import SmPartitions
from oxygen_ros.model.config import PRESETS, Pi05Config
from oxygen_ros.model.pi05 import Pi05Model, build_model


@dataclass(frozen=True)
class ModelSpec:
    """A served model: ``source`` is a preset name, a model config JSON file or a LeRobot pi05 checkpoint folder;
    ``seed`` picks the random weights of a preset or config (ignored for a checkpoint)."""

    model_id: str
    source: str
    seed: int = 0

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """``id=source[:seed]`` or ``source[:seed]`` (then the id is the whole text), e.g. ``a=tiny:1``."""
        model_id, _, rest = text.partition("=")
        if not rest:
            model_id, rest = text, text
        source, _, seed = rest.rpartition(":") if ":" in rest else (rest, "", "0")
        if not model_id or not source:
            raise ValueError(f"bad model spec {text!r}; expected id=source[:seed]")
        return cls(model_id, source, int(seed or 0))


def load_model(spec: ModelSpec, device: torch.device | str, dtype: torch.dtype) -> tuple[Pi05Model, dict | None]:
    """The model and its norm stats (None for random weights)."""
    if spec.source in PRESETS:
        return build_model(PRESETS[spec.source], device, dtype, spec.seed), None
    path = Path(spec.source)
    if path.is_file():
        return build_model(Pi05Config.load_json(path), device, dtype, spec.seed), None
    if path.is_dir():
        from oxygen_ros.model.checkpoint import load_checkpoint

        loaded = load_checkpoint(path, device, dtype)
        return loaded.model, loaded.norm_stats
    raise ValueError(f"model source {spec.source!r} is neither a preset ({sorted(PRESETS)}) nor a file or folder")


class ServedModel:
    """One model on the device with its KV pool. The pool holds ``max_inflight`` request slots plus two sets of
    ``max_batch`` padding slots, one per stage, so a padded VLM batch and a padded action batch of the same model
    can run side by side without touching each other's slots."""

    def __init__(self, spec: ModelSpec, device, dtype, max_batch: int, max_inflight: int, seed: int = 0):
        self.spec = spec
        self.model, self.norm_stats = load_model(spec, device, dtype)
        self.config: Pi05Config = self.model.config
        self.device = torch.device(device)
        self.pool = KVPool(self.config, max_inflight + 2 * max_batch, 0, dtype, device)
        self.pad_slots = {
            stage: [self.pool.allocate(f"pad-{stage.value}") for _ in range(max_batch)] for stage in Stage
        }
        self.stock_frame = zero_inputs(self.config, 1, device, dtype)  # padding rows and profiling placeholders
        self.noise = torch.Generator().manual_seed(seed)


class StageWorker:
    """A persistent thread that runs one stage's calls with that stage's thread budget (CPU) or with the stream of
    its share's SM partition (CUDA; a plain stream of its own for the whole device or without partitions)."""

    def __init__(self, name: str, device: torch.device, stage: Stage, partitions: SmPartitions | None = None):
        self.device = device
        self.stage = stage
        self.partitions = partitions
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = -1
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, threads: int, *args, share: float = 1.0) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, threads, share, args))
        return future

    def _stream_for(self, share: float) -> torch.cuda.Stream:
        if self.partitions is not None:
            return self.partitions.stream(self.stage, share) or self.stream
        return self.stream

    def _loop(self) -> None:
        torch.get_num_threads()  # this thread's lazy init; later set_num_threads calls then stay per thread
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, threads, share, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if self.stream is None:
                    if threads != self._threads:
                        torch.set_num_threads(threads)
                        self._threads = threads
                    result = fn(*args)
                else:
                    stream = self._stream_for(share)
                    with torch.cuda.stream(stream):
                        result = fn(*args)
                    stream.synchronize()
                future.set_result(result)
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                future.set_exception(err)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)


class ModelRunner:
    """``runner(model_id, stage, requests, share)``: the real ``StageRunner`` for the fleet schedulers.

    Requests carry ``inputs`` (a ``ModelInputs`` batch of one) from the front end; a request without inputs (a
    profiling placeholder) uses a zero-filled frame. After the action stage each request holds ``actions``
    ([horizon, action_dim] float32 on the CPU, model space) and no slot."""

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_batch: int = 8,
        max_inflight: int = 64,
        cpu_threads: int | None = None,
        num_steps: int | None = None,
        sm_partitions: bool = True,
    ):
        if len({s.model_id for s in specs}) != len(specs):
            raise ValueError("model ids must be unique")
        self.device = torch.device(device)
        self.max_batch = max_batch
        self.num_steps = num_steps
        self.cpu_threads = cpu_threads or torch.get_num_threads()
        self.models = {
            s.model_id: ServedModel(s, self.device, dtype, max_batch, max_inflight, seed=k)
            for k, s in enumerate(specs)
        }
        self.partitions: SmPartitions | None = None
        self.partition_mode = "CPU thread budget" if self.device.type == "cpu" else "plain streams (not enforced)"
        if self.device.type == "cuda" and sm_partitions:
            try:
                self.partitions = SmPartitions(self.device)
                self.partition_mode = "green-context SM partitions"
            except (ImportError, RuntimeError) as error:
                warnings.warn(f"GPU shares are not enforced: SM partitions are unavailable ({error})", stacklevel=2)
                self.partition_mode = f"plain streams (not enforced: {error})"
        self.workers = {
            stage: StageWorker(f"fleet-{stage.value}", self.device, stage, self.partitions) for stage in Stage
        }
        if self.device.type == "cuda":  # green-context streams do not wait for the default stream's uploads
            torch.cuda.synchronize(self.device)
        self._lock = threading.Lock()

    def threads_for(self, share: float) -> int:
        return max(1, round(share * self.cpu_threads))

    def shares(self) -> list[float]:
        """The partition choices this device offers: multiples of one core on a CPU; on a GPU the tenths whose
        SM groups the hardware can make (every tenth without partitions)."""
        if self.device.type == "cpu":
            return [round(k / self.cpu_threads, 6) for k in range(1, self.cpu_threads + 1)]
        if self.partitions is not None:
            return self.partitions.shares()
        return [round(0.1 * k, 1) for k in range(1, 11)]

    def sm_count(self, stage: Stage, share: float) -> int | None:
        """SMs a stage gets at ``share`` on a partitioned GPU (None elsewhere)."""
        return self.partitions.sm_count(stage, share) if self.partitions is not None else None

    def submit(self, model_id: str, stage: Stage, requests: Sequence[FleetRequest], share: float) -> Future:
        """Start one stage of one batch on its stage worker; the future resolves when the outputs are ready."""
        if model_id not in self.models:
            raise KeyError(f"model {model_id!r} is not served here (served: {sorted(self.models)})")
        run = self._prefill if Stage(stage) is Stage.VLM else self._denoise
        return self.workers[Stage(stage)].submit(run, self.threads_for(share), self.models[model_id], list(requests),
                                                 share=share)

    def __call__(self, model_id: str, stage: Stage, requests: Sequence[FleetRequest], share: float) -> None:
        self.submit(model_id, stage, requests, share).result()

    def release(self, request: FleetRequest) -> None:
        """Free the KV slot of a request that will not reach its action stage (dropped after its VLM stage)."""
        with self._lock:
            if request.slot is not None:
                self.models[request.model_id].pool.free(request.slot)
                request.slot = None

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()

    # ---- the two stages (run on the stage workers) ----------------------------------------------------------

    def _prefill(self, served: ServedModel, requests: list[FleetRequest]) -> None:
        bucket = bucket_for(len(requests), self.max_batch)
        if len(requests) > bucket:
            raise ValueError(f"batch of {len(requests)} exceeds max_batch {self.max_batch}")
        placeholders = []
        with self._lock:
            for request in requests:
                if request.slot is None:
                    slot = served.pool.allocate(request.robot_id)
                    if slot is None:
                        raise RuntimeError(f"KV pool of {served.spec.model_id} is full")
                    request.slot = slot
                    if request.inputs is None:
                        placeholders.append(request)
        try:
            pad = bucket - len(requests)
            inputs = [r.inputs if r.inputs is not None else served.stock_frame for r in requests]
            batch = concat_inputs(inputs + [served.stock_frame] * pad).to(served.device, served.model.dtype)
            slots = [r.slot for r in requests] + served.pad_slots[Stage.VLM][:pad]
            served.model.prefill(batch, served.pool.cache, torch.tensor(slots))
        finally:
            for request in placeholders:  # profiling: nothing will read these slots
                self.release(request)

    def _denoise(self, served: ServedModel, requests: list[FleetRequest]) -> None:
        bucket = bucket_for(len(requests), self.max_batch)
        cfg = served.config
        real = [r for r in requests if r.inputs is not None]  # placeholders (profiling) run as padding
        if any(r.slot is None for r in real):
            raise RuntimeError("a request reached the action stage without a KV slot")
        pad_slots = served.pad_slots[Stage.ACTION][: bucket - len(real)]
        slots = torch.tensor([r.slot for r in real] + pad_slots)
        noise = torch.randn(bucket, cfg.action_horizon, cfg.action_dim, generator=served.noise)
        actions = served.model.sample_actions(served.pool.cache, slots, noise.to(served.device), self.num_steps)
        actions = actions.cpu()
        for i, request in enumerate(real):
            request.actions = actions[i]
            self.release(request)
