"""The one engine loop: it executes the scheduler's plans and owns the threads, for N robots and M models.

- Control path (the caller's thread with `act`, or the runtime's own control thread with `submit` +
  `start(control_thread=True)`): the scheduler's jobs run on the model runners, whole-device batches
  (`control_path.py`) or, with stage workers, stage batches (`stage_control.py`). A robot node is N = 1 and calls
  `act` from its control timer; a fleet server submits frames of many robots and gets chunks through `on_chunk`,
  from the control thread only.
- Language worker (its own thread, `language_worker.py`): decode batches the scheduler's decode policy plans, in
  what the control path leaves (the gate between them, `control_gate.py`). Every text update leaves through
  `on_text` from this thread only.
- What becomes of frames and requests, counted per robot: `outcomes.py`. What the parts share: `parts.py`.

Policy lives in the scheduler (which frames batch together, admission, the decode policy: fixed k, adaptive k and
its floor); the runtime never decides, it runs what was planned. An opaque per-frame `context` travels from the
frame to its chunk and to every text update of its request. `clock` is the scheduler's clock (the wall clock; a
replay may drive a simulated one).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..model.inputs import ModelInputs
from ..model.preprocess import Observation, prepare_inputs, robot_actions
from ..model.rtc import Committed, RtcConfig
from .control_gate import ControlGate
from .control_path import ControlPath
from .cost_models import CostModel, LearnedCost
from .frames import ActionFrame
from .language_worker import LanguageWorker
from .model_runner import ModelRunner, PriorityStreams
from .outcomes import ActionChunk, Outcomes, RuntimeStats, TextUpdate
from .parts import RuntimeParts
from .planners import StagePlanner
from .scheduler import Scheduler, SchedulerConfig
from .stage_control import StagedControl
from .stage_workers import StageWorkers

__all__ = ["ActionChunk", "Runtime", "RuntimeConfig", "RuntimeStats", "Served", "TextUpdate"]

DEFAULT_MODEL = "default"


@dataclass(frozen=True)
class RuntimeConfig:
    scheduler: SchedulerConfig = SchedulerConfig()
    pool_slots: int = 8  # KV slots per model: max_batch for the action path, the rest for language requests
    stream_every: int = 8  # report partial text every N tokens (0: final text only)
    seed: int = 0  # the flow-matching noise generator
    frame_slots: int = 0  # KV slots per model kept for frames (0: max_batch); a stage split holds frames between
    # their two stages and needs more
    overlap_threads: int = 0  # > 0: decode steps run beside each batch's denoising, the language worker on this many
    # intra-op threads and the control path on the rest (CPU; on a GPU the two streams share the device); 0: never
    rtc: RtcConfig | None = None  # real-time chunking's settings, for frames that bring their previous chunk

    def __post_init__(self):
        if self.overlap_threads < 0:
            raise ValueError("overlap_threads must be >= 0")
        if self.pool_slots <= self.kept_for_frames:
            raise ValueError(f"pool_slots must exceed the slots kept for frames ({self.kept_for_frames}): one slot "
                             "per action frame is kept, the rest hold language requests")

    @property
    def kept_for_frames(self) -> int:
        return self.frame_slots or self.scheduler.max_batch


@dataclass
class Served:
    """A model as the runtime serves it: the network, the tokenizer for its prompts and text, its norm stats."""

    model: Any
    tokenizer: Any = None
    norm_stats: Any = None



class Runtime:
    def __init__(self, served: Mapping[str, Served] | Served, config: RuntimeConfig,
                 on_text: Callable[[TextUpdate], None] | None = None,
                 on_chunk: Callable[[ActionChunk], None] | None = None,
                 stage_workers: StageWorkers | None = None, planner: StagePlanner | None = None,
                 cost: CostModel | None = None, clock: Callable[[], float] = time.perf_counter,
                 device: torch.device | str | None = None):
        """`stage_workers`: run stage batches (a stage split: the fleet's lockstep or static split, whose planner
        comes here or through `use_planner`) on these workers instead of one prefill + denoise call per batch on
        the whole device. `planner` and `cost` go to the scheduler (default: the monolithic planner and costs
        learned from this runtime's own batches). `device`: where the models run (default: the first model's); a
        runtime that starts with no model (a fleet node whose robots come later, `add_model`) needs it."""
        if isinstance(served, Served):
            served = {DEFAULT_MODEL: served}
        if stage_workers is not None and config.overlap_threads:
            raise ValueError("overlap_threads is for whole-device batches, not a stage split (whose stages already "
                             "share the device)")
        self.served = dict(served)
        if not self.served and device is None:
            raise ValueError("a runtime without models needs its device")
        self.config = config
        self._stage_split = stage_workers is not None
        sched = config.scheduler
        self.runners = {m: self._runner(s.model) for m, s in self.served.items()}
        self.scheduler = Scheduler(sched, {m: r.language_slots for m, r in self.runners.items()}, cost, planner)
        self.clock = clock
        self.on_chunk = on_chunk or (lambda chunk: None)
        device = device if device is not None else next(iter(self.served.values())).model.device
        outcomes = Outcomes(self.scheduler, self.runners, {m: s.tokenizer for m, s in self.served.items()},
                            self.on_chunk, on_text or (lambda update: None), config.stream_every, clock)
        # the streams after the pools: on a GPU they wait for them
        self.parts = RuntimeParts(self.scheduler, self.runners, ControlGate(clock), PriorityStreams(device),
                                  outcomes, clock)
        self.gate = self.parts.gate
        self.streams = self.parts.streams
        self.outcomes = outcomes
        self.staged = StagedControl(self.parts, stage_workers) if stage_workers is not None else None
        self.control = self.staged or ControlPath(self.parts, config.overlap_threads)
        self.language = LanguageWorker(self.parts, config.overlap_threads)
        self._noise = torch.Generator().manual_seed(config.seed)
        self._control_busy = False  # the control thread is running jobs or handing their chunks on
        self.busy_s = 0.0  # seconds the control thread spent running jobs (a fleet node's measured load)
        self._frames_ready = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _runner(self, model) -> ModelRunner:
        sched, frame_slots = self.config.scheduler, self.config.kept_for_frames
        return ModelRunner(model, self.config.pool_slots - frame_slots, sched.max_new_tokens, sched.max_batch,
                           sched.num_steps, frame_slots, stage_split=self._stage_split, rtc=self.config.rtc)

    def add_model(self, model_id: str, served: Served) -> None:
        """Serve one more model from now on (a fleet node's first robot of a model); its pool is made, and on a GPU
        zero-filled, before the threads see it (their streams do not wait for the fill by themselves)."""
        if model_id in self.served:
            raise ValueError(f"model {model_id!r} is already served")
        runner = self._runner(served.model)
        self.streams.settle()
        with self.parts.frames_lock, self.parts.state_lock:
            self.served[model_id] = served
            self.runners[model_id] = runner
            self.outcomes.tokenizers[model_id] = served.tokenizer
            self.scheduler.add_model(model_id, runner.language_slots)

    def remove_model(self, model_id: str) -> bool:
        """Stop serving a model and let its weights and pool go; False (nothing changed) while it still has
        language requests. The caller makes sure none of its frames is queued or running (a fleet server counts
        them per robot)."""
        with self.parts.frames_lock, self.parts.state_lock:
            if not self.scheduler.remove_model(model_id):
                return False
            del self.runners[model_id], self.served[model_id]
            self.outcomes.tokenizers.pop(model_id, None)
        return True

    def use_planner(self, planner: StagePlanner) -> None:
        """Plan with `planner` from now on (before the first frame: a fleet server profiles its runners first)."""
        if self.scheduler.frames_pending:
            raise RuntimeError("the planner can only change while no frame is queued")
        self.scheduler.planner = planner

    # ---- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, control_thread: bool = False) -> Runtime:
        # OpenMP gives a new thread the machine's default team size, not the caller's torch.set_num_threads
        # budget: the runtime's threads take the caller's, or two threads would each run a full-size team
        threads = torch.get_num_threads()
        self._threads.append(threading.Thread(target=self.language.loop, args=(self._stop, threads),
                                              name="oxygen-language", daemon=True))
        if control_thread:
            self._threads.append(threading.Thread(target=self._control_loop, args=(threads,), name="oxygen-control",
                                                  daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self.gate.close()
        self.parts.wake.set()
        self._frames_ready.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []

    @property
    def worker_error(self) -> BaseException | None:
        """What stopped the language worker, if anything did."""
        return self.language.error

    # ---- frames ---------------------------------------------------------------------------------------------------

    def prepare(self, observation: Observation, model_id: str = DEFAULT_MODEL) -> ModelInputs:
        """A robot observation in model space (a batch of one); raises ValueError on input the model cannot take."""
        served = self.served[model_id]
        return prepare_inputs([observation], served.model.config, served.tokenizer, served.norm_stats)

    def robot_actions(self, chunk: ActionChunk, robot_action_dim: int, model_id: str = DEFAULT_MODEL) -> np.ndarray:
        """A chunk in robot units: the robot's first `robot_action_dim` dims, unnormalized."""
        return robot_actions(chunk.actions[None], robot_action_dim, self.served[model_id].norm_stats)[0]

    def frame(self, inputs: ModelInputs, narrate: bool, *, model_id: str = DEFAULT_MODEL, robot_id: str = "",
              stamp_ns: int = 0, age_s: float = 0.0, budget_s: float | None = None, noise: Tensor | None = None,
              max_new_tokens: int | None = None, context: Any = None, arrival: float | None = None,
              committed: Committed | None = None) -> ActionFrame:
        """A frame that arrived at `arrival` (on `clock`; default now, e.g. before preprocessing), `age_s` after
        its camera stamp; its deadline is the stamp + `budget_s` (default: the control period). `committed`: the
        robot's previous chunk and delay, for real-time chunking (`RuntimeConfig.rtc`; ValueError without it). The
        guided sampler checks it and samples plainly what it cannot use (counted in the runner's
        `rtc_fallbacks`)."""
        if committed is not None and self.config.rtc is None:
            raise ValueError("a frame brings its previous chunk, but this runtime has no real-time chunking settings")
        now = self.clock() if arrival is None else arrival
        budget = self.config.scheduler.control_period_s if budget_s is None else budget_s
        return ActionFrame(model_id, inputs, narrate, now - age_s + budget, now, robot_id, stamp_ns,
                           max_new_tokens, noise, context, committed)

    def submit(self, frame: ActionFrame) -> ActionFrame:
        config = self.served[frame.model_id].model.config if frame.model_id in self.served else None
        with self.parts.frames_lock:
            if frame.noise is None and config is not None:
                frame.noise = torch.randn(1, config.action_horizon, config.action_dim, generator=self._noise)
            self.scheduler.submit(frame)
        self._frames_ready.set()
        return frame

    def frames_pending(self) -> int:
        """Frames queued or between their two stages."""
        with self.parts.frames_lock:
            return self.scheduler.frames_pending

    def frame_room(self, model_id: str) -> int:
        """With stage workers: frames of a model that may still start their VLM stage (its frame slots not held
        by frames waiting for their action stage)."""
        return self.staged.frame_room(model_id)

    # ---- control path ---------------------------------------------------------------------------------------------

    def act(self, frame: ActionFrame) -> ActionChunk:
        """Run `frame` on the calling thread (with whatever else is pending); raises if the model failed on it.
        For callers that run the control path themselves, not beside `start(control_thread=True)`, and without
        stage workers (whose chunks leave through `on_chunk`)."""
        if self.staged is not None:
            raise RuntimeError("with a stage split, submit frames and run start(control_thread=True)")
        self.submit(frame)
        mine: list[ActionChunk] = []

        def emit(chunk: ActionChunk) -> None:
            if chunk.frame_id == frame.frame_id:
                mine.append(chunk)
            else:
                self.on_chunk(chunk)

        while not mine:
            self.run_control(emit)
        if mine[0].error is not None:
            raise mine[0].error
        return mine[0]

    def warm_up(self, inputs: ModelInputs, model_id: str = DEFAULT_MODEL) -> None:
        """Capture the model's CUDA graphs (`ModelRunner.capture_graphs`), then act once on `inputs` and forget it.
        A process's first frame pays one-time costs (allocations, compiled kernels' first calls); a node pays them
        here, before it may act, not on its first
        real chunk. The frame is in no counter, teaches the cost model nothing and takes no draw from the noise
        stream (so the chunks that follow are those a run without it gives)."""
        config = self.served[model_id].model.config
        self.runners[model_id].capture_graphs()  # every CUDA graph now, none mid-run (no-op without graphs)
        noise = torch.zeros(1, config.action_horizon, config.action_dim)
        cost, self.scheduler.cost = self.scheduler.cost, LearnedCost()
        try:
            self.act(self.frame(inputs, False, model_id=model_id, budget_s=math.inf, noise=noise))
        finally:
            self.scheduler.cost = cost
        self.outcomes.forget_counts()

    def run_control(self, emit: Callable[[ActionChunk], None] | None = None) -> bool:
        """Run the scheduler's jobs until none can start, each chunk to `emit` (default `on_chunk`) as it is
        ready: frames whose deadline passed in the queue first, as expired chunks (`drop_expired`); False if
        nothing ran or expired."""
        return self.control.run(emit or self.on_chunk)

    def _control_loop(self, threads: int) -> None:
        torch.set_num_threads(threads)
        while not self._stop.is_set():
            self._frames_ready.wait(timeout=0.05)
            self._frames_ready.clear()
            while self.frames_pending() and not self._stop.is_set():
                self._control_busy = True  # before frames leave the queue: `drain` reads the queue, then this
                started = time.perf_counter()
                try:
                    ran = self.run_control()
                finally:
                    self._control_busy = False
                    self.busy_s += time.perf_counter() - started
                if not ran:  # queued frames that have not arrived yet (a replayed list): wait for a new one
                    break

    # ---- monitoring -----------------------------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> bool:
        """Decode every request to its end and report it, without waiting for more frames (tests, benchmarks);
        False if that took longer than `timeout_s`."""
        deadline = time.perf_counter() + timeout_s
        self.language.draining = True  # the worker decodes without waiting for frames (and their owed steps)
        try:
            while time.perf_counter() < deadline:
                if not self.frames_pending() and not self._control_busy and \
                        not self.scheduler.has_language_requests() and self.outcomes.idle:
                    return True
                self.parts.wake.set()
                time.sleep(0.005)
            return False
        finally:
            self.language.draining = False

    def wait_owed(self, timeout_s: float) -> bool:
        """Wait until the worker has run the decode steps the last frame left owed (fixed k, or adaptive k's floor),
        as the next frame would; False on timeout. Benchmarks end a measured window here, so every measured frame
        carries its own steps."""
        deadline = time.perf_counter() + timeout_s
        while self.gate.owed and not self.gate.closed and self.worker_error is None:
            if time.perf_counter() >= deadline:
                return False
            self.parts.wake.set()
            time.sleep(0.001)
        return True

    @property
    def tokens_generated(self) -> int:
        return self.outcomes.tokens

    def stats(self, window_s: float = 5.0, robot_id: str | None = None) -> RuntimeStats:
        """All robots', or one robot's (actions, latencies, misses, tokens, requests); the pools are shared."""
        return self.outcomes.stats(window_s, robot_id)
