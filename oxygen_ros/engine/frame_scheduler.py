"""OxyGen's per-frame schedule: one prefill, the action now, then a few batched decode steps for all narrations.

The action has a hard deadline (the control period) and the text a soft one, so the order inside a frame is fixed:
prefill once -> denoise the action chunk -> admit this frame's language request (handing it the frame's slot, no
copy) -> decode `k` steps over every active request, whichever frame it came from -> free finished slots.
With `adaptive_k` the number of decode steps is whatever fits in the slack left in the control period.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..model.inputs import ModelInputs
from .kv_pool import KVPool
from .language import LanguageRequest, decode_batch, start_request
from .step_cost import StepCostModel

ADMISSION_POLICIES = ("drop_new", "drop_oldest", "preempt")


@dataclass(frozen=True)
class SchedulerConfig:
    num_steps: int = 10  # Euler steps of the action expert
    tokens_per_frame: int = 4  # decode steps per frame (k) when not adaptive; the cap when adaptive
    adaptive_k: bool = False
    control_period_s: float = 0.1
    deadline_margin_s: float = 0.0
    max_new_tokens: int = 64
    admission: str = "drop_oldest"  # what to do with a new language request when the pool is full
    max_preempted: int = 16  # preempt: requests waiting for a slot; past it the oldest is dropped (counted)
    ignore_eos: bool = False  # benchmarks decode exactly max_new_tokens so every setting does the same work
    temperature: float = 0.0  # 0: greedy narration; > 0: sampled, each request from its own seeded stream
    seed: int = 0  # request i samples with its own seed derived from (seed, i): runs are repeatable

    def __post_init__(self):
        if self.admission not in ADMISSION_POLICIES:
            raise ValueError(f"admission must be one of {ADMISSION_POLICIES}, got {self.admission!r}")
        if self.tokens_per_frame < 0 or self.num_steps < 1 or self.max_preempted < 0:
            raise ValueError("tokens_per_frame and max_preempted must be >= 0 and num_steps >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")


@dataclass
class FrameResult:
    frame_id: int
    actions: Tensor  # [horizon, action_dim], normalized space
    action_latency_s: float
    request: LanguageRequest | None  # the request this frame started, if any
    finished: list[LanguageRequest] = field(default_factory=list)  # finished during this frame (any frame's)
    dropped: list[LanguageRequest] = field(default_factory=list)  # evicted or refused during this frame
    tokens_decoded: int = 0
    decode_steps: int = 0


@dataclass
class _Preempted:
    """A request whose slot was taken back; it resumes by recomputing its prefix and replaying its tokens."""

    request: LanguageRequest
    inputs: ModelInputs


class FrameScheduler:
    """Runs frames on one model and one pool; single-threaded (the threaded runtime builds on the same parts)."""

    def __init__(self, model, pool: KVPool, config: SchedulerConfig):
        if pool.max_new_tokens < config.max_new_tokens:
            raise ValueError("the pool's slots have less room than max_new_tokens")
        self.model = model
        self.pool = pool
        self.config = config
        self.active: list[LanguageRequest] = []  # oldest first
        self.preempted: deque[_Preempted] = deque()
        self._inputs: dict[int, ModelInputs] = {}  # request id -> its frame's inputs, kept only for preemption
        self._frame_ids = itertools.count()
        self._request_ids = itertools.count(1)
        self.frames = 0
        self.requests_dropped = 0
        self.step_cost = StepCostModel()  # decode step time vs batch size, for adaptive k and the runtime's gate

    @property
    def eos_id(self) -> int:
        return -1 if self.config.ignore_eos else self.model.config.eos_id

    @property
    def max_active(self) -> int:
        """Language requests may hold every slot but one: the next frame's action must always find a slot."""
        return self.pool.slots_total - 1

    # ---- one frame ----------------------------------------------------------------------------------------------

    def run_frame(self, inputs: ModelInputs, noise: Tensor, narrate: bool, stamp_ns: int = 0,
                  frame_start: float | None = None, max_new_tokens: int | None = None) -> FrameResult:
        """The single-threaded OxyGen frame: the action first, then up to k batched decode steps."""
        start = time.perf_counter() if frame_start is None else frame_start
        result = self.act(inputs, noise, narrate, stamp_ns, start, max_new_tokens)
        result.actions = result.actions.cpu()  # the chunk reaches the host (the robot) before any decode step
        result.action_latency_s = time.perf_counter() - start
        self._decode(start, result)
        return result

    def act(self, inputs: ModelInputs, noise: Tensor, narrate: bool, stamp_ns: int = 0,
            frame_start: float | None = None, max_new_tokens: int | None = None) -> FrameResult:
        """The control path: prefill into a fresh slot, denoise the chunk, then admit or free the slot.

        `max_new_tokens` caps this frame's request below the configured budget (the slot's room). On a GPU the
        returned chunk may still be in flight on the current stream (`action_latency_s` is then the launch time):
        the caller reads it back when it needs it."""
        start = time.perf_counter() if frame_start is None else frame_start
        budget = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        if not 0 <= budget <= self.config.max_new_tokens:
            raise ValueError(f"max_new_tokens must lie in [0, {self.config.max_new_tokens}], got {budget}")
        frame_id = next(self._frame_ids)
        slot = self.pool.allocate(f"frame {frame_id}")
        if slot is None:  # cannot happen while max_active holds; a bug, not a load condition
            raise RuntimeError("no KV slot left for the action path")
        slots = torch.tensor([slot])
        try:
            prefill = self.model.prefill(inputs, self.pool.cache, slots, want_logits=narrate)
            if narrate:  # read back before denoising: on a GPU this waits for the prefill, not for the chunk too
                num_valid, first_logits = int(prefill.num_valid[0]), prefill.logits[0].cpu()
            actions = self.model.sample_actions(self.pool.cache, slots, noise, self.config.num_steps)[0]
        except Exception:
            self.pool.free(slot)
            raise
        result = FrameResult(frame_id, actions, time.perf_counter() - start, None)
        self.frames += 1
        if narrate:
            result.request = self._admit(slot, frame_id, stamp_ns, num_valid, first_logits, inputs, result, budget)
        else:
            self.pool.free(slot)
        self._retire(result)
        return result

    def decode_step(self, result: FrameResult, max_batch: int | None = None) -> bool:
        """One batched decode step over the active requests (preempted ones resume first if room allows).

        All of them, or the `max_batch` oldest (closest to finishing, so their slots come back soonest). Tokens,
        finished and evicted requests are added to `result`; returns False when there was nothing to do.
        """
        self._resume_preempted()
        if not self.active:
            return False
        batch = self.active if max_batch is None else self.active[:max_batch]
        t0 = time.perf_counter()
        result.tokens_decoded += decode_batch(self.model, self.pool.cache, batch)
        result.decode_steps += 1
        self.step_cost.observe(len(batch), time.perf_counter() - t0)
        self._retire(result)
        return True

    @property
    def step_time_s(self) -> float:
        """Expected time of the next full decode step (0 before the first step)."""
        return self.step_cost.predict(len(self.active))

    def _admit(self, slot, frame_id, stamp_ns, num_valid, logits, inputs, result, budget) -> LanguageRequest | None:
        cfg = self.config
        full = len(self.active) >= self.max_active
        if full and (cfg.admission == "drop_new" or self.max_active == 0):
            self.pool.free(slot)
            self.requests_dropped += 1
            refused = LanguageRequest(next(self._request_ids), -1, frame_id, stamp_ns, self.model.config.prefix_len,
                                      num_valid, budget, self.eos_id)
            refused.finish("evicted", time.perf_counter())
            result.dropped.append(refused)
            return None
        while len(self.active) >= self.max_active:
            victim = self.active.pop(0)
            self.pool.free(victim.slot)
            if cfg.admission == "preempt":
                self.preempted.append(_Preempted(victim, self._inputs.pop(victim.request_id)))
                if len(self.preempted) > cfg.max_preempted:  # bounded: the oldest waiting one goes, inputs and all
                    self._evict(self.preempted.popleft().request, result)
            else:
                self._evict(victim, result)
        request_id = next(self._request_ids)
        request = start_request(request_id, slot, frame_id, stamp_ns, self.model.config.prefix_len, num_valid, logits,
                                budget, self.eos_id, cfg.temperature, cfg.seed * 1_000_003 + request_id)
        self.pool.transfer(slot, f"request {request.request_id}")
        self.active.append(request)
        if cfg.admission == "preempt":
            self._inputs[request.request_id] = inputs
        return request

    def _evict(self, request: LanguageRequest, result: FrameResult) -> None:
        request.finish("evicted", time.perf_counter())
        self._inputs.pop(request.request_id, None)
        self.requests_dropped += 1
        result.dropped.append(request)

    def _decode(self, frame_start: float, result: FrameResult) -> None:
        cfg = self.config
        for _ in range(cfg.tokens_per_frame):
            batch = None
            if cfg.adaptive_k:  # only what fits in the slack: fewer steps, and if need be a smaller batch
                left = frame_start + cfg.control_period_s - cfg.deadline_margin_s - time.perf_counter()
                batch = self.step_cost.largest_batch_within(left, len(self.active) + len(self.preempted))
                if batch == 0:
                    break
            if not self.decode_step(result, batch):
                break

    def _retire(self, result: FrameResult) -> None:
        still = []
        for request in self.active:
            if request.done:
                self.pool.free(request.slot)
                self._inputs.pop(request.request_id, None)
                result.finished.append(request)
            else:
                still.append(request)
        self.active = still

    def _resume_preempted(self) -> None:
        """Bring preempted requests back while slots allow: recompute the prefix, replay the generated tokens."""
        while self.preempted and len(self.active) < self.max_active:
            item = self.preempted.popleft()
            request = item.request
            slot = self.pool.allocate(f"request {request.request_id}")
            request.slot = slot
            self.model.prefill(item.inputs, self.pool.cache, torch.tensor([slot]), want_logits=False)
            prefix = self.model.config.prefix_len
            for i, token in enumerate(request.tokens[:-1]):  # the last token is fed by the next decode step
                self.model.decode_step(self.pool.cache, torch.tensor([slot]), torch.tensor([token]),
                                       torch.tensor([prefix + i]), torch.tensor([request.num_valid_prefix + i]))
            self._inputs[request.request_id] = item.inputs
            self.active.append(request)

    # ---- draining -----------------------------------------------------------------------------------------------

    def drain(self) -> list[LanguageRequest]:
        """Decode until every request (preempted ones too) is finished; returns them."""
        result = FrameResult(-1, torch.empty(0), 0.0, None)
        while self.decode_step(result):
            pass
        return result.finished
