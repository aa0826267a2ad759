"""Action chunks: the flow-matching sampler over a model's cache slots.

Plain functions of a `Pi05Model` (`Pi05Model.sample_actions` calls `sample_actions`): Euler steps from noise at t=1
to actions at t=0, each step one pass of the network's action expert (`Pi05Model._velocity`). The whole loop
replays as one CUDA graph where the model has graphs for the batch (`model/cuda_graphs.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .expert_inputs import expert_inputs
from .kv_cache import KVCache


@torch.inference_mode()
def sample_actions(model, cache: KVCache, slots: Tensor, noise: Tensor, num_steps: int | None = None
                   ) -> Tensor:
    """Euler-integrate the flow from noise (t=1) to actions (t=0): [B, horizon, action_dim] float32.

    Reads each slot's prefix K/V in place and never writes the cache: for one slot or a contiguous range of
    slots the expert attends to views of the cache (zero copy); other slot sets are gathered once per call
    (`expert_inputs`: what every step reads, shared with the guided sampler).
    """
    cfg = model.config
    inputs = expert_inputs(model, cache, slots, cfg.num_steps if num_steps is None else num_steps)
    expected = (len(slots), cfg.action_horizon, cfg.action_dim)
    if tuple(noise.shape) != expected:
        raise ValueError(f"noise must have shape {expected}, got {tuple(noise.shape)}")
    fixed = (inputs.conds, inputs.prefix_k, inputs.prefix_v, inputs.bias, inputs.cos, inputs.sin)
    x = noise.to(model.device, torch.float32)
    if model._graphs is not None:
        graphed = model._graphs.denoise(x, *fixed)
        if graphed is not None:
            return graphed
    return denoise(model, x, *fixed)

def denoise(model, x: Tensor, conds: Tensor, prefix_k: Tensor, prefix_v: Tensor, bias: Tensor,
            cos: Tensor, sin: Tensor) -> Tensor:
    """Euler steps from noise x [B, H, A] float32, one per row of conds [steps, W]: device work only."""
    dt = -1.0 / conds.shape[0]
    for step in range(conds.shape[0]):
        cond = conds[step].expand(x.shape[0], -1)
        velocity = model._velocity(x, cond, prefix_k, prefix_v, bias, cos, sin)
        x = x + dt * velocity
    return x
