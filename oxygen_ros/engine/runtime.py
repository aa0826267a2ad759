"""The one engine loop: a control path, a language worker and the gate between them, for N robots and M models.

- Control path (the caller's thread with `act`, or the runtime's own control thread with `submit` +
  `start(control_thread=True)`): inside the gate, the scheduler plans an action batch, the model runner prefills
  and denoises it and narrating frames hand their slots to new language requests; the chunk is read back outside
  the gate. A robot node is N = 1 and calls `act` from its control timer; a fleet server submits frames of many
  robots and gets chunks through `on_chunk`, from the control thread only.
- Language worker (its own thread): inside the gate, the scheduler plans a decode batch (preempted requests
  resume first); the runner decodes it; finished requests give their slots back. Every text update, partial or
  final (including requests refused or evicted by the control path), leaves through `on_text` from this thread
  only, so a request's final text is always its last update.
- An opaque per-frame `context` travels from the frame to its chunk and to every text update of its request.
- With a stage split (`stages`: a planner and the stage workers) the control thread runs the planner's stage
  batches instead of whole-device calls (`stage_control.StagedControl`); the language path is the same.

With a fixed k (`SchedulerConfig.tokens_per_frame`) the control path owes the worker k decode steps after each
frame that leaves language work; with `adaptive_k` the worker decodes in the slack the cost model predicts before
the next control tick, so the control rate holds however long the text (up to the one step in flight), except for
a floor: the control path still owes `min_steps_per_frame` steps per frame, and the time those steps run past the
next tick's due time is what the arm gave up for the text (`RuntimeStats.floor_steps`, `floor_action_s`).

With `RuntimeConfig.overlap_threads` the decode steps a frame owes run beside its denoising instead of after it:
the prefill keeps every intra-op thread, then the control path denoises on the others while the worker decodes on
`overlap_threads` of them (on a CPU whose denoising is too small to use all its cores, the text then costs the
arm little); the next frame waits only for the owed steps that did not fit.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..model.inputs import ModelInputs
from ..model.preprocess import Observation, prepare_inputs, robot_actions
from .control_gate import ControlGate
from .language import LanguageRequest, start_request
from .model_runner import ModelRunner, PriorityStreams
from .scheduler import (
    ActionFrame,
    ActionPlan,
    LearnedCost,
    Scheduler,
    SchedulerConfig,
    StagePlanner,
    deadline_missed,
)
from .stage_control import StagedControl
from .stage_workers import StageWorkers
from .stats import percentile_ms

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


@dataclass
class ActionChunk:
    frame_id: int
    robot_id: str
    stamp_ns: int
    actions: Tensor  # [horizon, action_dim], model space, on the host
    latency_s: float  # submission -> chunk on the host
    missed: bool  # ready after the frame's deadline
    request_id: int | None  # the language request this frame started
    context: Any = None
    error: BaseException | None = None  # the model failed on this frame (then `actions` is empty)
    expired: bool = False  # dropped unserved: its deadline passed while it was queued (`actions` is empty)


@dataclass
class TextUpdate:
    request_id: int
    frame_id: int
    stamp_ns: int  # the camera frame the text was conditioned on
    text: str
    num_tokens: int
    final: bool
    finish_reason: str | None
    robot_id: str = ""
    context: Any = None
    token_ids: tuple[int, ...] = ()


@dataclass
class RuntimeStats:
    action_rate_hz: float
    action_latency_p50_ms: float
    action_latency_p99_ms: float
    actions: int
    deadline_misses: int
    tokens_per_s: float
    active_requests: int
    requests_dropped: int
    slots_used: int
    slots_total: int
    bytes_used: int
    bytes_total: int
    floor_steps: int = 0  # adaptive k: decode steps the floor ran past the next control tick's due time (all robots)
    floor_action_s: float = 0.0  # and the seconds they ran past it: the action time given up for the text


@dataclass
class _Origin:
    """What a request's text updates carry back to the caller."""

    model_id: str
    robot_id: str
    stamp_ns: int
    context: Any
    streamed: int = 0  # tokens already reported in a partial update


@dataclass
class _Counters:
    latencies: deque = field(default_factory=lambda: deque(maxlen=500))
    action_times: deque = field(default_factory=lambda: deque(maxlen=500))
    token_times: deque = field(default_factory=lambda: deque(maxlen=2000))
    actions: int = 0
    misses: int = 0
    tokens: int = 0  # every generated token, the prefill's first ones included
    requests_dropped: int = 0  # refused, evicted, or preempted past the cap

    def action(self, now: float, latency: float, missed: bool) -> None:
        self.latencies.append(latency)
        self.action_times.append(now)
        self.actions += 1
        self.misses += missed

    def produced(self, now: float, tokens: int) -> None:
        self.tokens += tokens
        self.token_times.append((now, tokens))


class Runtime:
    def __init__(self, served: Mapping[str, Served] | Served, config: RuntimeConfig,
                 on_text: Callable[[TextUpdate], None] | None = None,
                 on_chunk: Callable[[ActionChunk], None] | None = None,
                 stages: tuple[StagePlanner, StageWorkers] | None = None):
        """`stages`: a stage split (a planner deciding which stage batches run on which shares, and the stage
        workers they run on) instead of one prefill + denoise call per batch on the whole device."""
        if isinstance(served, Served):
            served = {DEFAULT_MODEL: served}
        if stages is not None and config.overlap_threads:
            raise ValueError("overlap_threads is for whole-device batches, not a stage split (whose stages already "
                             "share the device)")
        self.served = dict(served)
        self.config = config
        sched = config.scheduler
        frame_slots = config.kept_for_frames
        self.runners = {m: ModelRunner(s.model, config.pool_slots - frame_slots, sched.max_new_tokens,
                                       sched.max_batch, sched.num_steps, frame_slots, stage_split=stages is not None)
                        for m, s in self.served.items()}
        self.stage_planner = stages[0] if stages is not None else None
        self._stages = StagedControl(self, *stages) if stages is not None else None
        self.scheduler = Scheduler(sched, {m: r.language_slots for m, r in self.runners.items()})
        self.gate = ControlGate()
        first = next(iter(self.served.values())).model
        self.streams = PriorityStreams(first.device)  # after the pools: waits for them on a GPU
        self.on_text = on_text or (lambda update: None)
        self.on_chunk = on_chunk or (lambda chunk: None)
        self._noise = torch.Generator().manual_seed(config.seed)
        self._submit_lock = threading.Lock()  # frames arrive from any thread
        # the scheduler's and pools' state, for the moments both threads may run (decode steps beside a denoising)
        self._state = threading.RLock()
        self._origins: dict[int, _Origin] = {}
        self._notes: deque[LanguageRequest] = deque()  # finished on the control path, reported by the worker
        self._counters = _Counters()  # all robots
        self._robot_counters: dict[str, _Counters] = {}
        self._steps_since_frame = 0
        self._floor_steps = 0
        self._floor_s = 0.0
        self._draining = False
        self._control_busy = False  # the control thread is running a batch or handing its chunks on
        self._wake = threading.Event()
        self._frames_ready = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.worker_error: BaseException | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, control_thread: bool = False) -> Runtime:
        # OpenMP gives a new thread the machine's default team size, not the caller's torch.set_num_threads
        # budget: the runtime's threads take the caller's, or two threads would each run a full-size team
        self._intra_op_threads = torch.get_num_threads()
        self._threads.append(threading.Thread(target=self._language_loop, name="oxygen-language", daemon=True))
        if control_thread:
            self._threads.append(threading.Thread(target=self._control_loop, name="oxygen-control", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self.gate.close()
        self._wake.set()
        self._frames_ready.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []

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
              max_new_tokens: int | None = None, context: Any = None, arrival: float | None = None) -> ActionFrame:
        """A frame that arrived at `arrival` (perf_counter; default now, e.g. before preprocessing), `age_s` after
        its camera stamp; its deadline is the stamp + `budget_s` (default: the control period)."""
        now = time.perf_counter() if arrival is None else arrival
        budget = self.config.scheduler.control_period_s if budget_s is None else budget_s
        return ActionFrame(model_id, inputs, narrate, now - age_s + budget, now, robot_id, stamp_ns,
                           max_new_tokens, noise, context)

    def submit(self, frame: ActionFrame) -> ActionFrame:
        config = self.served[frame.model_id].model.config if frame.model_id in self.served else None
        with self._submit_lock:
            if frame.noise is None and config is not None:
                frame.noise = torch.randn(1, config.action_horizon, config.action_dim, generator=self._noise)
            if self.stage_planner is None:
                self.scheduler.add_frame(frame)
            else:
                self.stage_planner.submit(self.scheduler.register(frame))
        self._frames_ready.set()
        return frame

    # ---- control path ---------------------------------------------------------------------------------------------

    def act(self, frame: ActionFrame) -> ActionChunk:
        """Run `frame` on the calling thread (with whatever else is pending); raises if the model failed on it.
        For callers that run the control path themselves, not beside `start(control_thread=True)`, and without a
        stage split (whose chunks leave through `on_chunk`)."""
        if self.stage_planner is not None:
            raise RuntimeError("with a stage split, submit frames and run start(control_thread=True)")
        self.submit(frame)
        while True:
            chunks = self.run_control()
            mine = [c for c in chunks if c.frame_id == frame.frame_id]
            for chunk in chunks:
                if chunk.frame_id != frame.frame_id:
                    self.on_chunk(chunk)
            if mine:
                if mine[0].error is not None:
                    raise mine[0].error
                return mine[0]

    def warm_up(self, inputs: ModelInputs, model_id: str = DEFAULT_MODEL) -> None:
        """Act once on `inputs` and forget it. A process's first frame pays one-time costs (allocations, compiled
        kernels' first calls, CUDA graph captures); a node pays them here, before it may act, not on its first
        real chunk. The frame is in no counter, teaches the cost model nothing and takes no draw from the noise
        stream (so the chunks that follow are those a run without it gives)."""
        config = self.served[model_id].model.config
        noise = torch.zeros(1, config.action_horizon, config.action_dim)
        cost, self.scheduler.cost = self.scheduler.cost, LearnedCost()
        try:
            self.act(self.frame(inputs, False, model_id=model_id, budget_s=math.inf, noise=noise))
        finally:
            self.scheduler.cost = cost
        self._counters, self._robot_counters = _Counters(), {}

    def frame_room(self, model_id: str) -> int:
        """With a stage split: frames of a model that may still start their VLM stage (its frame slots not held
        by frames waiting for their action stage)."""
        return self._stages.frame_room(model_id)

    def frames_pending(self) -> int:
        """Frames queued or between their two stages."""
        if self.stage_planner is None:
            return self.scheduler.frames_pending
        with self._submit_lock:
            return self.stage_planner.pending()

    def run_control(self) -> list[ActionChunk]:
        """One action batch, if any frame is pending: plan, execute, hand over slots; chunks read back outside.
        Frames whose deadline passed in the queue come back first, as expired chunks (`drop_expired`). With a
        stage split the chunks go to `on_chunk` as they come instead (the control thread's way)."""
        if self._stages is not None:
            return self._stages.run()
        with self.gate.control(), self.streams.control():
            with self._submit_lock:
                now = time.perf_counter()
                expired = [self._expired(f, now) for f in self.scheduler.take_expired(now)]
                plan = self.scheduler.plan_actions(now)
            if plan is None:
                return expired
            runner = self.runners[plan.model_id]
            self._displace(plan, runner)
            window = self._overlap_window if self.config.overlap_threads else None
            try:
                out = runner.act([f.inputs for f in plan.frames], [f.noise for f in plan.frames], plan.bucket,
                                 plan.admit, denoise_window=window)
            except Exception as error:  # the frames fail; admission already happened (victims are reported)
                self._wake.set()
                return expired + [self._failed(f, error) for f in plan.frames]
            with self._state:  # a decode step started beside the denoising may still be running
                self.scheduler.cost.observe(plan.model_id, "action", len(plan.frames), out.seconds)
                handed = [self._hand_over(plan, runner, out, i) for i in range(len(plan.frames))]
                if not self.config.overlap_threads:  # with overlap, the frame's steps were owed when it denoised
                    self._owe_for_frame()
        try:
            with self.streams.control():  # on a GPU: wait for the chunks on the control stream, outside the gate
                actions = out.actions.float().cpu()
        finally:
            # only now: on a GPU the denoising may read these slots until its chunk is on the host, and a slot
            # freed earlier could be prefilled by a resume on the language stream meanwhile
            runner.free([slot for _, slot in handed if slot is not None])
        return expired + self._chunks(plan, actions, [request_id for request_id, _ in handed])

    def _owe_for_frame(self) -> None:
        """A frame owes the worker its decode steps (k, or adaptive k's floor) when there is language work."""
        sched = self.config.scheduler
        self._steps_since_frame = 0
        if self.scheduler.has_language_requests():
            self.gate.owe(sched.min_steps_per_frame if sched.adaptive_k else sched.tokens_per_frame)

    @contextmanager
    def _overlap_window(self):
        """A batch's denoising with decode steps beside it: the worker on `overlap_threads` intra-op threads, the
        control path on the rest. The frame owes its steps from here on, so the steps that run beside the
        denoising pay them and the next frame waits only for what is left."""
        self._owe_for_frame()
        control_threads = torch.get_num_threads()
        torch.set_num_threads(max(1, control_threads - self.config.overlap_threads))
        try:
            with self.gate.share():
                self._wake.set()
                yield
        finally:
            torch.set_num_threads(control_threads)

    def _chunks(self, plan: ActionPlan, actions: Tensor, request_ids: list[int | None]) -> list[ActionChunk]:
        now = time.perf_counter()
        chunks = []
        for i, frame in enumerate(plan.frames):
            missed = deadline_missed(now, frame.deadline)
            for counters in self._counting(frame.robot_id):
                counters.action(now, now - frame.arrival, missed)
            chunks.append(ActionChunk(frame.frame_id, frame.robot_id, frame.stamp_ns, actions[i], now - frame.arrival,
                                      missed, request_ids[i], frame.context))
        self._wake.set()
        return chunks

    def _expired(self, frame: ActionFrame, now: float) -> ActionChunk:
        """A frame dropped unserved because its deadline passed in the queue: a deadline miss."""
        for counters in self._counting(frame.robot_id):
            counters.misses += 1
        return ActionChunk(frame.frame_id, frame.robot_id, frame.stamp_ns, torch.empty(0), now - frame.arrival, True,
                           None, frame.context, expired=True)

    def _counting(self, robot_id: str) -> tuple[_Counters, _Counters]:
        return self._counters, self._robot_counters.setdefault(robot_id, _Counters())

    def _dropped(self, request: LanguageRequest) -> None:
        request.finish("evicted", time.perf_counter())
        self._notes.append(request)
        self._counters.requests_dropped += 1
        origin = self._origins.get(request.request_id)
        if origin is not None:
            self._counting(origin.robot_id)[1].requests_dropped += 1

    def _displace(self, plan: ActionPlan, runner: ModelRunner) -> None:
        for item in plan.displaced:
            runner.free([item.request.slot])
            if not item.preempted:
                self._dropped(item.request)
        for request in plan.dropped:
            self._dropped(request)
        for frame in plan.refused:
            refused = LanguageRequest(self.scheduler.new_request_id(), -1, frame.frame_id, frame.stamp_ns, 0, 0,
                                      frame.max_new_tokens, -1)
            self._origins[refused.request_id] = _Origin(frame.model_id, frame.robot_id, frame.stamp_ns, frame.context)
            self._dropped(refused)

    def _hand_over(self, plan: ActionPlan, runner: ModelRunner, out, i: int) -> tuple[int | None, int | None]:
        """Frame i's slot becomes its language request's, or not: (the request's id or None, the slot for the
        caller to free once the frame's chunk is on the host, or None)."""
        frame, slot = plan.frames[i], out.slots[i]
        if not plan.admit[i]:
            return None, slot
        sched = self.config.scheduler
        request_id = self.scheduler.new_request_id()
        eos = -1 if sched.ignore_eos else runner.eos_id
        request = start_request(request_id, slot, frame.frame_id, frame.stamp_ns, runner.model.config.prefix_len,
                                out.num_valid[i], None, frame.max_new_tokens, eos, sched.temperature,
                                sched.seed * 1_000_003 + request_id, first_hidden=out.first_hidden[i])
        self._origins[request_id] = _Origin(frame.model_id, frame.robot_id, frame.stamp_ns, frame.context)
        if request.done:  # a budget of 0: nothing to decode (its first token comes from its first decode step)
            self._notes.append(request)
            return request_id, slot
        runner.hand_over(slot, request)
        self.scheduler.activate(plan.model_id, request, frame.inputs)
        return request_id, None

    def _failed(self, frame: ActionFrame, error: BaseException) -> ActionChunk:
        return ActionChunk(frame.frame_id, frame.robot_id, frame.stamp_ns, torch.empty(0), 0.0, True, None,
                           frame.context, error)

    def _control_loop(self) -> None:
        torch.set_num_threads(self._intra_op_threads)
        while not self._stop.is_set():
            self._frames_ready.wait(timeout=0.05)
            self._frames_ready.clear()
            while self.frames_pending() and not self._stop.is_set():
                self._control_busy = True  # before frames leave the queue: `drain` reads the queue, then this
                try:
                    for chunk in self.run_control():
                        self.on_chunk(chunk)
                finally:
                    self._control_busy = False

    # ---- language path --------------------------------------------------------------------------------------------

    def _language_loop(self) -> None:
        torch.set_num_threads(self._intra_op_threads)
        with self.streams.language():
            try:
                while not self._stop.is_set():
                    self._emit_notes()
                    if not self.scheduler.has_language_requests():
                        self.gate.forgive()
                        self._wake.wait(timeout=0.05)
                        self._wake.clear()
                        continue
                    if not self.gate.acquire_decode():
                        continue
                    steps = 0
                    try:
                        steps = self._decode()
                    finally:
                        self.gate.release_decode(steps)
                    if steps == 0:  # no slack (adaptive) or no steps owed (fixed k): wait for the next frame
                        self._wake.wait(timeout=0.002 if self.config.scheduler.adaptive_k else 0.05)
                        self._wake.clear()
            except BaseException as error:  # surfaced by the owner through worker_error / stats
                self.worker_error = error
                self.gate.close()  # never leave the control path waiting for owed steps
                raise

    def _decode(self) -> int:
        """Plan and run decode steps inside the gate; returns how many ran. The model calls run outside the state
        lock, so a control path that shares its section (`overlap_threads`) runs beside them."""
        if self.config.overlap_threads:  # beside a denoising: the worker's own cores; alone: all of them
            torch.set_num_threads(self.config.overlap_threads if self.gate.sharing else self._intra_op_threads)
        owed = self.gate.owed
        with self._state:
            plan, floor_due = self._plan_decode(owed)
            if plan is None:
                return 0
        runner = self.runners[plan.model_id]
        steps = 0
        while steps < plan.steps:
            started = time.perf_counter()
            produced = runner.decode(plan.requests)
            now = time.perf_counter()
            with self._state:
                self.scheduler.cost.observe(plan.model_id, "decode", len(plan.requests), now - started)
                if floor_due is not None and now > floor_due:
                    self._floor_steps += 1
                    self._floor_s += now - max(started, floor_due)
                steps += 1
                self._counters.produced(now, produced)
                for request in plan.requests:
                    self._counting(self._origins[request.request_id].robot_id)[1].produced(now, 1)
                finished = self.scheduler.retire(plan.model_id)
                runner.free([r.slot for r in finished])
                self._notes.extend(finished)
                plan.requests = [r for r in plan.requests if not r.done]
            if not plan.requests or (self.gate.control_wants_in and owed - steps <= 0):
                break
        self._steps_since_frame += steps
        self._stream_partials(plan.requests)
        return steps

    def _plan_decode(self, owed: int):
        """The next decode plan, `owed` steps being owed (preempted requests it resumes already back in their
        slots), and for adaptive k's floor steps the tick due time past which they cost the arm; (None, None) when
        nothing is to run."""
        sched = self.config.scheduler
        if self._draining:
            slack, max_steps = math.inf, None
        elif owed:
            slack, max_steps = math.inf, owed
        elif sched.adaptive_k:
            slack = self._slack()
            max_steps = sched.tokens_per_frame - self._steps_since_frame if sched.tokens_per_frame else None
        else:
            return None, None  # fixed k: this frame's steps are done; the next frame owes new ones
        plan = self.scheduler.plan_decode(time.perf_counter(), slack, max_steps)
        if plan is None:
            if owed:  # nothing can decode: owing steps would only stall the control path
                self.gate.forgive()
            return None, None
        runner = self.runners[plan.model_id]
        # adaptive k's floor steps cost the arm whatever of them runs past the next tick's due time
        floor_due = self._tick_due() if sched.adaptive_k and owed and not self._draining else None
        for request, inputs in plan.resume:
            runner.resume(request, inputs)
        return plan, floor_due

    def _tick_due(self) -> float:
        """When the control path needs the device next: one period after its last start, less the margin."""
        sched = self.config.scheduler
        last = self.gate.last_control_start
        return (math.inf if last is None else last + sched.control_period_s) - sched.deadline_margin_s

    def _slack(self) -> float:
        """Seconds before the next control tick is due (infinite when the control path is idle or late)."""
        sched = self.config.scheduler
        due = self._tick_due()
        now = time.perf_counter()
        if now >= due + sched.deadline_margin_s + 0.5 * sched.control_period_s:  # late or idle: don't starve text
            return math.inf
        return due - now

    def _emit_notes(self) -> None:
        while self._notes:
            self._emit(self._notes.popleft(), final=True)

    def _stream_partials(self, requests: list[LanguageRequest]) -> None:
        self._emit_notes()
        every = self.config.stream_every
        if every:
            for request in requests:
                origin = self._origins.get(request.request_id)
                if origin is not None and len(request.tokens) - origin.streamed >= every:
                    self._emit(request, final=False)

    def _emit(self, request: LanguageRequest, final: bool) -> None:
        """A text update through `on_text`; a final one forgets the request's origin only once `on_text` returned,
        so `drain` cannot report a request done while its last update is still being delivered."""
        origin = self._origins[request.request_id]
        origin.streamed = len(request.tokens)
        tokenizer = self.served[origin.model_id].tokenizer
        text = tokenizer.decode(request.tokens) if tokenizer is not None else ""
        try:
            self.on_text(TextUpdate(request.request_id, request.frame_id, request.stamp_ns, text,
                                    len(request.tokens), final, request.finish_reason, origin.robot_id,
                                    origin.context, tuple(request.tokens)))
        finally:
            if final:
                self._origins.pop(request.request_id, None)

    # ---- monitoring -----------------------------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> bool:
        """Decode every request to its end and report it, without waiting for more frames (tests, benchmarks);
        False if that took longer than `timeout_s`."""
        deadline = time.perf_counter() + timeout_s
        self._draining = True  # the worker decodes without waiting for frames (and their owed steps)
        try:
            while time.perf_counter() < deadline:
                if not self.frames_pending() and not self._control_busy and not self.scheduler.has_language_requests() \
                        and not self._notes and not self._origins:
                    return True
                self._wake.set()
                time.sleep(0.005)
            return False
        finally:
            self._draining = False

    def wait_owed(self, timeout_s: float) -> bool:
        """Wait until the worker has run the decode steps the last frame left owed (fixed k, or adaptive k's floor),
        as the next frame would; False on timeout. Benchmarks end a measured window here, so every measured frame
        carries its own steps."""
        deadline = time.perf_counter() + timeout_s
        while self.gate.owed and not self.gate.closed and self.worker_error is None:
            if time.perf_counter() >= deadline:
                return False
            self._wake.set()
            time.sleep(0.001)
        return True

    @property
    def tokens_generated(self) -> int:
        return self._counters.tokens

    def stats(self, window_s: float = 5.0, robot_id: str | None = None) -> RuntimeStats:
        """All robots', or one robot's (actions, latencies, misses, tokens, requests); the pools are shared."""
        c = self._counters if robot_id is None else self._robot_counters.get(robot_id, _Counters())
        now = time.perf_counter()
        latencies = list(c.latencies)
        recent_actions = [t for t in c.action_times if now - t <= window_s]
        recent_tokens = sum(n for t, n in list(c.token_times) if now - t <= window_s)
        span = min(window_s, now - recent_actions[0]) if len(recent_actions) > 1 else 0.0
        pools = [r.pool for r in self.runners.values()]
        return RuntimeStats(
            action_rate_hz=(len(recent_actions) - 1) / span if span > 0 else 0.0,
            action_latency_p50_ms=percentile_ms(latencies, 0.5),
            action_latency_p99_ms=percentile_ms(latencies, 0.99),
            actions=c.actions,
            deadline_misses=c.misses,
            tokens_per_s=recent_tokens / window_s,
            active_requests=self.scheduler.language_requests() if robot_id is None else
            sum(o.robot_id == robot_id for o in list(self._origins.values())),
            requests_dropped=c.requests_dropped,
            slots_used=sum(r.slots_in_use for r in self.runners.values()),
            slots_total=sum(r.language_slots + r.frame_slots for r in self.runners.values()),
            bytes_used=sum(r.slots_in_use * p.bytes_per_slot for r, p in zip(self.runners.values(), pools)),
            bytes_total=sum(p.bytes_total for p in pools),
            floor_steps=self._floor_steps,
            floor_action_s=self._floor_s,
        )
