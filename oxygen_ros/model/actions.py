"""Action chunks: the flow-matching sampler over a model's cache slots.

Plain functions of a `Pi05Model` (`Pi05Model.sample_actions` calls `sample_actions`): Euler steps from noise at t=1
to actions at t=0, each step one pass of the network's action expert (`Pi05Model._velocity`). The whole loop
replays as one CUDA graph where the model has graphs for the batch (`model/cuda_graphs.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .gemma import prefix_attention_bias, rope_cos_sin
from .kv_cache import KVCache, slot_index


@torch.inference_mode()
def sample_actions(model, cache: KVCache, slots: Tensor, noise: Tensor, num_steps: int | None = None
                   ) -> Tensor:
    """Euler-integrate the flow from noise (t=1) to actions (t=0): [B, horizon, action_dim] float32.

    Reads each slot's prefix K/V in place and never writes the cache: for one slot or a contiguous range of
    slots the expert attends to views of the cache (zero copy); other slot sets are gathered once per call.
    """
    cfg = model.config
    steps = cfg.num_steps if num_steps is None else num_steps
    if steps < 1:
        raise ValueError("num_steps must be at least 1")
    expected = (len(slots), cfg.action_horizon, cfg.action_dim)
    if tuple(noise.shape) != expected:
        raise ValueError(f"noise must have shape {expected}, got {tuple(noise.shape)}")
    length, horizon = cfg.prefix_len, cfg.action_horizon
    idx = slot_index(slots, cache.num_slots)
    dtype, device = model.dtype, model.device

    # Actions see the valid prefix and each other; the prefix rows are not computed at all.
    prefix_valid = cache.valid[idx, :length]
    num_valid = prefix_valid.sum(dim=1)
    prefix_k = cache.k[:, idx, :, :length]
    prefix_v = cache.v[:, idx, :, :length]
    if prefix_k.dtype != dtype:  # a cache kept in another precision than the weights
        prefix_k, prefix_v = prefix_k.to(dtype), prefix_v.to(dtype)
    positions = num_valid[:, None].to(device) + torch.arange(horizon, device=device)
    cos, sin = rope_cos_sin(positions, cfg.expert.head_dim, cfg.rope_theta, dtype)
    group = cfg.expert.num_heads // cfg.expert.num_kv_heads
    bias = prefix_attention_bias(prefix_valid.to(device), group, horizon, dtype)

    times = 1.0 + (-1.0 / steps) * torch.arange(steps, device=device, dtype=torch.float64)
    conds = model.time_condition(times)  # [steps, W], same time for every sample
    x = noise.to(device, torch.float32)
    if model._graphs is not None:
        graphed = model._graphs.denoise(x, conds, prefix_k, prefix_v, bias, cos, sin)
        if graphed is not None:
            return graphed
    return denoise(model, x, conds, prefix_k, prefix_v, bias, cos, sin)


def denoise(model, x: Tensor, conds: Tensor, prefix_k: Tensor, prefix_v: Tensor, bias: Tensor,
            cos: Tensor, sin: Tensor) -> Tensor:
    """Euler steps from noise x [B, H, A] float32, one per row of conds [steps, W]: device work only."""
    dt = -1.0 / conds.shape[0]
    for step in range(conds.shape[0]):
        cond = conds[step].expand(x.shape[0], -1)
        velocity = model._velocity(x, cond, prefix_k, prefix_v, bias, cos, sin)
        x = x + dt * velocity
    return x
