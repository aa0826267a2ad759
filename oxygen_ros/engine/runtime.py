"""The threaded OxyGen runtime a robot node uses: `act()` on the control thread, language on a worker thread.

`act()` preprocesses one observation, prefills it into a KV slot, denoises the action chunk and, when asked,
hands that same slot to a new language request; it returns robot-space actions. A worker thread decodes all
active requests in batches whenever the `ControlGate` allows and reports text through a callback. Both threads
share one `FrameScheduler` (its state changes only inside the gate, so they never race). On a GPU the control
path issues on a high-priority CUDA stream and the worker on a low-priority one (`PathStreams`): the gate's
critical section then covers launching the chunk, not waiting for it, so decode steps can run beside the
denoising on the device while the control path reads its chunk back.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..model.preprocess import NormStats, Observation, prepare_inputs, robot_actions
from ..model.tokenizer import Tokenizer
from .control_gate import ControlGate
from .frame_scheduler import FrameResult, FrameScheduler, SchedulerConfig
from .kv_pool import KVPool
from .language import LanguageRequest
from .path_streams import PathStreams


@dataclass(frozen=True)
class RuntimeConfig:
    scheduler: SchedulerConfig = SchedulerConfig()
    pool_slots: int = 8
    stream_every: int = 8  # report partial text every N tokens (0: final text only)
    seed: int = 0  # the flow-matching noise generator


@dataclass
class ActionChunk:
    frame_id: int
    stamp_ns: int
    actions: np.ndarray  # [horizon, robot_action_dim], robot units
    latency_s: float  # act() call -> chunk ready
    request_id: int | None  # the language request this frame started


@dataclass
class TextUpdate:
    request_id: int
    frame_id: int
    stamp_ns: int  # the camera frame the text was conditioned on
    text: str
    num_tokens: int
    final: bool
    finish_reason: str | None


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


class OxygenRuntime:
    def __init__(self, model, tokenizer: Tokenizer, config: RuntimeConfig, robot_action_dim: int,
                 norm_stats: NormStats | None = None, on_text: Callable[[TextUpdate], None] | None = None,
                 trace: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.robot_action_dim = robot_action_dim
        self.norm_stats = norm_stats
        self.on_text = on_text or (lambda update: None)
        sched = config.scheduler
        self.pool = KVPool(model.config, config.pool_slots, sched.max_new_tokens, model.dtype, model.device)
        self.scheduler = FrameScheduler(model, self.pool, sched)
        self.gate = ControlGate(sched.control_period_s, sched.deadline_margin_s, trace=trace)
        self.streams = PathStreams(model.device)
        if self.streams.enabled:  # weights and the zeroed pool are on the device before either path reads them
            torch.cuda.synchronize(model.device)
        self._noise = torch.Generator().manual_seed(config.seed)
        self._latencies: deque[float] = deque(maxlen=500)
        self._action_times: deque[float] = deque(maxlen=500)
        self._token_times: deque[tuple[float, int]] = deque(maxlen=2000)
        self._streamed: dict[int, int] = {}
        self.actions = 0
        self.deadline_misses = 0
        self._worker: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.worker_error: BaseException | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> OxygenRuntime:
        self._worker = threading.Thread(target=self._language_loop, name="oxygen-language", daemon=True)
        self._worker.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self.gate.close()
        self._wake.set()
        if self._worker is not None:
            self._worker.join(timeout=10)
            self._worker = None

    # ---- control path ---------------------------------------------------------------------------------------------

    def act(self, observation: Observation, stamp_ns: int, narrate: bool) -> ActionChunk:
        """Everything the action needs, inside the gate's critical section. Raises ValueError on bad input."""
        cfg = self.model.config
        start = time.perf_counter()
        noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=self._noise)
        with self.gate.control(), self.streams.control():
            inputs = prepare_inputs([observation], cfg, self.tokenizer, self.norm_stats)
            inputs = inputs.to(self.model.device, self.model.dtype)
            result = self.scheduler.act(inputs, noise.to(self.model.device), narrate, stamp_ns, start)
        with self.streams.control():  # on a GPU: wait for this chunk on the control stream, outside the gate
            actions = result.actions.cpu()
        chunk = robot_actions(actions[None], self.robot_action_dim, self.norm_stats)[0]
        latency = time.perf_counter() - start
        self._latencies.append(latency)
        self._action_times.append(time.perf_counter())
        self.actions += 1
        if latency > self.config.scheduler.control_period_s:
            self.deadline_misses += 1
        self._report(result)
        if narrate:
            self._wake.set()
        return ActionChunk(result.frame_id, stamp_ns, chunk, latency,
                           result.request.request_id if result.request else None)

    # ---- language path --------------------------------------------------------------------------------------------

    def _language_loop(self) -> None:
        with self.streams.language():
            self._language_steps()

    def _language_steps(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.scheduler.active and not self.scheduler.preempted:
                    self._wake.wait(timeout=0.05)
                    self._wake.clear()
                    continue
                if not self.gate.acquire_decode(self.scheduler.step_time_s):
                    continue
                started = time.perf_counter()
                result = FrameResult(-1, torch.empty(0), 0.0, None)
                try:
                    self.scheduler.decode_step(result)
                    active = list(self.scheduler.active)
                finally:
                    self.gate.release_decode(started)
                if result.tokens_decoded:
                    self._token_times.append((time.perf_counter(), result.tokens_decoded))
                self._report(result, active)
        except BaseException as error:  # surfaced by the owner through worker_error / stats
            self.worker_error = error
            raise

    def _report(self, result: FrameResult, active: list[LanguageRequest] = ()) -> None:
        for request in result.dropped + result.finished:
            self._emit(request, final=True)
        every = self.config.stream_every
        if every:
            for request in active:
                if len(request.tokens) - self._streamed.get(request.request_id, 0) >= every:
                    self._emit(request, final=False)

    def _emit(self, request: LanguageRequest, final: bool) -> None:
        if final:
            self._streamed.pop(request.request_id, None)
        else:
            self._streamed[request.request_id] = len(request.tokens)
        self.on_text(TextUpdate(request.request_id, request.frame_id, request.stamp_ns,
                                self.tokenizer.decode(request.tokens), len(request.tokens), final,
                                request.finish_reason))

    # ---- monitoring -----------------------------------------------------------------------------------------------

    def stats(self, window_s: float = 5.0) -> RuntimeStats:
        now = time.perf_counter()
        latencies = sorted(self._latencies)
        recent_actions = [t for t in self._action_times if now - t <= window_s]
        recent_tokens = sum(n for t, n in list(self._token_times) if now - t <= window_s)
        span = min(window_s, now - recent_actions[0]) if len(recent_actions) > 1 else 0.0

        def pct(q):
            return 1e3 * latencies[min(len(latencies) - 1, int(round(q * (len(latencies) - 1))))] if latencies else 0.0

        return RuntimeStats(
            action_rate_hz=(len(recent_actions) - 1) / span if span > 0 else 0.0,
            action_latency_p50_ms=pct(0.5),
            action_latency_p99_ms=pct(0.99),
            actions=self.actions,
            deadline_misses=self.deadline_misses,
            tokens_per_s=recent_tokens / window_s,
            active_requests=len(self.scheduler.active) + len(self.scheduler.preempted),
            requests_dropped=self.scheduler.requests_dropped,
            slots_used=self.pool.slots_used,
            slots_total=self.pool.slots_total,
            bytes_used=self.pool.bytes_used,
            bytes_total=self.pool.bytes_total,
        )
