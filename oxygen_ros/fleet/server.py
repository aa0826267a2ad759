"""A fleet server: the engine's runtime serving many robots from several co-located models.

Robots are registered with their model and latency budget (SLO); each frame becomes an action frame of that
robot, due at its camera stamp + the robot's SLO. Frames of robots on the same model are batched (power-of-two
buckets), and narration of every robot decodes in the same batches as everyone else's. How a batch uses the
device is the `design`:

- `monolithic`: the engine's own path: a batch's prefill and denoise in one call on the whole device, models
  taking turns by the queue policy (earliest-SLO-first by default).
- `robion`: the fleet's lockstep (`lockstep.LockstepScheduler`): each lockstep runs one VLM batch and one action
  batch side by side on complementary shares chosen from the profile table with a guard (at least the co-run
  slowdown measured with the table), or back to back when that is predicted faster; a frame's prefix slot waits
  between its two stages.
- `disaggregated`: the static split (`baselines.StaticSplitScheduler`): each stage on a fixed share.

With a stage split the runtime executes the plug-in's stage batches on the engine's stage workers; after a
frame's action stage its slot goes to its narration as after a whole-device call. The profile table is given or
measured at start-up on the served models themselves (`stage_plan.stage_runner`).

Deadlines are the camera's: a frame whose stamp + SLO has already passed when it arrives is never queued, a
queued frame whose deadline passes before it is computed is dropped unserved (in every design), and a chunk
ready after its deadline is not handed on as if it were on time (dropped, unless `publish_late`). All are
counted per robot (`RobotCounts`), with the chunks on time, so a robot's SLO attainment is known at any moment.
The ROS node (`nodes/fleet_node.py`) is a thin layer over this; nothing here knows about ROS.

Which robots and models a server serves (`served_robots`, `models_to_load`) and on which device
(`serving_device`) are plain functions of its parameters and the traffic controller's assignment file.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..engine.runtime import ActionChunk, Runtime, RuntimeConfig, RuntimeStats, Served, TextUpdate
from ..engine.stage_workers import StageWorkers
from ..model.cpu_kernel import apply as apply_cpu_kernel
from ..model.loading import load_model_source, tokenizer_for
from ..model.precision import default_dtype
from ..model.preprocess import Observation
from .baselines import StaticSplitScheduler
from .batching import power_of_two_buckets
from .lockstep import LockstepScheduler
from .model_runner import ModelSpec, check_graph_device, device_partitions, device_shares, use_stage_graphs
from .policies import POLICIES
from .profile_table import ProfileTable, measure_co_run, profile_stages
from .stage_plan import FleetStagePlanner, stage_runner, stage_submitter

DESIGNS = ("monolithic", "robion", "disaggregated")
STAGE_DEVICES = {"robion": LockstepScheduler, "disaggregated": StaticSplitScheduler}


@dataclass(frozen=True)
class ServedRobot:
    robot_id: str
    model_id: str
    slo_s: float


def served_robots(robots: Sequence[str], robot_models: Sequence[str], slo_s: float,
                  assignment: Mapping | None = None, gpu_index: int = 0) -> list[ServedRobot]:
    """The robots one server serves. Without an assignment: `robots` with the parallel `robot_models`, all with
    `slo_s`. With one (the traffic controller's file): exactly the robots it places on `gpu_index`, each with its
    model (`model_of`, else from `robot_models`) and its own SLO (`slo_of`, else `slo_s`)."""
    if len(robots) != len(robot_models):
        raise ValueError("robots and robot_models must have the same length")
    named = {r.strip("/"): m for r, m in zip(robots, robot_models)}
    if assignment is None:
        return [ServedRobot(r, m, slo_s) for r, m in named.items()]
    model_of, slo_of = assignment.get("model_of", {}), assignment.get("slo_of", {})
    mine = [r for r, gpu in assignment["gpu_of"].items() if int(gpu) == gpu_index]
    unknown = [r for r in mine if r not in model_of and r not in named]
    if unknown:
        raise ValueError(f"no model for robots {unknown}: the assignment has no model_of for them and they are "
                         "not in robots/robot_models")
    return [ServedRobot(r, model_of.get(r, named.get(r)), float(slo_of.get(r, slo_s))) for r in mine]


def models_to_load(specs: Sequence[ModelSpec], robots: Sequence[ServedRobot]) -> list[ModelSpec]:
    """Only the models some served robot uses (a GPU of a fleet holds only its robots' models)."""
    if len({s.model_id for s in specs}) != len(specs):
        raise ValueError("model ids must be unique")
    unknown = sorted({r.model_id for r in robots} - {s.model_id for s in specs})
    if unknown:
        raise ValueError(f"robots name models that are not served: {unknown} (served: "
                         f"{sorted(s.model_id for s in specs)})")
    needed = {r.model_id for r in robots}
    return [s for s in specs if s.model_id in needed]


def serving_device(device: str, gpu_index: int, cuda_devices: int | None = None) -> str:
    """The torch device a server runs on: ``cuda`` means the assignment's GPU ``cuda:<gpu_index>``; an explicit
    ``cuda:N`` is kept (e.g. a remapped GPU list); ``cpu`` ignores the index. `cuda_devices` (default: what torch
    sees) bounds the index, so a wrong one is an error at start-up, not a crash at the first frame."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return device
    if gpu_index < 0:
        raise ValueError(f"gpu_index must be >= 0, got {gpu_index}")
    chosen = int(index) if index else gpu_index
    count = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if chosen >= count:
        raise ValueError(f"device cuda:{chosen} does not exist ({count} CUDA devices visible)")
    return f"cuda:{chosen}"


@dataclass
class RobotCounts:
    """One robot's fate of frames so far (all counts since start)."""

    on_time: int = 0  # chunks ready by their deadline (handed on)
    late_on_arrival: int = 0  # stamp + SLO already past when the frame arrived: never queued
    late_done: int = 0  # chunk ready after its deadline: dropped (or handed on marked late with publish_late)
    expired_in_queue: int = 0  # deadline passed while queued: dropped before any compute
    failed: int = 0  # the model raised on the frame

    @property
    def missed(self) -> int:
        return self.late_on_arrival + self.late_done + self.expired_in_queue + self.failed

    @property
    def attainment(self) -> float:
        """Share of this robot's frames answered by their deadline (1.0 before any frame)."""
        total = self.on_time + self.missed
        return self.on_time / total if total else 1.0


class FleetServer:
    def __init__(self, specs: Sequence[ModelSpec], robots: Sequence[ServedRobot], config: RuntimeConfig,
                 tokenizer_of: Callable[[object], object] | None = None, device: str = "cpu",
                 dtype: torch.dtype | None = None,
                 on_chunk: Callable[[ActionChunk], None] | None = None,
                 on_text: Callable[[TextUpdate], None] | None = None, publish_late: bool = False,
                 design: str = "monolithic", profile: ProfileTable | None = None, guard: float = 1.1,
                 cpu_threads: int | None = None, profile_repeats: int = 3, cuda_graphs: bool = False,
                 cpu_kernel: str = "auto"):
        """`tokenizer_of(model)` gives a model's tokenizer (default: the cached stand-in, for random-init models).
        Only the models the robots use are loaded, in `dtype` (default: bfloat16 on CUDA, float32 on a CPU). `on_chunk` gets chunks ready by their deadline, and failed
        ones (`error` set); late ones only with `publish_late` (then `missed` is set). `design`: see the module;
        a stage split plans from `profile` (default: measured now, `profile_repeats` per entry, with the
        slowdown of the two stages side by side) with `guard` or the profile's measured co-run slowdown, whichever
        is larger (`self.guard`), on `cpu_threads` cores of a CPU (default: torch's intra-op threads).
        `cuda_graphs` (a CUDA device only, else ValueError): every model replays CUDA graphs of its action stage
        and decode step per (bucket, stream), so per SM partition in a stage split (`use_stage_graphs`).
        `cpu_kernel` (`model/cpu_kernel.py` CHOICES): every model's decode step through the compiled CPU kernel;
        what each model got is `self.cpu_kernel`."""
        if design not in DESIGNS:
            raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")
        if design != "monolithic" and config.scheduler.queue not in POLICIES:
            raise ValueError(f"design {design} takes queue {' | '.join(POLICIES)}, got {config.scheduler.queue!r}")
        config = replace(config, scheduler=replace(config.scheduler, drop_expired=True))
        if cuda_graphs:
            check_graph_device(device)
        missing = sorted({r.model_id for r in robots} - set(profile.models())) if profile is not None else []
        if missing:
            raise ValueError(f"the profile table has no entries for models {missing}")
        served: dict[str, Served] = {}
        self.cpu_kernel: dict[str, str] = {}
        self.trained_on = {}  # model id -> what its checkpoint says about its action space (None: random weights)
        for spec in models_to_load(specs, robots):
            loaded = load_model_source(spec.source, device, dtype or default_dtype(device), spec.seed)
            self.trained_on[spec.model_id] = loaded.trained_on
            self.cpu_kernel[spec.model_id] = apply_cpu_kernel(loaded.model, cpu_kernel)
            tokenizer = tokenizer_of(loaded.model) if tokenizer_of else tokenizer_for(loaded.model, None)
            if cuda_graphs:
                use_stage_graphs(loaded.model, config.scheduler.max_batch)
            served[spec.model_id] = Served(loaded.model, tokenizer, loaded.norm_stats)
        if not served:
            raise ValueError("no robots to serve")
        self.robots: Mapping[str, ServedRobot] = {r.robot_id: r for r in robots}
        self.counts = {r.robot_id: RobotCounts() for r in robots}
        self._counts_lock = threading.Lock()
        self.publish_late = publish_late
        self._on_chunk = on_chunk or (lambda chunk: None)
        self.design = design
        self.workers: StageWorkers | None = None
        self.partition_mode = "whole device"
        self.lut: ProfileTable | None = None
        self.guard = guard
        if design == "monolithic":
            self.runtime = Runtime(served, config, on_text=on_text, on_chunk=self._chunk_ready)
            return
        partitions, self.partition_mode = device_partitions(torch.device(device))
        self.workers = StageWorkers(device, cpu_threads, partitions, name="fleet")
        planner = FleetStagePlanner()
        self.runtime = Runtime(served, config, on_text=on_text, on_chunk=self._chunk_ready,
                               stages=(planner, self.workers))
        max_batch = config.scheduler.max_batch
        if profile is None:
            buckets = power_of_two_buckets(max_batch)
            profile = profile_stages(stage_runner(self.runtime.runners, self.workers), list(served), buckets,
                                     device_shares(self.workers, partitions), repeats=profile_repeats)
            profile.meta.update(measure_co_run(stage_submitter(self.runtime.runners, self.workers), profile,
                                               buckets, repeats=profile_repeats))
        self.lut = profile
        self.guard = max(guard, profile.meta.get("co_run_slowdown", 1.0))
        planner.device = STAGE_DEVICES[design](profile, policy=config.scheduler.queue, max_batch=max_batch,
                                               guard=self.guard, drop_expired=True,
                                               vlm_room=self.runtime.frame_room)

    @property
    def model_ids(self) -> list[str]:
        return list(self.runtime.served)

    def model_config(self, robot_id: str):
        return self.runtime.served[self.robots[robot_id].model_id].model.config

    def start(self) -> FleetServer:
        self.runtime.start(control_thread=True)
        return self

    def submit(self, robot_id: str, observation: Observation, narrate: bool, stamp_ns: int, age_s: float,
               context=None, noise: torch.Tensor | None = None) -> bool:
        """Queue a robot's frame taken `age_s` ago (any thread); False (counted) when its deadline has already
        passed; raises ValueError when the observation does not fit its model. `noise` [1, horizon, action_dim]:
        the frame's flow-matching noise (default: the runtime's next draw), for a client that asks for a
        repeatable answer."""
        robot = self.robots[robot_id]
        if age_s >= robot.slo_s:
            with self._counts_lock:
                self.counts[robot_id].late_on_arrival += 1
            return False
        arrival = time.perf_counter()  # latency counts preprocessing too
        inputs = self.runtime.prepare(observation, robot.model_id)
        self.runtime.submit(self.runtime.frame(inputs, narrate, model_id=robot.model_id, robot_id=robot_id,
                                               stamp_ns=stamp_ns, age_s=age_s, budget_s=robot.slo_s,
                                               noise=noise, context=context, arrival=arrival))
        return True

    def _chunk_ready(self, chunk: ActionChunk) -> None:
        with self._counts_lock:
            counts = self.counts[chunk.robot_id]
            if chunk.error is not None:
                counts.failed += 1
            elif chunk.expired:
                counts.expired_in_queue += 1
                return
            elif chunk.missed:
                counts.late_done += 1
            else:
                counts.on_time += 1
        if chunk.error is not None or not chunk.missed or self.publish_late:
            self._on_chunk(chunk)

    def robot_counts(self, robot_id: str) -> RobotCounts:
        with self._counts_lock:
            return RobotCounts(**self.counts[robot_id].__dict__)

    def robot_actions(self, chunk: ActionChunk, dims: int) -> np.ndarray:
        return self.runtime.robot_actions(chunk, dims, self.robots[chunk.robot_id].model_id)

    def stats(self, robot_id: str, window_s: float = 5.0) -> RuntimeStats:
        return self.runtime.stats(window_s, robot_id)

    def close(self) -> None:
        self.runtime.close()
        if self.workers is not None:
            self.workers.close()
