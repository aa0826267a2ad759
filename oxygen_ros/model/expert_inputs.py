"""What the action expert reads at every denoising step of a batch, made once per call.

A denoising step is one pass of the expert over the noisy actions; everything else it reads is fixed for the call:
each slot's prefix K/V (read in place, or gathered once), the additive mask of the prefix's padding, the actions'
RoPE tables (positions right after each slot's valid prefix) and the time conditions of the Euler steps, t = 1
(noise) down to 1/steps. Samplers that step the flow themselves (`model/rtc.py`) build these here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .gemma import prefix_attention_bias, rope_cos_sin
from .kv_cache import KVCache, slot_index


@dataclass
class ExpertInputs:
    """prefix_k/v [depth, B, KV, P, D] in the model's dtype; bias [B, 1, group*H, P]; cos/sin [B, 1, H, D];
    times [steps] float64 (1, 1 - 1/steps, ..., 1/steps); conds [steps, W] their time conditions."""

    prefix_k: Tensor
    prefix_v: Tensor
    bias: Tensor
    cos: Tensor
    sin: Tensor
    times: Tensor
    conds: Tensor

    def velocity(self, model, x: Tensor, step: int) -> Tensor:
        """The expert's velocity [B, H, A] float32 for noisy actions x [B, H, A] at Euler step `step`."""
        cond = self.conds[step].expand(x.shape[0], -1)
        return model._velocity(x, cond, self.prefix_k, self.prefix_v, self.bias, self.cos, self.sin)


def expert_inputs(model, cache: KVCache, slots: Tensor, steps: int) -> ExpertInputs:
    """The fixed inputs of a `steps`-step denoising of the prefixes in `slots` of `cache`."""
    if steps < 1:
        raise ValueError("num_steps must be at least 1")
    cfg = model.config
    length, horizon = cfg.prefix_len, cfg.action_horizon
    dtype, device = model.dtype, model.device
    idx = slot_index(slots, cache.num_slots)
    prefix_valid = cache.valid[idx, :length]
    prefix_k = cache.k[:, idx, :, :length]
    prefix_v = cache.v[:, idx, :, :length]
    if prefix_k.dtype != dtype:  # a cache kept in another precision than the weights
        prefix_k, prefix_v = prefix_k.to(dtype), prefix_v.to(dtype)
    positions = prefix_valid.sum(dim=1)[:, None].to(device) + torch.arange(horizon, device=device)
    cos, sin = rope_cos_sin(positions, cfg.expert.head_dim, cfg.rope_theta, dtype)
    group = cfg.expert.num_heads // cfg.expert.num_kv_heads
    bias = prefix_attention_bias(prefix_valid.to(device), group, horizon, dtype)
    times = 1.0 + (-1.0 / steps) * torch.arange(steps, device=device, dtype=torch.float64)
    with torch.no_grad():
        conds = model.time_condition(times)
    return ExpertInputs(prefix_k, prefix_v, bias, cos, sin, times, conds)
