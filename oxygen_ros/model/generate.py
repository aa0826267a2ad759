"""Greedy text generation over prefilled cache slots, batching requests that finish at different times.

The engine interleaves decode steps with other work and resumes requests across frames, so it drives
`Pi05Model.decode_step` itself; this loop is the simple all-at-once version, used by tests and benchmarks and
as the reference for how cache indices and RoPE positions advance.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .kv_cache import KVCache
from .pi05 import Pi05Model, PrefillResult


def greedy_decode(
    model: Pi05Model,
    cache: KVCache,
    slots: Tensor,
    prefill: PrefillResult,
    max_new_tokens: int | Sequence[int],
    eos_id: int | None = None,
) -> list[list[int]]:
    """Generate greedily for every request after `model.prefill(..., want_logits=True)`.

    Request b stops at EOS (not included in its output) or after `max_new_tokens[b]` tokens. Its n-th generated
    token (from 0) goes to cache index `prefix_len + n` with RoPE position `num_valid[b] + n`. Finished requests
    leave the batch, so later steps run on a smaller, possibly non-contiguous, set of slots.
    """
    if prefill.logits is None:
        raise ValueError("prefill was run without want_logits=True")
    batch = len(slots)
    limits = [max_new_tokens] * batch if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(limits) != batch:
        raise ValueError(f"{len(limits)} token limits for {batch} requests")
    eos = model.config.eos_id if eos_id is None else eos_id
    start = model.config.prefix_len
    outputs: list[list[int]] = [[] for _ in range(batch)]
    active = [b for b in range(batch) if limits[b] > 0]
    next_tokens = prefill.logits.argmax(dim=-1)[active].tolist()
    while active:
        still = []
        for b, token in zip(active, next_tokens):
            if token == eos:
                continue
            outputs[b].append(token)
            if len(outputs[b]) < limits[b]:
                still.append(b)
        active = still
        if not active:
            break
        offset = torch.tensor([len(outputs[b]) - 1 for b in active])
        next_tokens = model.decode_next(
            cache,
            slots[active],
            tokens=torch.tensor([outputs[b][-1] for b in active]),
            cache_index=start + offset,
            positions=prefill.num_valid.cpu()[active] + offset,
        ).tolist()
    return outputs
