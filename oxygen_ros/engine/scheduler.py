"""What runs next: pure policy over action frames and language requests, for one robot or a fleet.

The scheduler never calls a model and never reads a clock (`now` is given). It is the one planner of the package:
a robot's node, a fleet server and the fleet simulator all run it, on the wall clock or a simulated one.

- Frames: `submit` queues a frame with its stage planner (`planners.py`: the monolithic planner by default; the
  fleet's lockstep or static split), `start(now)` hands out the jobs that run next (which frames are batched
  together, on which shares of the device), `finish(job, now)` says one ended, `take_expired()` gives the frames
  dropped because their deadline passed in a queue (`drop_expired`: fleets).
- Admission (`plan_admission`): for each narrating frame of a batch whose action is done, whether its slot becomes
  a language request, and whom that displaces (`drop_new`, `drop_oldest`, `preempt`).
- The decode policy: how many decode steps a frame owes the language worker (`owe_for_frame`: fixed k, or
  adaptive k's floor), and which requests decode for how many steps (`plan_language`: preempted ones resume
  first; with adaptive k only what the cost model says fits before the next control tick).

The model runner executes the plans and the runtime loops (`runtime.py`).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .cost_models import CostModel, LearnedCost
from .frames import ActionFrame
from .planners import MonolithicPlanner, StageJob, StagePlanner
from .queues import QUEUE_POLICIES

if TYPE_CHECKING:  # a request's type only: the plans name requests, and the scheduler and what simulates with it
    # (the fleet simulator, `fleet-assign`) run without torch, which the requests' tensors need
    from .language import LanguageRequest

ADMISSION_POLICIES = ("drop_new", "drop_oldest", "preempt")


@dataclass(frozen=True)
class SchedulerConfig:
    num_steps: int | None = None  # Euler steps of the action expert (None: the model's own, as profiled)
    tokens_per_frame: int = 4  # decode steps per frame (k); with adaptive k the cap per control period
    adaptive_k: bool = False  # decode only in the slack before the next control tick
    # adaptive k's floor: decode steps the worker gets after every frame that leaves language work, slack or not,
    # so the text is never starved (0: none); the runtime reports the action time the floor took
    min_steps_per_frame: int = 1
    control_period_s: float = 0.1
    deadline_margin_s: float = 0.0
    max_new_tokens: int = 64
    admission: str = "drop_oldest"  # what a new language request does when its model's slots are all taken
    max_preempted: int = 16  # preempted requests kept for resumption; past it the oldest is dropped (counted)
    queue: str = "fifo"  # which model's frames run first
    max_batch: int = 1  # frames prefilled and denoised together (a power of two)
    ignore_eos: bool = False  # benchmarks decode exactly max_new_tokens so every setting does the same work
    temperature: float = 0.0  # 0: greedy narration; > 0: sampled, each request from its own seeded stream
    seed: int = 0  # request i samples with its own seed derived from (seed, i): runs are repeatable
    drop_expired: bool = False  # a queued frame whose deadline has passed is dropped before compute (fleets)

    def __post_init__(self):
        if self.admission not in ADMISSION_POLICIES:
            raise ValueError(f"admission must be one of {ADMISSION_POLICIES}, got {self.admission!r}")
        if self.queue not in QUEUE_POLICIES:
            raise ValueError(f"queue must be one of {tuple(QUEUE_POLICIES)}, got {self.queue!r}")
        steps = 1 if self.num_steps is None else self.num_steps
        if self.tokens_per_frame < 0 or steps < 1 or self.max_preempted < 0 or self.min_steps_per_frame < 0:
            raise ValueError("tokens_per_frame, min_steps_per_frame and max_preempted must be >= 0, num_steps >= 1")
        if self.max_batch < 1 or self.max_batch & (self.max_batch - 1):
            raise ValueError(f"max_batch must be a power of two >= 1, got {self.max_batch}")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")


def node_decode_policy(tokens_per_frame: int, min_steps_per_frame: int, max_new_tokens: int) -> dict[str, Any]:
    """The nodes' two decode parameters as `SchedulerConfig` fields. `tokens_per_frame` 0 is adaptive k: the text
    decodes in the slack before the next tick (at most one narration's budget of steps per period), so the control
    rate holds however long the text, less the `min_steps_per_frame` steps every frame still owes it. N > 0 is a
    fixed k: N decode steps after every frame that leaves narration work, which the next tick waits for (the text
    advances the same number of tokens per frame on any machine, the arm pays for it)."""
    if tokens_per_frame < 0 or min_steps_per_frame < 0:
        raise ValueError("tokens_per_frame and min_steps_per_frame must be >= 0")
    if tokens_per_frame:
        return {"adaptive_k": False, "tokens_per_frame": tokens_per_frame, "min_steps_per_frame": 0}
    return {"adaptive_k": True, "tokens_per_frame": max_new_tokens, "min_steps_per_frame": min_steps_per_frame}


# ---- plans ----------------------------------------------------------------------------------------------------


@dataclass
class Displaced:
    """A request whose slot a new one takes: `preempted` ones wait to resume, the others are finished."""

    request: LanguageRequest
    preempted: bool


@dataclass
class AdmissionPlan:
    """A batch's narrating frames: whose slot becomes a language request, and what that costs others."""

    model_id: str
    frames: list[ActionFrame]
    bucket: int  # rows the runner computes: the frames, then zero-filled padding
    admit: list[bool]  # per frame: does its slot become a language request
    displaced: list[Displaced] = field(default_factory=list)  # slots to give back
    refused: list[ActionFrame] = field(default_factory=list)  # narrating frames whose request is dropped
    dropped: list[LanguageRequest] = field(default_factory=list)  # preempted requests pushed past the cap


@dataclass
class DecodePlan:
    model_id: str
    requests: list[LanguageRequest]  # oldest first; all of them decode each step
    steps: int
    resume: list[tuple[LanguageRequest, Any]] = field(default_factory=list)  # (request, its frame's inputs)
    # adaptive k's floor steps: the control tick's due time past which they cost the arm (None: not floor steps)
    floor_due: float | None = None


@dataclass
class _ModelState:
    capacity: int  # language requests this model's pool holds at once
    active: list[LanguageRequest] = field(default_factory=list)  # oldest first
    preempted: deque = field(default_factory=deque)  # (request, inputs), oldest first
    inputs: dict[int, Any] = field(default_factory=dict)  # request id -> frame inputs (for preemption only)



class Scheduler:
    """Policy for M models; `capacity[model]` is how many language requests that model's KV pool holds.
    `planner`: how frames use the device (default: the monolithic planner with this scheduler's cost model)."""

    def __init__(self, config: SchedulerConfig, capacity: dict[str, int], cost: CostModel | None = None,
                 planner: StagePlanner | None = None):
        self.config = config
        self.cost = cost if cost is not None else LearnedCost()
        self.planner: StagePlanner = planner if planner is not None else MonolithicPlanner(config.queue, config.max_batch, config.drop_expired, self.cost)
        self.models = {m: _ModelState(c) for m, c in capacity.items()}
        self.log: list[StageJob] | None = None  # a list here keeps every finished job (benchmarks, replays)
        self._frame_ids = itertools.count()
        self._request_ids = itertools.count(1)
        self._decode_turn = itertools.count()
        self._steps_since_frame = 0
        self.requests_dropped = 0
        self.requests_preempted = 0
        self.requests_resumed = 0

    def add_model(self, model_id: str, capacity: int) -> None:
        """Serve one more model from now on; `capacity`: the language requests its pool holds."""
        if model_id in self.models:
            raise ValueError(f"model {model_id!r} is already served")
        self.models[model_id] = _ModelState(capacity)

    def remove_model(self, model_id: str) -> bool:
        """Stop serving a model; False (nothing changed) while it still has language requests. Its frames are
        the caller's to have drained first (the planner's queues do not say whose frames they hold)."""
        state = self.models[model_id]
        if state.active or state.preempted:
            return False
        del self.models[model_id]
        return True

    # ---- action frames ------------------------------------------------------------------------------------------

    def submit(self, frame: ActionFrame) -> ActionFrame:
        """Check a frame, give it its id and queue it with the planner (it is planned from its arrival on)."""
        if frame.model_id not in self.models:
            raise KeyError(f"model {frame.model_id!r} is not served here (served: {sorted(self.models)})")
        budget = self.config.max_new_tokens if frame.max_new_tokens is None else frame.max_new_tokens
        if not 0 <= budget <= self.config.max_new_tokens:
            raise ValueError(f"max_new_tokens must lie in [0, {self.config.max_new_tokens}], got {budget}")
        frame.max_new_tokens = budget
        frame.frame_id = next(self._frame_ids)
        self.planner.submit(frame)
        return frame

    def start(self, now: float) -> list[StageJob]:
        """The jobs that start at `now` (frames whose deadline passed in a queue are dropped first)."""
        return self.planner.start(now)

    def finish(self, job: StageJob, now: float) -> list[ActionFrame]:
        """`job` ended at `now`: the frames whose chunk it completed."""
        job.end = now
        if self.log is not None:
            self.log.append(job)
        return self.planner.finish(job, now)

    def take_expired(self) -> list[ActionFrame]:
        """With `drop_expired`: the frames dropped unserved because their deadline passed in a queue."""
        return self.planner.take_expired()

    @property
    def frames_pending(self) -> int:
        return self.planner.pending()

    def plan_admission(self, model_id: str, frames: list[ActionFrame], bucket: int) -> AdmissionPlan:
        """For each narrating frame of a batch, whether its slot becomes a language request and whom that
        displaces (before a whole-device batch runs; when a stage split's action stage is done)."""
        plan = AdmissionPlan(model_id, frames, bucket, [])
        for frame in frames:
            plan.admit.append(self._admit(model_id, frame, plan))
        return plan

    def _admit(self, model_id: str, frame: ActionFrame, plan: AdmissionPlan) -> bool:
        if not frame.narrate:
            return False
        state = self.models[model_id]
        admitted = sum(plan.admit)
        full = len(state.active) + admitted >= state.capacity
        if full and (self.config.admission == "drop_new" or not state.active):
            plan.refused.append(frame)
            self.requests_dropped += 1
            return False
        if full:
            victim = state.active.pop(0)
            inputs = state.inputs.pop(victim.request_id, None)
            preempt = self.config.admission == "preempt"
            plan.displaced.append(Displaced(victim, preempt))
            if preempt:
                self.requests_preempted += 1
                state.preempted.append((victim, inputs))
                while len(state.preempted) > self.config.max_preempted:  # bounded: drop the oldest, counted
                    plan.dropped.append(state.preempted.popleft()[0])
                    self.requests_dropped += 1
            else:
                self.requests_dropped += 1
        return True

    def new_request_id(self) -> int:
        return next(self._request_ids)

    def activate(self, model_id: str, request: LanguageRequest, inputs: Any) -> None:
        """A frame's slot became `request` (after its prefill); `inputs` are kept only while preemption may
        need to recompute the prefix."""
        state = self.models[model_id]
        if not request.done:
            state.active.append(request)
            if self.config.admission == "preempt":
                state.inputs[request.request_id] = inputs

    # ---- the decode policy ------------------------------------------------------------------------------------

    def has_language_requests(self) -> bool:
        return any(s.active or s.preempted for s in self.models.values())

    def language_requests(self) -> int:
        return sum(len(s.active) + len(s.preempted) for s in self.models.values())

    def owe_for_frame(self) -> int | None:
        """A frame's action ran: the decode steps it owes the language worker before the next frame (a fixed k,
        or adaptive k's floor); None without language work (nothing to owe)."""
        self._steps_since_frame = 0
        if not self.has_language_requests():
            return None
        return self.config.min_steps_per_frame if self.config.adaptive_k else self.config.tokens_per_frame

    def decoded(self, steps: int) -> None:
        """The worker ran `steps` decode steps since the last frame (adaptive k caps them per period)."""
        self._steps_since_frame += steps

    def tick_due(self, last_control_start: float | None) -> float:
        """When the control path needs the device next: one period after its last start, less the margin."""
        cfg = self.config
        return (math.inf if last_control_start is None else last_control_start + cfg.control_period_s) \
            - cfg.deadline_margin_s

    def idle_wait_s(self) -> float:
        """How long the language worker waits for a frame when no plan ran: adaptive k looks again soon, since
        slack opens as the clock runs; a fixed k has nothing to do until a frame owes new steps."""
        return 0.002 if self.config.adaptive_k else 0.05

    def plan_language(self, now: float, owed: int, last_control_start: float | None,
                      draining: bool = False) -> DecodePlan | None:
        """The decode policy: what the language worker runs next. Owed steps run whatever the slack; with a fixed
        k nothing else does; with adaptive k requests decode in the slack before the next control tick (infinite
        when the control path is idle or late, so text never starves), at most `tokens_per_frame` steps per
        period. Draining (end of a run) decodes without waiting for frames."""
        cfg = self.config
        if draining:
            slack, max_steps = math.inf, None
        elif owed:
            slack, max_steps = math.inf, owed
        elif cfg.adaptive_k:
            due = self.tick_due(last_control_start)
            late_or_idle = now >= due + cfg.deadline_margin_s + 0.5 * cfg.control_period_s
            slack = math.inf if late_or_idle else due - now
            max_steps = cfg.tokens_per_frame - self._steps_since_frame if cfg.tokens_per_frame else None
        else:
            return None  # fixed k: this frame's steps are done; the next frame owes new ones
        plan = self.plan_decode(now, slack, max_steps)
        if plan is not None and cfg.adaptive_k and owed and not draining:
            plan.floor_due = self.tick_due(last_control_start)
        return plan

    def plan_decode(self, now: float, slack_s: float = math.inf, max_steps: int | None = None) -> DecodePlan | None:
        """The next decode plan: one model's requests (models with requests take turns) for up to `max_steps` steps.

        `slack_s`: seconds left before the control path needs the device (adaptive k: only what fits runs;
        infinite when the control path is idle or the caller owes steps regardless)."""
        models = sorted(m for m, s in self.models.items() if s.active or s.preempted)
        if not models or max_steps == 0:
            return None
        model_id = models[next(self._decode_turn) % len(models)]
        state = self.models[model_id]
        resume = []
        while state.preempted and len(state.active) + len(resume) < state.capacity:
            resume.append(state.preempted.popleft())
        self.requests_resumed += len(resume)
        for request, inputs in resume:
            state.active.append(request)
            if inputs is not None:
                state.inputs[request.request_id] = inputs
        batch = len(state.active)
        if batch == 0:
            return None
        steps = max_steps if max_steps is not None else self.config.tokens_per_frame or 1
        if math.isfinite(slack_s):
            fit = max((b for b in range(1, batch + 1) if self.cost.decode_s(model_id, b) <= slack_s), default=0)
            if fit == 0:
                if resume:  # nothing runs now: put them back where they were
                    self.requests_resumed -= len(resume)
                    for request, inputs in reversed(resume):
                        state.active.remove(request)
                        state.preempted.appendleft((request, inputs))
                return None
            batch = fit
            per_step = self.cost.decode_s(model_id, batch)
            steps = min(steps, max(1, int(slack_s / per_step)) if per_step > 0 else steps)
        return DecodePlan(model_id, state.active[:batch], steps, resume)

    def retire(self, model_id: str) -> list[LanguageRequest]:
        """Finished requests leave the model's active list (the runner frees their slots)."""
        state = self.models[model_id]
        done = [r for r in state.active if r.done]
        state.active = [r for r in state.active if not r.done]
        for request in done:
            state.inputs.pop(request.request_id, None)
        return done
