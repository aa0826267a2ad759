"""Real-time chunking (Black, Galliker, Levine 2025, arXiv 2506.07339): the new chunk inpainted inside the sampler.

While a chunk is being computed the robot keeps executing the previous one, so when the new chunk arrives its first
d actions (d = the delay in control steps) are already committed, and the actions after them should continue the
previous chunk's plan. RTC treats this as inpainting: at every Euler step the expert's velocity is corrected so that
the step's estimate of the finished chunk moves toward the previous chunk's left-over Y, weighted per action by a
prefix mask W (`rtc_mask.py`: 1 over the d committed actions, then decaying to 0 at the end of the left-over's
useful part):

    A1 = x_t - t v(x_t)                         the finished chunk as estimated at time t
    g  = (W * (Y - A1))^T dA1/dx_t              a vector-Jacobian product through the action expert only
    v' = v - min(beta, w(t)) g                  w(t) = (tau^2 + (1 - tau)^2) / (tau (1 - tau)),  tau = 1 - t

Time runs here as in the model's sampler (`Pi05Model.sample_actions`): t = 1 is noise, t = 0 the actions, Euler
steps of dt = -1/steps, and the velocity points from the actions toward the noise. The paper (and its Kinetix code)
runs tau = 1 - t the other way, with the opposite velocity; that is why A1 subtracts t v and the correction is
subtracted. The shared prefix K/V is a constant of the step (read from the cache), so the gradient runs through the
expert alone. `docs/rtc.md` states the equations, the schedules and how they match LeRobot's reading.

Rows of one batch may be guided with different delays and left-overs or not at all (their correction is exactly
zero); one expert pass and one backward pass serve the whole batch. A request that cannot be guided (a delay at or
beyond the execution horizon, a left-over of the wrong width or with non-finite values) is sampled plainly, counted
in `GuidedSampler.fallbacks` and logged: never an exception on the control path.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import torch
from torch import Tensor

from ..rtc_mask import Schedule, prefix_weights
from .expert_inputs import expert_inputs
from .kv_cache import KVCache

logger = logging.getLogger(__name__)


GUIDANCE, PREFIX = "guidance", "prefix"  # how a previous chunk is followed (`RtcConfig.method`)


@dataclass(frozen=True)
class RtcConfig:
    """`execution_horizon`: the action index where the mask reaches 0 (the paper's H - s: the previous chunk's
    left-over beyond it is not guided toward); a delay must be below it. `max_guidance_weight`: beta, the clip of
    the guidance weight (the paper uses 5; LeRobot's default is 10). `method`: `guidance` (the paper's inpainting,
    any checkpoint) or `prefix` (training-time RTC, arXiv 2512.05964: the d committed actions are given as known,
    finished actions, t = 0 in their per-token time condition, and held at the committed values; no backward pass;
    for a checkpoint trained so, `train-tiny --rtc-max-delay`; the schedule and beta do not apply)."""

    execution_horizon: int
    schedule: Schedule = Schedule.EXP
    max_guidance_weight: float = 5.0
    method: str = GUIDANCE

    def __post_init__(self):
        if self.method not in (GUIDANCE, PREFIX):
            raise ValueError(f"method must be {GUIDANCE} or {PREFIX}, got {self.method!r}")
        if self.execution_horizon < 1:
            raise ValueError(f"execution_horizon must be at least 1, got {self.execution_horizon}")
        if not self.max_guidance_weight > 0:
            raise ValueError(f"max_guidance_weight must be positive, got {self.max_guidance_weight}")
        object.__setattr__(self, "schedule", Schedule(self.schedule))


@dataclass
class Committed:
    """One request's previous chunk: `left_over` [L, action_dim], the actions of the previous chunk from the step
    this frame was taken on, in the model's action space (normalized, padded like the chunks the model returns);
    `delay`: how many of them will have run when the new chunk arrives."""

    left_over: Tensor
    delay: int


def guidance_weight(t: float, max_guidance_weight: float) -> float:
    """min(beta, (1 - tau) / (tau r^2)) with r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2) and tau = 1 - t (eq. 4):
    (tau^2 + (1 - tau)^2) / (tau (1 - tau)), infinite (so beta) at either end."""
    tau = 1.0 - t
    if tau <= 0.0 or tau >= 1.0:
        return max_guidance_weight
    return min(max_guidance_weight, (tau * tau + (1.0 - tau) ** 2) / (tau * (1.0 - tau)))


def refusal(committed: Committed, config: RtcConfig, horizon: int, action_dim: int) -> tuple[str, str] | None:
    """Why this request cannot be guided, as (kind, detail), or None when it can."""
    delay, left_over = committed.delay, committed.left_over
    if not isinstance(left_over, Tensor) or left_over.ndim != 2 or left_over.shape[1] != action_dim:
        shape = tuple(left_over.shape) if isinstance(left_over, Tensor) else type(left_over).__name__
        return "width", f"left-over must be [L, {action_dim}], got {shape}"
    if isinstance(delay, bool) or not isinstance(delay, Integral) or delay < 0:
        return "delay", f"delay must be a whole number >= 0, got {delay!r}"
    end = min(config.execution_horizon, horizon)
    if delay >= end:
        return "delay", f"delay {delay} is at or beyond the execution horizon {end}"
    if delay > len(left_over):
        return "delay", f"delay {delay} is beyond the left-over's {len(left_over)} actions"
    if not bool(torch.isfinite(left_over[:end]).all()):
        return "nonfinite", "left-over has non-finite values"
    return None


class GuidedSampler:
    """The flow sampler with RTC guidance for the rows that bring a previous chunk (`Committed`); the others, and
    every request refused (`refusal`: counted by kind in `fallbacks`, logged), are sampled plainly. A batch with
    no guided row runs the model's own sampler (CUDA graphs where it has them); a guided one runs eagerly."""

    def __init__(self, config: RtcConfig):
        self.config = config
        self.fallbacks: Counter[str] = Counter()

    def sample(self, model, cache: KVCache, slots: Tensor, noise: Tensor, committed: Sequence[Committed | None],
               num_steps: int | None = None) -> Tensor:
        """Actions [B, horizon, action_dim] float32 from noise [B, horizon, action_dim] for the prefixes in
        `slots`; `committed[b]`: row b's previous chunk, or None for plain sampling."""
        cfg = model.config
        horizon, action_dim = cfg.action_horizon, cfg.action_dim
        if len(committed) != len(slots):
            raise ValueError(f"{len(committed)} previous chunks for {len(slots)} slots")
        # whatever mode the caller is in: tensors made in inference mode cannot be saved for the backward pass
        with torch.inference_mode(False):
            targets, weights = self._guidance(committed, horizon, action_dim, model.device)
            if weights is None:
                return model.sample_actions(cache, slots, noise, num_steps)
            expected = (len(slots), horizon, action_dim)
            if tuple(noise.shape) != expected:
                raise ValueError(f"noise must have shape {expected}, got {tuple(noise.shape)}")
            steps = cfg.num_steps if num_steps is None else num_steps
            inputs = expert_inputs(model, cache, slots, steps)
            if inputs.prefix_k.is_inference():  # a cache allocated in inference mode: its prefixes copied once
                inputs.prefix_k, inputs.prefix_v = inputs.prefix_k.clone(), inputs.prefix_v.clone()
            x = noise.to(model.device, torch.float32)
            dt = -1.0 / steps
            if self.config.method == PREFIX:
                return _prefix_sample(model, inputs, x, dt, targets, weights > 0)
            for step, t in enumerate(inputs.times.tolist()):
                velocity, correction = _velocity_and_correction(model, inputs, x, step, t, targets, weights)
                x = x + dt * (velocity - guidance_weight(t, self.config.max_guidance_weight) * correction)
        return x

    def _guidance(self, committed: Sequence[Committed | None], horizon: int, action_dim: int, device
                  ) -> tuple[Tensor | None, Tensor | None]:
        """Targets Y [B, horizon, action_dim] and weights W [B, horizon, 1] (float32, zero for unguided rows), or
        (None, None) when no row is guided."""
        rows = len(committed)
        targets = torch.zeros(rows, horizon, action_dim, dtype=torch.float32)
        weights = torch.zeros(rows, horizon, 1, dtype=torch.float32)
        guided = False
        for row, request in enumerate(committed):
            if request is None:
                continue
            refused = refusal(request, self.config, horizon, action_dim)
            if refused is not None:
                self.fallbacks[refused[0]] += 1
                logger.warning("real-time chunking: row %d sampled without guidance: %s", row, refused[1])
                continue
            end = min(self.config.execution_horizon, horizon, len(request.left_over))
            targets[row, :end] = request.left_over[:end].float().cpu()
            schedule = Schedule.ZEROS if self.config.method == PREFIX else self.config.schedule  # prefix: the d known
            weights[row, :, 0] = torch.from_numpy(prefix_weights(schedule, int(request.delay), end, horizon))
            guided = True
        if not guided:
            return None, None
        return targets.to(device), weights.to(device)


def _velocity_and_correction(model, inputs, x: Tensor, step: int, t: float, targets: Tensor, weights: Tensor
                             ) -> tuple[Tensor, Tensor]:
    """The expert's velocity at x [B, H, A] and the guidance vector-Jacobian product
    (W * (Y - A1))^T dA1/dx with A1 = x - t v(x), one forward and one backward pass for the whole batch."""
    with torch.enable_grad():
        x = x.detach().clone().requires_grad_(True)
        velocity = inputs.velocity(model, x, step)
        finished = x - t * velocity
        error = (weights * (targets - finished)).detach()
        (correction,) = torch.autograd.grad(finished, x, error)
    return velocity.detach(), correction


def _prefix_sample(model, inputs, x: Tensor, dt: float, targets: Tensor, known: Tensor) -> Tensor:
    """Training-time RTC's sampling: the known actions (`known` [B, H, 1]) held at their targets with the time of
    finished actions (t = 0) in their per-token condition, the others integrated as the plain sampler does; one
    forward pass per step and no gradient. A row with nothing known is the plain sampler's row."""
    rows, horizon = x.shape[:2]
    with torch.no_grad():
        for t in inputs.times.tolist():
            x = torch.where(known, targets, x)
            times = torch.where(known[..., 0], 0.0, t).to(torch.float64)
            cond = model.time_condition(times.reshape(-1)).view(rows, horizon, -1)
            velocity = model._velocity(x, cond, inputs.prefix_k, inputs.prefix_v, inputs.bias, inputs.cos, inputs.sin)
            x = x + dt * velocity
        return torch.where(known, targets, x)
