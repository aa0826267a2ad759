"""Choosing the next token from logits: greedy (the first maximum) or a sample from a request's own stream.

With pi0.5's 257,152-token vocabulary, picking the token costs as much as a large share of the decode step
itself: `Tensor.argmax` walks a [batch, vocab] row element by element. `greedy_tokens` finds the same index with
vectorised block maxima, in the logits' own dtype (no float32 copy of the whole batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

GREEDY_BLOCK = 1024  # logits per block; the block maxima are one vectorised pass


@dataclass
class Sampler:
    """Sampling at `temperature` (> 0) from `generator`, a request's own stream: the same seed gives the same text
    whichever other requests share its batches."""

    temperature: float
    generator: torch.Generator


def greedy_tokens(logits: Tensor) -> Tensor:
    """`logits.argmax(dim=-1)` for NaN-free logits [B, vocab] of any float dtype, ties going to the first index.

    Per row: the maximum of every block of `GREEDY_BLOCK` logits, the first block holding the row's maximum, the
    first maximum inside that block; the tail after the last whole block is compared on its own.
    """
    batch, vocab = logits.shape
    blocks = vocab // GREEDY_BLOCK
    if blocks == 0:
        return logits.argmax(dim=-1)
    body = logits[:, : blocks * GREEDY_BLOCK].view(batch, blocks, GREEDY_BLOCK)
    block_max = body.amax(dim=-1)  # [B, blocks]
    best = block_max.amax(dim=-1)  # [B]
    block = (block_max == best[:, None]).to(torch.uint8).argmax(dim=-1)  # the first block with the maximum
    rows = torch.arange(batch, device=logits.device)
    tokens = block * GREEDY_BLOCK + body[rows, block].argmax(dim=-1)
    if blocks * GREEDY_BLOCK == vocab:
        return tokens
    tail_max, tail_index = logits[:, blocks * GREEDY_BLOCK :].max(dim=-1)
    return torch.where(tail_max > best, blocks * GREEDY_BLOCK + tail_index, tokens)


def sample_token(logits: Tensor, sampler: Sampler) -> int:
    """One token from one row of logits [vocab]: softmax(logits / temperature) in float32 on the CPU."""
    probabilities = torch.softmax(logits.float().cpu() / sampler.temperature, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=sampler.generator))
