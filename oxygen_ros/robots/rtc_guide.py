"""One robot's real-time chunking (`output.handover: rtc_guided`): the previous chunk and delay each frame brings.

The robot executes each chunk as computed (the hand-over publishes it whole, as `newest_wins` does): guidance inside
the sampler (`model/rtc.py`, `docs/rtc.md`) has already made it continue the chunk before it. For a new frame taken
at stamp s the guide gives the guided sampler `Committed(left_over, delay)`:
- `left_over`: the chunk being executed from the frame's own step on, in the model's action space (its action k for
  the time its own frame's stamp + (k + 1) steps becomes the new chunk's action k - j, j the steps between the two
  frames), cut at the points the robot executes (the published horizon). A profile whose actions are deltas from the
  frame's state (ALOHA's) has those dims re-based onto the new frame's state: the same absolute targets, relative to
  what the model sees now. Velocity and absolute dims carry over as they are;
- `delay`: the robot's next chunk delay estimated (`engine.delay_estimate`) from the measured ones: control steps
  between each frame's stamp and its chunk's arrival (`arrived`).
A frame that cannot be guided is sampled plainly and counted by reason (`counts`): no chunk being executed (the
start, after a hold: `stop`), no delay estimate yet (the first chunks), a chunk that already ended at the frame's
step (`past`), or a request the sampler would refuse (`model.rtc.refusal`: `delay` at or beyond the execution
horizon, `width`, `nonfinite`); those three are bad input the front end logs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from numbers import Integral

import numpy as np
import torch
from torch import Tensor

from ..control.embodiment import Embodiment
from ..control.embodiment_math import DELTA
from ..control.handover import RTC_GUIDED
from ..engine.delay_estimate import DelayEstimate
from ..model.preprocess import normalized_action_offsets
from ..model.rtc import GUIDANCE, Committed, RtcConfig, refusal
from ..rtc_mask import Schedule

NO_CHUNK, NO_ESTIMATE, PAST = "no_chunk", "no_estimate", "past"  # plain for want of a previous chunk or a delay
REFUSED = ("delay", "width", "nonfinite")
_NO_BOUND = 1 << 30  # an execution horizon beyond any chunk  # plain because the request is bad (`model.rtc.refusal`'s kinds)


@dataclass(frozen=True)
class RtcSettings:
    """The front ends' real-time chunking parameters: `execution_horizon` 0 is the chunk's executed length."""

    execution_horizon: int = 0
    schedule: str = Schedule.EXP
    max_guidance_weight: float = 5.0
    method: str = GUIDANCE  # or PREFIX: a checkpoint trained with training-time RTC (`model/rtc.py`)

    def engine_config(self) -> RtcConfig:
        """The settings of a runtime serving models of several horizons (a fleet server): each robot's guide checks
        its requests against its own model's (`config`), and the left-overs it gives end at the executed points, so
        an execution horizon of 0 needs no bound here."""
        return RtcConfig(self.execution_horizon or _NO_BOUND, Schedule(self.schedule), self.max_guidance_weight,
                         self.method)

    def config(self, executed: int) -> RtcConfig:
        """The sampler's settings for chunks of which `executed` points are executed (ValueError if bad)."""
        return RtcConfig(min(self.execution_horizon or executed, executed), Schedule(self.schedule),
                         self.max_guidance_weight, self.method)


@dataclass(frozen=True)
class Plain:
    """Why a frame goes without guidance: one of NO_CHUNK, NO_ESTIMATE, PAST or REFUSED, and in words."""

    kind: str
    detail: str


@dataclass
class _Executing:
    actions: Tensor  # [points executed, action_dim], model space, on the host
    stamp_ns: int
    state: np.ndarray  # its frame's state in the model's space (the embodiment's), unnormalised


class RtcGuide:
    """`request` per frame, `arrived` per chunk that came back, `executing` per chunk the robot now executes,
    `stop` when it holds. Not thread-safe: the caller serializes (a fleet node's port lock)."""

    def __init__(self, config: RtcConfig, step_ns: int, executed: int, horizon: int, action_dim: int,
                 embodiment: Embodiment | None = None, norm_stats=None, estimate: DelayEstimate | None = None):
        if step_ns <= 0 or executed < 1:
            raise ValueError(f"need a positive step and at least one executed point, got {step_ns} ns, {executed}")
        self.config, self.step_ns, self.executed = config, step_ns, executed
        self.horizon, self.action_dim = horizon, action_dim
        self.estimate = estimate or DelayEstimate()
        kinds = embodiment.kinds if embodiment is not None and embodiment.kinds is not None else ()
        self._deltas = [dim for dim, kind in enumerate(kinds) if kind == DELTA]
        self._width = len(kinds)
        self._norm_stats = norm_stats
        self._executing: _Executing | None = None
        self.guided = 0
        self.plain: Counter[str] = Counter()

    def counts(self) -> dict[str, int | str]:
        """What engine_status and /diagnostics report: frames guided, plain ones by reason, the delay."""
        delay = self.estimate.next_delay()
        return {"rtc_guided": self.guided, **{f"rtc_plain_{k}": self.plain[k] for k in (NO_CHUNK, NO_ESTIMATE, PAST,
                                                                                         *REFUSED)},
                "rtc_delay_steps": "none" if delay is None else delay, "rtc_delays_dropped": self.estimate.dropped}

    def request(self, stamp_ns: int, state: np.ndarray) -> Committed | Plain:
        """What a frame taken at `stamp_ns` (its state in the model's space, unnormalised) brings to the sampler:
        the executed chunk from the frame's step on, with the estimated delay."""
        chunk = self._executing
        offset = None if chunk is None else round((stamp_ns - chunk.stamp_ns) / self.step_ns)
        return self.request_at(offset, self.estimate.next_delay(), state)

    def request_at(self, offset, delay, state: np.ndarray) -> Committed | Plain:
        """`request` with the frame's place in the executed chunk (`offset`: its points already past) and the delay
        given (a client that knows both: `serve`); values that are not whole numbers make the frame plain."""
        plain = self._plain(offset, delay, state)
        if isinstance(plain, Plain):
            self.plain[plain.kind] += 1
        else:
            self.guided += 1
        return plain

    def _plain(self, offset, delay, state: np.ndarray) -> Committed | Plain:
        chunk = self._executing
        if chunk is None:
            return Plain(NO_CHUNK, "no chunk is being executed")
        if delay is None:
            return Plain(NO_ESTIMATE, f"{self.estimate.measured} delays measured, the first "
                                      f"{self.estimate.warmup} set aside as warm-up")
        if isinstance(offset, bool) or not isinstance(offset, Integral):
            return Plain(PAST, f"the frame's place in the executed chunk must be a whole number, got "
                               f"{type(offset).__name__}")
        if not 0 <= offset < len(chunk.actions):
            return Plain(PAST, f"the chunk being executed covers {len(chunk.actions)} steps from its frame, this "
                               f"frame is {offset} steps after it")
        left_over = chunk.actions[int(offset):]
        if self._deltas:
            left_over = left_over + torch.from_numpy(self._rebase(chunk.state, state)).to(left_over.dtype)
        committed = Committed(left_over, delay)
        refused = refusal(committed, self.config, self.horizon, self.action_dim)
        if refused is not None:
            return Plain(*refused)
        return committed

    def _rebase(self, before: np.ndarray, now: np.ndarray) -> np.ndarray:
        """What to add to the delta dims of a chunk made from state `before` to aim at the same positions from
        `now` (model action space, padded to the model's width)."""
        raw = np.zeros(self._width)
        raw[self._deltas] = np.asarray(before, np.float64)[self._deltas] - np.asarray(now, np.float64)[self._deltas]
        offsets = np.zeros(self.action_dim)
        offsets[: self._width] = normalized_action_offsets(raw, self._norm_stats)
        return offsets

    def arrived(self, stamp_ns: int, arrival_ns: int) -> None:
        """A chunk of the frame stamped `stamp_ns` arrived at `arrival_ns` (same clock): one measured delay."""
        self.estimate.add((arrival_ns - stamp_ns) / self.step_ns)

    def executing(self, actions: Tensor, stamp_ns: int, state: np.ndarray) -> None:
        """The robot executes this chunk from now on: `actions` [horizon, action_dim] in model space (the runtime's
        chunk), made from the frame stamped `stamp_ns` whose state (model space, unnormalised) was `state`."""
        self._executing = _Executing(actions[: self.executed].detach().float().cpu().clone(), stamp_ns,
                                     np.asarray(state, np.float64).copy())

    def stop(self) -> None:
        """The robot holds: no chunk is being executed, the next frame is sampled plainly."""
        self._executing = None


def rtc_guide(handover: str, settings: RtcSettings, step_ns: int, executed: int, model_config,
              embodiment: Embodiment | None = None, norm_stats=None) -> RtcGuide | None:
    """A robot's guide when its hand-over is `rtc_guided` (None otherwise): `executed` points of each chunk of a
    model with `model_config` are executed, `step_ns` apart."""
    if handover != RTC_GUIDED:
        return None
    executed = min(executed, model_config.action_horizon)
    return RtcGuide(settings.config(executed), step_ns, executed, model_config.action_horizon,
                    model_config.action_dim, embodiment, norm_stats)
