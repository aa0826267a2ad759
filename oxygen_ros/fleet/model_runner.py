"""The fleet's stage runner: fleet batches on the engine's model runner, for the fleet's device schedulers.

Each served model id (a preset, a model config JSON, or a LeRobot checkpoint folder, with a seed for random
weights, so "two fine-tuned variants" of one architecture and a second architecture can be co-located) gets its
model (`model.loading`) and an engine `ModelRunner` with the stage split. A batch's VLM stage prefills the
requests' observations into KV slots (`prefill_stage`, padded to the power-of-two bucket); the requests carry
their slot to the action stage (`denoise_stage`), which denoises an action chunk from it and frees the slot.
Both stages run on the engine's stage workers (`engine.stage_workers`: a thread budget per share on a CPU, an SM
partition stream per share on CUDA, `sm_partition`). Green contexts need NVIDIA's ``cuda-bindings`` package and a
driver that has them; without them the runner says why once and falls back to one plain stream per stage (shares
then overlap, not enforced), and ``partition_mode`` records which of the two ran. The co-run slowdown of two
stage workers in one process is measured by ``fleet-profile`` (``co_run_slowdown``), not assumed away.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from oxygen_ros.engine.model_runner import ModelRunner as EngineRunner
from oxygen_ros.engine.model_runner import zero_inputs
from oxygen_ros.engine.scheduler import bucket_for
from oxygen_ros.engine.stage_workers import StageWorkers
from oxygen_ros.fleet.batching import power_of_two_buckets
from oxygen_ros.fleet.requests import FleetRequest, Stage
from oxygen_ros.fleet.sm_partition import SmPartitions
from oxygen_ros.model.config import Pi05Config
from oxygen_ros.model.loading import load_model_source
from oxygen_ros.model.precision import default_dtype


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


class ServedModel:
    """One model on the device: its engine `ModelRunner` (with the stage split) and its pool. The pool holds
    ``max_inflight`` frame slots between stages plus padding slots of each stage, so a padded VLM batch and a
    padded action batch of the same model can run side by side without touching each other's slots."""

    def __init__(self, spec: ModelSpec, device, dtype, max_batch: int, max_inflight: int, num_steps: int,
                 seed: int = 0):
        self.spec = spec
        loaded = load_model_source(spec.source, device, dtype, spec.seed)
        self.model, self.norm_stats = loaded.model, loaded.norm_stats
        self.config: Pi05Config = self.model.config
        self.device = torch.device(device)
        self.runner = EngineRunner(self.model, 0, 0, max_batch, num_steps, frame_slots=max(max_inflight, max_batch),
                                   stage_split=True)
        self.pool = self.runner.pool
        self.stock_frame = zero_inputs(self.config, 1, device, dtype)  # a zero-filled observation (placeholders)
        self.noise = torch.Generator().manual_seed(seed)


class ModelRunner:
    """``runner(model_id, stage, requests, share)``: the ``StageRunner`` of the fleet's device schedulers, over the
    engine's model runner (`engine.model_runner.ModelRunner.prefill_stage` / `denoise_stage`) and stage workers.

    Requests carry ``inputs`` (a ``ModelInputs`` batch of one) from the front end; a request without inputs (a
    profiling placeholder) is a zero-filled row and gives its slot back after its VLM stage (nothing reads it); in
    the action stage it runs as padding. After the action stage each request holds ``actions`` ([horizon,
    action_dim] float32 on the CPU, model space) and no slot."""

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        max_batch: int = 8,
        max_inflight: int = 64,
        cpu_threads: int | None = None,
        num_steps: int | None = None,
        sm_partitions: bool = True,
        cuda_graphs: bool = False,
    ):
        """`dtype`: the models' (default: bfloat16 on CUDA, float32 on a CPU, `precision.default_dtype`).
        `cuda_graphs`: replay CUDA graphs per (model, stage, bucket, partition) (`use_stage_graphs`; a CUDA device
        only)."""
        if len({s.model_id for s in specs}) != len(specs):
            raise ValueError("model ids must be unique")
        self.device = torch.device(device)
        self.dtype = dtype or default_dtype(self.device)
        dtype = self.dtype
        if cuda_graphs:
            check_graph_device(self.device)
        self.cuda_graphs = cuda_graphs
        self.max_batch = max_batch
        self.num_steps = num_steps
        self.models = {
            s.model_id: ServedModel(s, self.device, dtype, max_batch, max_inflight, num_steps, seed=k)
            for k, s in enumerate(specs)
        }
        if cuda_graphs:
            for served in self.models.values():
                use_stage_graphs(served.model, max_batch)
        self.partitions, self.partition_mode = device_partitions(self.device, sm_partitions)
        self.workers = StageWorkers(self.device, cpu_threads, self.partitions, name="fleet")
        self.cpu_threads = self.workers.cpu_threads
        if self.device.type == "cuda":  # green-context streams do not wait for the default stream's uploads
            torch.cuda.synchronize(self.device)
        self._lock = threading.Lock()

    def shares(self) -> list[float]:
        return device_shares(self.workers, self.partitions)

    def sm_count(self, stage: Stage, share: float) -> int | None:
        """SMs a stage gets at ``share`` on a partitioned GPU (None elsewhere)."""
        return self.partitions.sm_count(stage, share) if self.partitions is not None else None

    def submit(self, model_id: str, stage: Stage, requests: Sequence[FleetRequest], share: float) -> Future:
        """Start one stage of one batch on its stage worker; the future resolves when the outputs are ready."""
        if model_id not in self.models:
            raise KeyError(f"model {model_id!r} is not served here (served: {sorted(self.models)})")
        run = self._prefill if Stage(stage) is Stage.VLM else self._denoise
        return self.workers.submit(stage, share, run, self.models[model_id], list(requests))

    def __call__(self, model_id: str, stage: Stage, requests: Sequence[FleetRequest], share: float) -> None:
        self.submit(model_id, stage, requests, share).result()

    def release(self, request: FleetRequest) -> None:
        """Free the KV slot of a request that will not reach its action stage (dropped after its VLM stage)."""
        with self._lock:
            if request.slot is not None:
                self.models[request.model_id].runner.free([request.slot])
                request.slot = None

    def close(self) -> None:
        self.workers.close()

    # ---- the two stages (run on the stage workers) ----------------------------------------------------------

    def _prefill(self, served: ServedModel, requests: list[FleetRequest]) -> None:
        if any(r.slot is not None for r in requests):
            raise RuntimeError("a request entered its VLM stage holding a KV slot")
        bucket = bucket_for(len(requests), self.max_batch)
        if len(requests) > bucket:
            raise ValueError(f"batch of {len(requests)} exceeds max_batch {self.max_batch}")
        done = served.runner.prefill_stage([r.inputs for r in requests], bucket)  # the pool is thread-safe
        for request, slot in zip(requests, done.slots):
            request.slot = slot
        for request in requests:
            if request.inputs is None:  # profiling: nothing will read these slots
                self.release(request)

    def _denoise(self, served: ServedModel, requests: list[FleetRequest]) -> None:
        bucket = bucket_for(len(requests), self.max_batch)
        cfg = served.config
        real = [r for r in requests if r.inputs is not None]  # placeholders (profiling) run as padding
        if any(r.slot is None for r in real):
            raise RuntimeError("a request reached the action stage without a KV slot")
        noises = [torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=served.noise) for _ in real]
        actions = served.runner.denoise_stage([r.slot for r in real], noises, bucket).float().cpu()
        for i, request in enumerate(real):
            request.actions = actions[i]
            self.release(request)


def check_graph_device(device: torch.device | str) -> None:
    """CUDA graphs only on a CUDA device: a clear error elsewhere (a CPU runs every stage eagerly)."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"cuda_graphs needs a CUDA device, not {device}: on a CPU every stage runs eagerly "
                         "(leave cuda_graphs off)")


def use_stage_graphs(model, max_batch: int) -> None:
    """Graphs of a model's action stage (the denoising loop) and decode step per power-of-two bucket up to
    `max_batch` and per stream the call is issued on, so per SM partition of a stage worker: a graph is captured on
    the partition's stream and replayed only there (`model.cuda_graphs.StreamGraphs`). The VLM stage runs
    eagerly. Raises ValueError for a model that is not on a CUDA device."""
    model.use_cuda_graphs(power_of_two_buckets(max_batch), per_stream=True)


def device_partitions(device: torch.device, sm_partitions: bool = True) -> tuple[SmPartitions | None, str]:
    """The SM partitions of a CUDA device (None on a CPU or where green contexts are unavailable, said once) and
    what a share means there."""
    if device.type == "cpu":
        return None, "CPU thread budget"
    if not sm_partitions:
        return None, "plain streams (not enforced)"
    try:
        return SmPartitions(device), "green-context SM partitions"
    except (ImportError, RuntimeError) as error:
        warnings.warn(f"GPU shares are not enforced: SM partitions are unavailable ({error})", stacklevel=2)
        return None, f"plain streams (not enforced: {error})"


def device_shares(workers: StageWorkers, partitions: SmPartitions | None) -> list[float]:
    """The partition choices a device offers: multiples of one core on a CPU; on a GPU the tenths whose SM groups
    the hardware can make (every tenth without partitions)."""
    if workers.device.type == "cpu":
        return workers.cpu_shares()
    if partitions is not None:
        return partitions.shares()
    return [round(0.1 * k, 1) for k in range(1, 11)]
