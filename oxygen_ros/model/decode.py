"""Text decoding over a model's cache slots: one token per request per step, and the choice of the next token.

Plain functions of a `Pi05Model` (its methods of the same names call them). A step runs on one of three back ends:
a CUDA graph's replay where the model has graphs for the batch (`model/cuda_graphs.py`), the compiled CPU kernel
where it is turned on (`model/cpu_decode.py`, `model/cpu_kernel.py`), else the network's eager layers
(`Pi05Model._decode_hidden`). Every back end gives the eager step's result to floating-point rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from . import cpu_kernel
from .kv_cache import DecodeIndex, KVCache
from .sampling import NONFINITE_TOKEN, Sampler, greedy_tokens, sample_token


@torch.inference_mode()
def decode_step(model, cache: KVCache, slots: Tensor, tokens: Tensor, cache_index: Tensor,
                positions: Tensor) -> Tensor:
    """Feed one token per request; returns next-token logits [B, vocab] float32.

    Request b's token is written at `cache_index[b]` of slot `slots[b]` (marked valid) with RoPE position
    `positions[b]`, and attends to the valid positions of its own slot up to and including that index.
    Requests may sit at different lengths.
    """
    logits, reused = decode_logits(model, cache, DecodeIndex(cache, slots, cache_index, positions), tokens)
    return logits.to(torch.float32, copy=reused)  # the caller keeps these: never memory the model reuses


@torch.inference_mode()
def decode_next(model, cache: KVCache, slots: Tensor, tokens: Tensor, cache_index: Tensor,
                positions: Tensor, samplers: Sequence[Sampler | None] | None = None) -> Tensor:
    """`decode_step` that returns the chosen next tokens [B] long instead of the logits (`decode_tokens`)."""
    return decode_tokens(model, cache, DecodeIndex(cache, slots, cache_index, positions), tokens, samplers)


@torch.inference_mode()
def decode_tokens(model, cache: KVCache, index: DecodeIndex, tokens: Tensor,
                  samplers: Sequence[Sampler | None] | None = None, first: Tensor | None = None) -> Tensor:
    """One decode step of the batch `index` (built for `cache`) feeding `tokens` [B]; returns the chosen next
    tokens [B] long, on the model's device, as `next_tokens` chooses them. A caller that keeps the batch
    advances `index` in place and feeds back what this returned: the next step copies nothing from the host.

    `first` [N, W]: prefixes' last-layer outputs (`PrefillResult.hidden`) whose first tokens are chosen in the
    same pass over the text head; their tokens follow the batch's ([B + N] in all, `samplers` alike).
    """
    rows = len(index) + (0 if first is None else len(first))
    if samplers is not None and len(samplers) != rows:
        raise ValueError(f"{len(samplers)} samplers for {rows} requests")
    _check_tokens(index, tokens)
    logits = _graph_logits(model, cache, index, tokens)
    if logits is not None:
        if first is not None:
            logits = torch.cat([logits, model.backbone.logits(first.to(logits.dtype))])
        bad = ~torch.isfinite(logits).all(dim=-1)  # on the device, one pass
        return _unless_nonfinite(_choose(model, logits, samplers, skip=bad), bad)
    if model._cpu.kernel:  # the kernel's step ends with the final norm: the prefixes' rows are normed apart
        h = model._cpu.kernel_normed(model, cache, index, tokens)
        if first is not None:
            h = torch.cat([h, model.backbone.norm(first.to(h.dtype))[0]])
        return _tokens_of_normed(model, h, samplers)
    hidden = model._decode_hidden(cache, index, tokens)
    if first is not None:
        hidden = torch.cat([hidden, first.to(hidden.dtype)])
    return _next_tokens(model, hidden, samplers)


@torch.inference_mode()
def next_tokens(model, hidden: Tensor, samplers: Sequence[Sampler | None] | None = None) -> Tensor:
    """The next tokens [B] long chosen from last-layer outputs hidden [B, W] (before the final norm): row b
    takes the first maximum of its logits, or with `samplers[b]` a sample from that request's own stream;
    either way exactly what the float32 logits give. The logits stay in the model's dtype and only sampled
    rows are converted, so no [B, vocab] float32 copy is made; a greedy batch on the CPU kernel makes no
    logits at all where `cpu_kernel.head_greedy_pays`."""
    if samplers is not None and len(samplers) != len(hidden):
        raise ValueError(f"{len(samplers)} samplers for {len(hidden)} requests")
    return _next_tokens(model, hidden, samplers)


def decode_logits(model, cache: KVCache, index: DecodeIndex, tokens: Tensor) -> tuple[Tensor, bool]:
    """Next-token logits [B, vocab] in the model's dtype (a CUDA graph's replay when one serves the batch), and
    whether they lie in memory the model writes again: a graph's static output, which its next replay
    overwrites, or the CPU step's reused logits buffer."""
    _check_tokens(index, tokens)
    logits = _graph_logits(model, cache, index, tokens)
    if logits is not None:
        return logits, True
    out = model._cpu.logits_out(model, len(index))
    if model._cpu.kernel:
        return model.backbone.head_logits(model._cpu.kernel_normed(model, cache, index, tokens), out), out is not None
    return model.backbone.logits(model._decode_hidden(cache, index, tokens), out), out is not None


def _next_tokens(model, hidden: Tensor, samplers: Sequence[Sampler | None] | None) -> Tensor:
    return _tokens_of_normed(model, model.backbone.norm(hidden)[0], samplers)


def _tokens_of_normed(model, h: Tensor, samplers: Sequence[Sampler | None] | None) -> Tensor:
    """`_next_tokens` of the final norm's outputs h [B, W]."""
    if h.device.type != "cpu":  # the logits are made anyway: checked on the device, nothing read back
        logits = model.backbone.head_logits(h, model._cpu.logits_out(model, len(h)))
        bad = ~torch.isfinite(logits).all(dim=-1)
        return _unless_nonfinite(_choose(model, logits, samplers, skip=bad), bad)
    bad = _nonfinite_rows(model, h)
    if model._cpu.kernel and not any(s is not None for s in samplers or ()) \
            and cpu_kernel.head_greedy_pays(model.dtype, len(h), model.config.backbone.width):
        head = model.backbone.text_head
        chosen = cpu_kernel.head_greedy(h.contiguous(), head, torch.get_num_threads(),
                                        copy=model._cpu.head_copy(head, model.dtype))
        return _unless_nonfinite(chosen, bad)
    logits = model.backbone.head_logits(h, model._cpu.logits_out(model, len(h)))
    return _unless_nonfinite(_choose(model, logits, samplers, skip=bad), bad)


def _choose(model, logits: Tensor, samplers: Sequence[Sampler | None] | None,
            skip: Tensor | None = None) -> Tensor:
    """The chosen tokens; rows in `skip` (non-finite logits) are not sampled (softmax of NaN refuses)."""
    chosen = cpu_kernel.greedy_tokens(logits) if model._cpu.kernel else greedy_tokens(logits)
    for row, sampler in enumerate(samplers or ()):
        if sampler is not None and (skip is None or not bool(skip[row])):
            chosen[row] = sample_token(logits[row], sampler)
    return chosen


def _unless_nonfinite(chosen: Tensor, bad: Tensor | None) -> Tensor:
    """`chosen` with NONFINITE_TOKEN in each row whose logits were not all finite: a token picked from an
    overflowing text head is garbage, and the request it belongs to ends as a model error
    (`LanguageRequest.accept`). Nothing is read back to the host."""
    return chosen if bad is None else chosen.masked_fill(bad.to(chosen.device), NONFINITE_TOKEN)


def _nonfinite_rows(model, h: Tensor) -> Tensor | None:
    """Which rows of h [B, W] (on the CPU: the bound is read back) give a non-finite logit (bool [B]; None: none),
    without the logits for the rest.

    Each logit and every partial sum of it is at most ||h_b|| max_v ||head_v|| in size (Cauchy-Schwarz): a row
    whose bound stays below half the dtype's range cannot overflow, which is every row of a healthy model and
    costs one norm per row. Only rows past it (or with a non-finite h) get their logits computed and checked."""
    limit = 0.5 * torch.finfo(model.dtype).max
    bound = torch.linalg.vector_norm(h.float(), dim=-1) * model._cpu.head_row_norm(model.backbone.text_head)
    risky = ~(bound < limit)  # NaN compares False: risky
    if not bool(risky.any()):
        return None
    rows = risky.nonzero()[:, 0]
    bad = torch.zeros(len(h), dtype=torch.bool, device=h.device)
    bad[rows] = ~torch.isfinite(model.backbone.head_logits(h[rows])).all(dim=-1)
    return bad


def _graph_logits(model, cache: KVCache, index: DecodeIndex, tokens: Tensor) -> Tensor | None:
    """A CUDA graph's replay of the step's logits when one serves the batch, else None. The logits are the
    graph's static output, valid until its next replay: fine for a choice made on the same stream right after
    (`decode_tokens`), copied where a caller keeps them (`decode_step`)."""
    if model._graphs is None:
        return None
    return model._graphs.decode_logits(cache, index.slots, tokens, index.cache_index, index.positions)


def _check_tokens(index: DecodeIndex, tokens: Tensor) -> None:
    if tuple(tokens.shape) != (len(index),):
        raise ValueError(f"tokens must have shape ({len(index)},), got {tuple(tokens.shape)}")
