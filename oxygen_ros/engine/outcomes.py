"""What becomes of frames and language requests: the chunks and text updates the runtime hands out, and the counts.

Both control paths (whole-device batches, `control_path.py`; stage batches, `stage_control.py`) end a batch here:
its narrating frames' slots become language requests or are refused, displaced requests are reported, chunks are
counted against their deadlines (per robot too). The language worker reports text here. Every text update, partial
or final (including requests the control path refused or evicted), is sent from the language worker's thread only,
so a request's final update is always its last; an opaque per-frame `context` travels with the frame to its chunk
and to every text update of its request.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .frames import ActionFrame, deadline_missed
from .language import LanguageRequest, start_request
from .model_runner import ModelRunner, Prefilled
from .scheduler import AdmissionPlan, Scheduler
from .stats import percentile_ms


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


class Outcomes:
    """`tokenizers[model_id]` turns a request's tokens into text (None: no text, token ids only)."""

    def __init__(self, scheduler: Scheduler, runners: Mapping[str, ModelRunner], tokenizers: Mapping[str, Any],
                 on_chunk: Callable[[ActionChunk], None], on_text: Callable[[TextUpdate], None],
                 stream_every: int, clock: Callable[[], float]):
        self.scheduler = scheduler
        self.runners = runners
        self.tokenizers = tokenizers
        self.on_chunk = on_chunk
        self.on_text = on_text
        self.stream_every = stream_every
        self.clock = clock
        self._origins: dict[int, _Origin] = {}
        self._notes: deque[LanguageRequest] = deque()  # finished on the control path, reported by the worker
        self._counters = _Counters()  # all robots
        self._robot_counters: dict[str, _Counters] = {}
        self.floor_steps = 0
        self.floor_s = 0.0

    # ---- the control path's side ----------------------------------------------------------------------------------

    def displace(self, plan: AdmissionPlan, runner: ModelRunner) -> None:
        """Give back the displaced requests' slots and report the dropped and refused ones (evicted)."""
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

    def hand_over(self, plan: AdmissionPlan, runner: ModelRunner, out: Prefilled, i: int
                  ) -> tuple[int | None, int | None]:
        """Frame i's slot becomes its language request's, or not: (the request's id or None, the slot for the
        caller to free once the frame's chunk is on the host, or None)."""
        frame, slot = plan.frames[i], out.slots[i]
        if not plan.admit[i]:
            return None, slot
        sched = self.scheduler.config
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

    def chunks(self, frames: list[ActionFrame], actions: Tensor, request_ids: list[int | None], now: float
               ) -> list[ActionChunk]:
        """The chunks of a batch whose actions are on the host at `now`, counted against their deadlines."""
        chunks = []
        for i, frame in enumerate(frames):
            missed = deadline_missed(now, frame.deadline)
            for counters in self._counting(frame.robot_id):
                counters.action(now, now - frame.arrival, missed)
            chunks.append(ActionChunk(frame.frame_id, frame.robot_id, frame.stamp_ns, actions[i], now - frame.arrival,
                                      missed, request_ids[i], frame.context))
        return chunks

    def expired(self, frame: ActionFrame, now: float) -> ActionChunk:
        """A frame dropped unserved because its deadline passed in the queue: a deadline miss."""
        for counters in self._counting(frame.robot_id):
            counters.misses += 1
        return ActionChunk(frame.frame_id, frame.robot_id, frame.stamp_ns, torch.empty(0), now - frame.arrival, True,
                           None, frame.context, expired=True)

    @staticmethod
    def failed(frame: ActionFrame, error: BaseException) -> ActionChunk:
        """A frame the model failed on: no chunk, so no finish time either (it missed its deadline)."""
        frame.finish = None
        return ActionChunk(frame.frame_id, frame.robot_id, frame.stamp_ns, torch.empty(0), 0.0, True, None,
                           frame.context, error)

    def _counting(self, robot_id: str) -> tuple[_Counters, _Counters]:
        return self._counters, self._robot_counters.setdefault(robot_id, _Counters())

    def _dropped(self, request: LanguageRequest) -> None:
        request.finish("evicted", time.perf_counter())
        self._notes.append(request)
        self._counters.requests_dropped += 1
        origin = self._origins.get(request.request_id)
        if origin is not None:
            self._counting(origin.robot_id)[1].requests_dropped += 1

    # ---- the language worker's side -------------------------------------------------------------------------------

    def produced(self, requests: list[LanguageRequest], tokens: int, now: float) -> None:
        """A decode step over `requests` produced `tokens` tokens."""
        self._counters.produced(now, tokens)
        for request in requests:
            self._counting(self._origins[request.request_id].robot_id)[1].produced(now, 1)

    def finished(self, requests: list[LanguageRequest]) -> None:
        self._notes.extend(requests)

    def floor_step(self, seconds_past_due: float) -> None:
        """An adaptive-k floor step that ran `seconds_past_due` past the control tick's due time."""
        self.floor_steps += 1
        self.floor_s += seconds_past_due

    def emit_finished(self) -> None:
        while self._notes:
            self._emit(self._notes.popleft(), final=True)

    def stream_partials(self, requests: list[LanguageRequest]) -> None:
        self.emit_finished()
        if self.stream_every:
            for request in requests:
                origin = self._origins.get(request.request_id)
                if origin is not None and len(request.tokens) - origin.streamed >= self.stream_every:
                    self._emit(request, final=False)

    def _emit(self, request: LanguageRequest, final: bool) -> None:
        """A text update through `on_text`; a final one forgets the request's origin only once `on_text` returned,
        so `idle` cannot report a request done while its last update is still being delivered."""
        origin = self._origins[request.request_id]
        origin.streamed = len(request.tokens)
        tokenizer = self.tokenizers[origin.model_id]
        text = tokenizer.decode(request.tokens) if tokenizer is not None else ""
        try:
            self.on_text(TextUpdate(request.request_id, request.frame_id, request.stamp_ns, text,
                                    len(request.tokens), final, request.finish_reason, origin.robot_id,
                                    origin.context, tuple(request.tokens)))
        finally:
            if final:
                self._origins.pop(request.request_id, None)

    # ---- monitoring -----------------------------------------------------------------------------------------------

    def forget_counts(self) -> None:
        """Start every count again (after a warm-up frame)."""
        self._counters, self._robot_counters = _Counters(), {}

    @property
    def idle(self) -> bool:
        """Every request reported to its end."""
        return not self._notes and not self._origins

    @property
    def tokens(self) -> int:
        return self._counters.tokens

    def stats(self, window_s: float = 5.0, robot_id: str | None = None) -> RuntimeStats:
        """All robots', or one robot's (actions, latencies, misses, tokens, requests); the pools are shared."""
        c = self._counters if robot_id is None else self._robot_counters.get(robot_id, _Counters())
        now = self.clock()
        latencies = list(c.latencies)
        recent_actions = [t for t in c.action_times if now - t <= window_s]
        recent_tokens = sum(n for t, n in list(c.token_times) if now - t <= window_s)
        span = min(window_s, now - recent_actions[0]) if len(recent_actions) > 1 else 0.0
        runners = list(self.runners.values())
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
            slots_used=sum(r.slots_in_use for r in runners),
            slots_total=sum(r.language_slots + r.frame_slots for r in runners),
            bytes_used=sum(r.slots_in_use * r.pool.bytes_per_slot for r in runners),
            bytes_total=sum(r.pool.bytes_total for r in runners),
            floor_steps=self.floor_steps,
            floor_action_s=self.floor_s,
        )
