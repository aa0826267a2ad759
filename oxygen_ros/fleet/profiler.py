"""Timing what will serve: the stage latencies of the served models' own runners on their stage workers.

`profile_stages` times any stage runner per (model, stage, bucket, share); `measure_co_run` how much slower a VLM
batch and an action batch are side by side on complementary shares than either alone (what a stage profile cannot
see, and what a lockstep's guard must cover). `profile_runners` does both on the engine's model runners and stage
workers (a stage-split fleet server profiles itself at start-up with it), and `StageProfiler` loads models for it
(`oxygen-ros fleet-profile`, `fleet-bench`).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future

import torch

from ..command_line import progress
from ..engine.frames import power_of_two_buckets
from ..engine.model_runner import ModelRunner
from ..engine.planners import Stage
from ..engine.stage_workers import StageWorkers
from ..model.loading import load_model_source
from ..model.precision import default_dtype
from .device import device_partitions, device_shares
from .lockstep import split_candidates
from .models import ModelSpec, check_graph_device, use_stage_graphs
from .profile_table import ProfileTable, find_inversions

StageRunner = Callable[[str, Stage, int, float], None]
"""``run(model_id, stage, bucket, share) -> None``: one stage of a batch of ``bucket`` frames on ``share`` of the
device, returning when its outputs are ready."""

StageSubmitter = Callable[[str, Stage, int, float], Future]
"""``submit(model_id, stage, bucket, share) -> Future``: the same call started on its stage worker, returning at
once (two stages can then run side by side)."""


def profile_stages(
    run_stage: StageRunner,
    models: Iterable[str],
    buckets: Iterable[int],
    partitions: Iterable[float],
    repeats: int = 5,
    warmup: int = 1,
    stages: Iterable[Stage] = (Stage.VLM, Stage.ACTION),
    clock: Callable[[], float] = time.perf_counter,
) -> ProfileTable:
    """Time ``run_stage`` for every (model, stage, bucket, share) and keep the median of ``repeats`` runs.

    The runner is handed a bucket size, not frames: a stage's cost depends on the batch shape, not on which
    robot sent it. Warm-up calls are discarded (first-call allocation and compilation
    are not part of the steady state the scheduler plans with). Repeats are interleaved: each round times every
    entry once, so a burst of load from other processes on a shared machine spreads over all entries instead of
    spoiling the consecutive repeats of a few."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    table = ProfileTable(
        meta={"source": "measured", "repeats": repeats, "statistic": "median", "interleaved": True}
    )
    stages, buckets, partitions = list(stages), list(buckets), list(partitions)
    keys = [
        (model_id, stage, bucket, share)
        for model_id in models
        for stage in stages
        for bucket in buckets
        for share in partitions
    ]
    for model_id, stage, bucket, share in keys:
        for _ in range(warmup):
            run_stage(model_id, stage, bucket, share)
    samples: dict[tuple, list[float]] = {key: [] for key in keys}
    for _ in progress(range(repeats), desc="profile rounds"):
        for key in keys:
            model_id, stage, bucket, share = key
            start = clock()
            run_stage(model_id, stage, bucket, share)
            samples[key].append(clock() - start)
    spreads = []
    for (model_id, stage, bucket, share), times in samples.items():
        median = max(statistics.median(times), 1e-9)
        table.add(model_id, stage, bucket, share, median)
        if len(times) >= 4:
            q1, _, q3 = statistics.quantiles(times, n=4)
            spreads.append((q3 - q1) / median)
    if spreads:  # noise of the repeats: interquartile range over median, per entry
        table.meta["relative_iqr"] = {"median": statistics.median(spreads), "max": max(spreads)}
    # Every timed call / its entry's median, in the order they ran (round by round): the service-time noise this
    # profile saw, slow spells together, for a simulation to replay (``SimConfig.duration_factors``).
    medians = {key: max(statistics.median(times), 1e-9) for key, times in samples.items()}
    table.meta["noise_factors"] = [
        round(samples[key][r] / medians[key], 4) for r in range(repeats) for key in keys
    ]
    table.meta["inversions"] = find_inversions(table)
    return table


def measure_co_run(
    submit: StageSubmitter, lut: ProfileTable, buckets: Sequence[int], repeats: int = 5
) -> dict[str, float]:
    """How much slower one model's VLM batch and its action batch are side by side on complementary shares (as a
    lockstep runs them) than the slower of the two alone: per (model, split share, bucket) the median over rounds
    of (side-by-side wall time) / max(alone times), each round timing the two alone and then side by side, so
    that the ratio compares times taken under the same load. Returns ``{"co_run_slowdown": median,
    "co_run_max": max}`` over entries (1.0 when nothing splits). A lockstep scheduler whose guard is below the
    slowdown splits the device where running the two stages back to back is faster."""
    def wall(*calls) -> float:
        start = time.perf_counter()
        for future in [submit(*call) for call in calls]:
            future.result()
        return time.perf_counter() - start

    ratios = []
    for model_id in lut.models():
        for share in split_candidates(lut, model_id, model_id):
            for bucket in buckets:
                vlm = (model_id, Stage.VLM, bucket, share)
                action = (model_id, Stage.ACTION, bucket, round(1 - share, 6))
                wall(vlm, action)  # warm-up
                rounds = [wall(vlm, action) / max(wall(vlm), wall(action)) for _ in range(repeats)]
                ratios.append(statistics.median(rounds))
    if not ratios:
        return {"co_run_slowdown": 1.0, "co_run_max": 1.0}
    return {"co_run_slowdown": max(1.0, statistics.median(ratios)), "co_run_max": max(ratios)}


def stage_submitter(runners: Mapping[str, ModelRunner], workers: StageWorkers) -> StageSubmitter:
    """Stage calls on zero-filled rows: the VLM stage prefills a bucket into frame slots and gives them back, the
    action stage denoises a bucket of padding rows (a runner built with `stage_split`)."""

    def submit(model_id: str, stage: Stage, bucket: int, share: float) -> Future:
        runner = runners[model_id]
        if Stage(stage) is Stage.VLM:
            def call():
                runner.free(runner.prefill_stage([None] * bucket, bucket).slots)
        else:
            def call():
                runner.denoise_stage([], [], bucket).cpu()
        return workers.submit(stage, share, call)

    return submit


def stage_runner(runners: Mapping[str, ModelRunner], workers: StageWorkers) -> StageRunner:
    """`stage_submitter`'s call, returning when it is done."""
    submit = stage_submitter(runners, workers)

    def run(model_id: str, stage: Stage, bucket: int, share: float) -> None:
        submit(model_id, stage, bucket, share).result()

    return run


def profile_runners(runners: Mapping[str, ModelRunner], workers: StageWorkers, shares: Sequence[float],
                    max_batch: int, repeats: int = 5, warmup: int = 1) -> ProfileTable:
    """Every runner's stages at every power-of-two bucket up to `max_batch` and every share, with the co-run
    slowdown of the two stages side by side (``meta["co_run_slowdown"]``)."""
    buckets = power_of_two_buckets(max_batch)
    table = profile_stages(stage_runner(runners, workers), list(runners), buckets, shares, repeats, warmup)
    table.meta.update(measure_co_run(stage_submitter(runners, workers), table, buckets, max(3, repeats // 2)))
    return table


class StageProfiler:
    """Models loaded as a stage-split fleet server holds them (an engine runner each, with frame slots for a
    batch), on the stage workers of `device`, ready to be profiled again and again (`fleet-bench --reprofile`).
    `num_steps`: denoising steps (None: the model's); `sm_partitions`: green-context SM partitions where a CUDA
    device has them; `cuda_graphs`: graphs per (model, stage, bucket, partition) on a CUDA device."""

    def __init__(self, specs: Sequence[ModelSpec], device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                 max_batch: int = 8, cpu_threads: int | None = None, num_steps: int | None = None,
                 sm_partitions: bool = True, cuda_graphs: bool = False):
        if len({s.model_id for s in specs}) != len(specs):
            raise ValueError("model ids must be unique")
        self.specs = list(specs)
        self.device = torch.device(device)
        self.dtype = dtype or default_dtype(self.device)
        if cuda_graphs:
            check_graph_device(self.device)
        self.cuda_graphs = cuda_graphs
        self.max_batch = max_batch
        self.num_steps = num_steps
        self.runners: dict[str, ModelRunner] = {}
        for spec in self.specs:
            model = load_model_source(spec.source, self.device, self.dtype, spec.seed).model
            if cuda_graphs:
                use_stage_graphs(model, max_batch)
            self.runners[spec.model_id] = ModelRunner(model, 0, 0, max_batch, num_steps, stage_split=True)
        self.partitions, self.partition_mode = device_partitions(self.device, sm_partitions)
        self.workers = StageWorkers(self.device, cpu_threads, self.partitions, name="profile")
        self.cpu_threads = self.workers.cpu_threads
        if self.device.type == "cuda":  # green-context streams do not wait for the default stream's uploads
            torch.cuda.synchronize(self.device)

    def shares(self) -> list[float]:
        return device_shares(self.workers, self.partitions)

    def profile(self, shares: Sequence[float] | None = None, repeats: int = 5, warmup: int = 1) -> ProfileTable:
        """The measured table, with the co-run slowdown and the setup in ``meta``."""
        shares = list(shares or self.shares())
        load_before = os.getloadavg()[0]
        table = profile_runners(self.runners, self.workers, shares, self.max_batch, repeats, warmup)
        partitioned = self.partitions is not None
        table.meta.update({
            "device": str(self.device),
            "cpu_threads": self.cpu_threads if self.device.type == "cpu" else None,
            "share_meaning": self.partition_mode,
            "sm_counts": {f"{stage.value}@{share}": self.partitions.sm_count(stage, share)
                          for stage in Stage for share in shares} if partitioned else None,
            "torch": torch.__version__,
            "cuda_graphs": self.cuda_graphs,
            "dtype": str(self.dtype).removeprefix("torch."),
            "models": {s.model_id: {"source": s.source, "seed": s.seed} for s in self.specs},
            "num_steps": self.num_steps,
            # other work on the machine while profiling (1-minute load average before and after, and cores)
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "cores": os.cpu_count(),
        })
        return table

    def close(self) -> None:
        self.workers.close()
