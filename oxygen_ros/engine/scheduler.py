"""What runs next: pure policy over action frames and language requests, for one robot or a fleet.

The scheduler never calls a model. It keeps the queues (pending action frames from 1..N robots, active and
preempted language requests per model, counted against each model's KV capacity) and answers two questions:

- `plan_actions(now)`: which frames are prefilled and denoised together now (one model, a power-of-two bucket),
  and for each of them that narrates whether its slot becomes a language request, and whom that displaces
  (admission plug-ins: `drop_new`, `drop_oldest`, `preempt`);
- `plan_decode(now, ...)`: which requests decode for how many steps (preempted ones resume first when room allows);
  with adaptive k only what the cost model says fits before the next control tick.

Which model's frames go first is a queue plug-in: FIFO (the one-robot case: arrival order), earliest-SLO-first,
round-robin or largest-queue-first (fleets). The model runner executes a plan; the runtime loops.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from .language import LanguageRequest
from .step_cost import StepCostModel

ADMISSION_POLICIES = ("drop_new", "drop_oldest", "preempt")
QUEUE_POLICIES = ("fifo", "esf", "rr", "lqf")


def deadline_missed(ready_s: float, deadline_s: float) -> bool:
    """The one definition of a miss: the chunk became usable after its deadline (same clock for both)."""
    return ready_s > deadline_s + 1e-12


@dataclass(frozen=True)
class SchedulerConfig:
    num_steps: int = 10  # Euler steps of the action expert
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
            raise ValueError(f"queue must be one of {QUEUE_POLICIES}, got {self.queue!r}")
        if self.tokens_per_frame < 0 or self.num_steps < 1 or self.max_preempted < 0 or self.min_steps_per_frame < 0:
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


def bucket_for(count: int, max_batch: int) -> int:
    """Smallest power of two holding `count` items, capped at `max_batch`."""
    if count < 1:
        raise ValueError("a batch needs at least one item")
    bucket = 1
    while bucket < count and bucket < max_batch:
        bucket *= 2
    return bucket


@dataclass(eq=False)
class ActionFrame:
    """One camera frame waiting for its action chunk. `inputs` and `noise` are the runner's business (opaque
    here); `context` is the caller's, handed back with the chunk and the frame's text."""

    model_id: str
    inputs: Any
    narrate: bool
    deadline: float  # seconds on the scheduler's clock
    arrival: float
    robot_id: str = ""
    stamp_ns: int = 0
    max_new_tokens: int | None = None  # None: the configured budget
    noise: Any = None
    context: Any = None
    frame_id: int = -1  # set by the scheduler

    def slack(self, now: float, service_s: float) -> float:
        return self.deadline - now - service_s


class CostModel(Protocol):
    """Predicted seconds of work: the runner's measurements on a robot, a profile table in the simulator."""

    def action_s(self, model_id: str, batch: int) -> float: ...

    def decode_s(self, model_id: str, batch: int) -> float: ...


class LearnedCost:
    """Per model, per kind of work: a fixed + per-item fit of recent observations (`StepCostModel`)."""

    def __init__(self):
        self._fits: dict[tuple[str, str], StepCostModel] = {}

    def _fit(self, model_id: str, kind: str) -> StepCostModel:
        return self._fits.setdefault((model_id, kind), StepCostModel())

    def observe(self, model_id: str, kind: str, batch: int, seconds: float) -> None:
        self._fit(model_id, kind).observe(batch, seconds)

    def action_s(self, model_id: str, batch: int) -> float:
        return self._fit(model_id, "action").predict(batch)

    def decode_s(self, model_id: str, batch: int) -> float:
        return self._fit(model_id, "decode").predict(batch)


# ---- queue plug-ins: which model's pending frames run next ----------------------------------------------------


class QueuePolicy(Protocol):
    def choose(self, queues: dict[str, list[ActionFrame]], now: float, cost: CostModel) -> str: ...


class Fifo:
    """The model of the oldest pending frame (one robot: simply the next frame)."""

    def choose(self, queues, now, cost):
        return min(queues, key=lambda m: (queues[m][0].arrival, m))


class EarliestSloFirst:
    """The model whose most urgent frame has the least slack (deadline - now - predicted service). A frame that
    can no longer make it ranks after every frame that still can: serving it would only make others late too."""

    def choose(self, queues, now, cost):
        def rank(model_id):
            slack = min(f.slack(now, cost.action_s(model_id, 1)) for f in queues[model_id])
            return (slack < 0, slack, model_id)

        return min(queues, key=rank)


class RoundRobin:
    """Models in turn, skipping those with nothing pending: fair in turns, blind to deadlines."""

    def __init__(self):
        self._last: str | None = None

    def choose(self, queues, now, cost):
        models = sorted(queues)
        later = [m for m in models if self._last is None or m > self._last]
        self._last = later[0] if later else models[0]
        return self._last


class LargestQueueFirst:
    """The model with the most pending frames (ties: earliest deadline): biggest batches, ignores urgency."""

    def choose(self, queues, now, cost):
        return min(queues, key=lambda m: (-len(queues[m]), min(f.deadline for f in queues[m]), m))


QUEUES = {"fifo": Fifo, "esf": EarliestSloFirst, "rr": RoundRobin, "lqf": LargestQueueFirst}


# ---- plans ----------------------------------------------------------------------------------------------------


@dataclass
class Displaced:
    """A request whose slot a new one takes: `preempted` ones wait to resume, the others are finished."""

    request: LanguageRequest
    preempted: bool


@dataclass
class ActionPlan:
    model_id: str
    frames: list[ActionFrame]
    bucket: int  # rows the runner computes: the frames, then zero-filled padding
    admit: list[bool]  # per frame: does its slot become a language request
    displaced: list[Displaced] = field(default_factory=list)  # slots to give back before the frames run
    refused: list[ActionFrame] = field(default_factory=list)  # narrating frames whose request is dropped
    dropped: list[LanguageRequest] = field(default_factory=list)  # preempted requests pushed past the cap


@dataclass
class DecodePlan:
    model_id: str
    requests: list[LanguageRequest]  # oldest first; all of them decode each step
    steps: int
    resume: list[tuple[LanguageRequest, Any]] = field(default_factory=list)  # (request, its frame's inputs)


@dataclass
class StageBatch:
    """One stage of a batch of one model's frames on `share` of the device (one of a `StageJob`'s batches)."""

    model_id: str
    stage: str  # "vlm" (prefill into slots) or "action" (denoise from them)
    frames: list[ActionFrame]
    bucket: int
    share: float


@dataclass
class StageJob:
    """What one lane of a stage plug-in runs from start to end: its batches side by side, or one after the other
    (`sequential`).
    `token` is the plug-in's own record, handed back to its `finish`."""

    batches: list[StageBatch]
    sequential: bool = False
    token: Any = None


class StagePlanner(Protocol):
    """A device-scheduling plug-in for a stage split: it queues frames and decides which stage batches run and
    on which shares (the fleet's lockstep or static split); the runtime executes them with its model runners.
    `lanes`: how many jobs it may have running at once (its execution lanes: one for a lockstep, one per stage
    for a static split)."""

    lanes: int

    def submit(self, frame: ActionFrame) -> None: ...

    def pending(self) -> int: ...

    def start(self, now: float) -> list[StageJob]: ...

    def finish(self, job: StageJob, now: float) -> None: ...

    def take_expired(self) -> list[ActionFrame]:
        """Frames dropped from its queues since the last call because their deadline passed."""
        ...


@dataclass
class _ModelState:
    capacity: int  # language requests this model's pool holds at once
    active: list[LanguageRequest] = field(default_factory=list)  # oldest first
    preempted: deque = field(default_factory=deque)  # (request, inputs), oldest first
    inputs: dict[int, Any] = field(default_factory=dict)  # request id -> frame inputs (for preemption only)


class Scheduler:
    """Policy for M models; `capacity[model]` is how many language requests that model's KV pool holds."""

    def __init__(self, config: SchedulerConfig, capacity: dict[str, int], cost: CostModel | None = None):
        self.config = config
        self.cost = cost if cost is not None else LearnedCost()
        self.queue_policy: QueuePolicy = QUEUES[config.queue]()
        self.models = {m: _ModelState(c) for m, c in capacity.items()}
        self.pending: dict[str, list[ActionFrame]] = {m: [] for m in capacity}
        self._frame_ids = itertools.count()
        self._request_ids = itertools.count(1)
        self._decode_turn = itertools.count()
        self.requests_dropped = 0
        self.requests_preempted = 0
        self.requests_resumed = 0

    # ---- action frames ------------------------------------------------------------------------------------------

    def add_frame(self, frame: ActionFrame) -> ActionFrame:
        self.register(frame)
        self.pending[frame.model_id].append(frame)
        return frame

    def register(self, frame: ActionFrame) -> ActionFrame:
        """Check a frame and give it its id (a stage plug-in queues it itself)."""
        if frame.model_id not in self.pending:
            raise KeyError(f"model {frame.model_id!r} is not served here (served: {sorted(self.pending)})")
        budget = self.config.max_new_tokens if frame.max_new_tokens is None else frame.max_new_tokens
        if not 0 <= budget <= self.config.max_new_tokens:
            raise ValueError(f"max_new_tokens must lie in [0, {self.config.max_new_tokens}], got {budget}")
        frame.max_new_tokens = budget
        frame.frame_id = next(self._frame_ids)
        return frame

    def take_expired(self, now: float) -> list[ActionFrame]:
        """With `drop_expired`: the queued frames whose deadline has passed at `now`, removed before any compute
        is spent on them (their chunk could only be late; serving them would make others late too)."""
        if not self.config.drop_expired:
            return []
        expired = []
        for model_id, queue in self.pending.items():
            late = [f for f in queue if deadline_missed(now, f.deadline)]
            if late:
                expired.extend(late)
                self.pending[model_id] = [f for f in queue if not deadline_missed(now, f.deadline)]
        return sorted(expired, key=lambda f: f.frame_id)

    @property
    def frames_pending(self) -> int:
        return sum(len(q) for q in self.pending.values())

    def plan_actions(self, now: float) -> ActionPlan | None:
        queues = {m: q for m, q in self.pending.items() if q}
        if not queues:
            return None
        model_id = self.queue_policy.choose(queues, now, self.cost)
        queue = queues[model_id]
        order = sorted(queue, key=lambda f: f.arrival) if self.config.queue == "fifo" else \
            sorted(queue, key=lambda f: (f.deadline, f.arrival))
        frames = order[: self.config.max_batch]
        taken = set(map(id, frames))
        self.pending[model_id] = [f for f in queue if id(f) not in taken]
        return self.plan_admission(model_id, frames, bucket_for(len(frames), self.config.max_batch))

    def plan_admission(self, model_id: str, frames: list[ActionFrame], bucket: int) -> ActionPlan:
        """For each narrating frame of a batch, whether its slot becomes a language request and whom that
        displaces (a stage split asks when the batch's action stage is done)."""
        plan = ActionPlan(model_id, frames, bucket, [])
        for frame in frames:
            plan.admit.append(self._admit(model_id, frame, plan))
        return plan

    def _admit(self, model_id: str, frame: ActionFrame, plan: ActionPlan) -> bool:
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

    # ---- language ---------------------------------------------------------------------------------------------

    def has_language_requests(self) -> bool:
        return any(s.active or s.preempted for s in self.models.values())

    def language_requests(self) -> int:
        return sum(len(s.active) + len(s.preempted) for s in self.models.values())

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

