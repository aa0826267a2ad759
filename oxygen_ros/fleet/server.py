"""A fleet server: the engine's runtime serving many robots from several co-located models.

Robots are registered with their model and latency budget (SLO); each frame becomes an action frame of that
robot, due at its camera stamp + the robot's SLO. Frames of robots on the same model are batched (power-of-two
buckets), and narration of every robot decodes in the same batches as everyone else's. How a batch uses the
device is the `design` (`designs.py`): `monolithic` (prefill and denoise in one call on the whole device, the
default), `robion` (the lockstep: a VLM batch and an action batch side by side on shares chosen from the profile
table with a guard of at least the co-run slowdown measured with it) or `disaggregated` (the static split). All
three are planners of the engine's one scheduler, with the same queue policies (earliest-SLO-first by default).

With a stage split the runtime executes the planner's stage batches on the engine's stage workers; after a
frame's action stage its slot goes to its narration as after a whole-device call. The profile table is given or
measured at start-up on the served runners themselves (`profiler.profile_runners`); given, it is also the
monolithic design's cost model (else that design learns its costs as it runs).

Deadlines are the camera's: a frame whose stamp + SLO has already passed when it arrives is never queued, a
queued frame whose deadline passes before it is computed is dropped unserved (in every design), and a chunk
ready after its deadline is not handed on as if it were on time (dropped, unless `publish_late`). All are
counted per robot (`RobotCounts`), with the chunks on time, so a robot's SLO attainment is known at any moment.
The ROS node (`nodes/fleet_node.py`) is a thin layer over this; nothing here knows about ROS.

Which robots a server serves (`served_robots`) is a plain function of its parameters and the traffic
controller's assignment file; which models and on which device: `models.py`, `device.py`. A `dynamic` server (a
replica of the Ray pool, `scaleout/replica.py`) starts with the robots it has, possibly none: `add_robot` loads a robot's
model on its first use, `remove_robot` stops taking its frames while those in flight finish (`in_flight`), and
`unload_idle_models` lets a model go once no robot needs it and none of its frames is left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..engine.frames import ActionFrame
from ..engine.runtime import ActionChunk, Runtime, RuntimeConfig, RuntimeStats, TextUpdate
from ..engine.stage_workers import StageWorkers
from ..model.inputs import ModelInputs
from ..model.precision import default_dtype
from ..model.preprocess import Observation
from ..model.rtc import Committed
from .co_run import DEFAULT_GUARD, planning_guard
from .designs import DEFAULT_DESIGN, DESIGNS, make_planner
from .device import device_partitions, device_shares
from .models import check_graph_device, load_served, models_to_load
from .profile_table import ProfileCost, ProfileTable
from .profiler import profile_runners
from .specs import ModelSpec, ServedRobot


class NotServed(KeyError):
    """A frame of a robot this server does not serve (never assigned here, or removed)."""


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
                 design: str = DEFAULT_DESIGN, profile: ProfileTable | None = None, guard: float = DEFAULT_GUARD,
                 cpu_threads: int | None = None, profile_repeats: int = 3, cuda_graphs: bool = False,
                 cpu_kernel: str = "auto", clock: Callable[[], float] = time.perf_counter, dynamic: bool = False):
        """`tokenizer_of(model)` gives a model's tokenizer (default: the cached stand-in, for random-init models).
        Only the models the robots use are loaded, in `dtype` (default: bfloat16 on CUDA, float32 on a CPU).
        `on_chunk` gets chunks ready by their deadline, and failed ones (`error` set); late ones only with
        `publish_late` (then `missed` is set). `design`: see the module; a stage split plans from `profile`
        (default: measured now, `profile_repeats` per entry, with the slowdown of the two stages side by side) with
        `guard` or the profile's measured co-run slowdown, whichever is larger (`self.guard`), on `cpu_threads`
        cores of a CPU (default: torch's intra-op threads). `cuda_graphs` (a CUDA device only, else ValueError):
        every model replays CUDA graphs of its action stage and decode step per (bucket, stream), so per SM
        partition in a stage split (`models.use_stage_graphs`). `cpu_kernel` (`model/cpu_kernel.py` CHOICES):
        every model's decode step through the compiled CPU kernel; what each model got is `self.cpu_kernel`.
        `clock`: the runtime's (a replay may drive a simulated one). `dynamic`: robots come and go (the module);
        the server may start with none, and a stage split then plans from `profile`, which must be given."""
        if design not in DESIGNS:
            raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")
        config = replace(config, scheduler=replace(config.scheduler, drop_expired=True))
        if cuda_graphs:
            check_graph_device(device)
        missing = sorted({r.model_id for r in robots} - set(profile.models())) if profile is not None else []
        if missing:
            raise ValueError(f"the profile table has no entries for models {missing}")
        if dynamic and design != "monolithic" and profile is None:
            raise ValueError(f"the {design} design with robots that come later plans from a profile table "
                             "(profile_file): there are no models to profile at start-up")
        max_batch = config.scheduler.max_batch
        self.specs = {s.model_id: s for s in specs}
        self.dynamic = dynamic
        dtype = dtype or default_dtype(device)
        self._load = lambda chosen: load_served(chosen, device, dtype, tokenizer_of, cpu_kernel,
                                                max_batch if cuda_graphs else 0)
        loaded = self._load(models_to_load(specs, robots))
        served, self.cpu_kernel = loaded.served, loaded.cpu_kernel
        self.trained_on = loaded.trained_on  # model id -> what its checkpoint says of its action space (None: random)
        if not served and not dynamic:
            raise ValueError("no robots to serve")
        self.robots: dict[str, ServedRobot] = {r.robot_id: r for r in robots}
        self.counts = {r.robot_id: RobotCounts() for r in robots}
        self._model_of = {r.robot_id: r.model_id for r in robots}  # kept while a removed robot's frames finish
        self._in_flight = dict.fromkeys(self.robots, 0)  # frames queued or running, per robot
        self._counts_lock = threading.Lock()
        self.publish_late = publish_late
        self._on_chunk = on_chunk or (lambda chunk: None)
        self.design = design
        self.workers: StageWorkers | None = None
        self.partition_mode = "whole device"
        self.lut = profile
        self.guard = guard
        if design == "monolithic":
            self.runtime = Runtime(served, config, on_text=on_text, on_chunk=self._chunk_ready,
                                   cost=ProfileCost(profile) if profile is not None else None, clock=clock,
                                   device=device)
            return
        partitions, self.partition_mode = device_partitions(torch.device(device))
        self.workers = StageWorkers(device, cpu_threads, partitions, name="fleet")
        self.runtime = Runtime(served, config, on_text=on_text, on_chunk=self._chunk_ready,
                               stage_workers=self.workers, clock=clock, device=device)
        if profile is None:
            profile = profile_runners(self.runtime.runners, self.workers, device_shares(self.workers, partitions),
                                      max_batch, repeats=profile_repeats)
        self.lut = profile
        self.guard = planning_guard(profile, guard)
        self.runtime.use_planner(make_planner(design, config.scheduler, self.runtime.scheduler.cost, profile,
                                              self.guard, vlm_room=self.runtime.frame_room))

    @property
    def model_ids(self) -> list[str]:
        return list(self.runtime.served)

    def model_config(self, robot_id: str):
        return self.runtime.served[self.robots[robot_id].model_id].model.config

    # ---- robots that come and go (a dynamic server) ----------------------------------------------------------------

    def add_robot(self, robot: ServedRobot) -> bool:
        """Serve `robot` from now on, loading its model if no robot uses it yet; True when it was loaded.
        ValueError: a robot already served, or a model that is not among the server's specs (or not in its
        profile table, for a stage split)."""
        if robot.robot_id in self.robots:
            raise ValueError(f"robot {robot.robot_id} is already served")
        loaded = robot.model_id not in self.runtime.served
        if loaded:
            if robot.model_id not in self.specs:
                raise ValueError(f"model {robot.model_id!r} is not served here (models: {sorted(self.specs)})")
            if self.lut is not None and robot.model_id not in self.lut.models():
                raise ValueError(f"the profile table has no entries for model {robot.model_id!r}")
            models = self._load([self.specs[robot.model_id]])
            self.runtime.add_model(robot.model_id, models.served[robot.model_id])
            self.cpu_kernel.update(models.cpu_kernel)
            self.trained_on.update(models.trained_on)
        with self._counts_lock:
            self.robots[robot.robot_id] = robot
            self.counts[robot.robot_id] = RobotCounts()
            self._model_of[robot.robot_id] = robot.model_id
            self._in_flight.setdefault(robot.robot_id, 0)
        return loaded

    def remove_robot(self, robot_id: str) -> None:
        """Take no more frames of `robot_id`; those in flight still finish and reach `on_chunk` (`in_flight`)."""
        with self._counts_lock:
            if self.robots.pop(robot_id, None) is None:
                raise NotServed(robot_id)

    def in_flight(self, robot_id: str) -> int:
        """Frames of `robot_id` queued or running (0 for a robot never seen)."""
        with self._counts_lock:
            return self._in_flight.get(robot_id, 0)

    def forget_robot(self, robot_id: str) -> None:
        """Drop a removed robot's counts once its frames are done."""
        with self._counts_lock:
            if robot_id in self.robots:
                raise ValueError(f"robot {robot_id} is still served")
            for table in (self.counts, self._model_of, self._in_flight):
                table.pop(robot_id, None)

    def unload_idle_models(self) -> list[str]:
        """Let go every loaded model that no served robot uses and that has no frame left in flight (nor a
        narration still decoding); returns those let go."""
        with self._counts_lock:
            used = {r.model_id for r in self.robots.values()}
            busy = {self._model_of[r] for r, n in self._in_flight.items() if n}
        gone = [m for m in list(self.runtime.served) if m not in used | busy and self.runtime.remove_model(m)]
        for model_id in gone:
            self.cpu_kernel.pop(model_id, None)
            self.trained_on.pop(model_id, None)
        return gone

    def start(self) -> FleetServer:
        self.runtime.start(control_thread=True)
        return self

    def submit(self, robot_id: str, observation: Observation, narrate: bool, stamp_ns: int, age_s: float,
               context=None, noise: torch.Tensor | None = None, committed: Committed | None = None) -> bool:
        """Queue a robot's frame taken `age_s` ago (any thread); False (counted) when its deadline has already
        passed; raises ValueError when the observation does not fit its model. `noise` [1, horizon, action_dim]:
        the frame's flow-matching noise (default: the runtime's next draw), for a client that asks for a
        repeatable answer. `committed`: the robot's previous chunk and delay, for real-time chunking."""
        arrival = self.runtime.clock()  # latency counts preprocessing too
        robot = self._robot(robot_id)
        inputs = None if age_s >= robot.slo_s else self.runtime.prepare(observation, robot.model_id)
        return self.submit_inputs(robot_id, inputs, narrate, stamp_ns, age_s, context, arrival, noise,
                                  committed) is not None

    def submit_inputs(self, robot_id: str, inputs: ModelInputs | None, narrate: bool, stamp_ns: int, age_s: float,
                      context=None, arrival: float | None = None, noise: torch.Tensor | None = None,
                      committed: Committed | None = None) -> ActionFrame | None:
        """`submit` of an observation already in model space (`arrival`: when it arrived, default now): the queued
        frame, or None (counted) when its deadline has already passed. NotServed: a robot not served here."""
        robot = self._robot(robot_id)
        if age_s >= robot.slo_s:
            with self._counts_lock:
                self.counts[robot_id].late_on_arrival += 1
            return None
        with self._counts_lock:
            self._in_flight[robot_id] += 1
        try:
            return self.runtime.submit(self.runtime.frame(inputs, narrate, model_id=robot.model_id,
                                                          robot_id=robot_id, stamp_ns=stamp_ns, age_s=age_s,
                                                          budget_s=robot.slo_s, noise=noise, context=context,
                                                          arrival=arrival, committed=committed))
        except BaseException:
            with self._counts_lock:
                self._in_flight[robot_id] -= 1
            raise

    def _robot(self, robot_id: str) -> ServedRobot:
        robot = self.robots.get(robot_id)
        if robot is None:
            raise NotServed(robot_id)
        return robot

    def _chunk_ready(self, chunk: ActionChunk) -> None:
        with self._counts_lock:
            self._in_flight[chunk.robot_id] -= 1
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
        return self.runtime.robot_actions(chunk, dims, self._model_of[chunk.robot_id])

    def stats(self, robot_id: str, window_s: float = 5.0) -> RuntimeStats:
        return self.runtime.stats(window_s, robot_id)

    def close(self) -> None:
        self.runtime.close()
        if self.workers is not None:
            self.workers.close()
