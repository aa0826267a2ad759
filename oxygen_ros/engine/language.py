"""Language requests as resumable states, and one batched decode step over any set of them.

Decoding is greedy by default; with a temperature each request samples from its own seeded generator, so its text
does not depend on which other requests shared its batches. A request is born from a frame's prefill (its slot
already holds the prefix K/V) with its first token chosen from the prefill's last-token logits, or with that token's
last-layer output kept (`first_hidden`) so that its first decode step chooses the first token, in the same pass over
the text head as the batch's other requests: the control path that ran the prefill then never pays for the head.
It advances one token per decode step, in whatever batch the scheduler puts it in. All it needs to resume is in the
dataclass, so requests from different frames decode together (cross-frame continuous batching) and a request can
wait any number of frames between steps.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..model.kv_cache import DecodeIndex, KVCache
from ..model.sampling import NONFINITE_TOKEN, Sampler, sample_token


@dataclass
class LanguageRequest:
    """One narration being generated from the prefix in `slot`.

    `tokens` are the generated ids so far (EOS excluded). The last generated token has not been fed to the model
    yet; feeding it writes its K/V at cache index `prefix_len + len(tokens) - 1` with RoPE position
    `num_valid_prefix + len(tokens) - 1`.
    """

    request_id: int
    slot: int
    frame_id: int
    stamp_ns: int
    prefix_len: int
    num_valid_prefix: int
    max_new_tokens: int
    eos_id: int
    temperature: float = 0.0  # 0: greedy; > 0: sample from softmax(logits / temperature)
    seed: int = 0  # the request's own sampling stream, so batching never changes what it samples
    arrival_time: float = field(default_factory=time.perf_counter)
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "eos", "length", "evicted" or "nonfinite" (a model error)
    first_token_time: float | None = None
    finish_time: float | None = None
    # until the first token is chosen: its prefix's last-layer output [W] (`PrefillResult.hidden`), on the device
    first_hidden: Tensor | None = field(default=None, repr=False, compare=False)
    _generator: torch.Generator | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def sampler(self) -> Sampler | None:
        """None when greedy, else the request's own sampling stream (seeded on first use)."""
        if self.temperature <= 0:
            return None
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed)
        return Sampler(self.temperature, self._generator)

    def choose(self, logits: Tensor) -> int:
        """The next token from one row of logits: argmax, or a sample from this request's own generator;
        NONFINITE_TOKEN when a logit is not finite."""
        if not bool(torch.isfinite(logits).all()):
            return NONFINITE_TOKEN
        sampler = self.sampler()
        return int(logits.argmax()) if sampler is None else sample_token(logits, sampler)

    def accept(self, token: int, now: float) -> None:
        """Record the model's next token; finishes the request on EOS, when the budget is spent, or as a model error
        ("nonfinite") on NONFINITE_TOKEN (the text head overflowed: no token can be trusted)."""
        if self.done:
            raise RuntimeError(f"request {self.request_id} is already finished")
        if self.first_token_time is None:
            self.first_token_time = now
        if token == NONFINITE_TOKEN:
            self.finish("nonfinite", now)
            return
        if token == self.eos_id:
            self.finish("eos", now)
            return
        self.tokens.append(token)
        if len(self.tokens) >= self.max_new_tokens:
            self.finish("length", now)

    def finish(self, reason: str, now: float) -> None:
        self.finish_reason = reason
        self.finish_time = now


def start_request(
    request_id: int,
    slot: int,
    frame_id: int,
    stamp_ns: int,
    prefix_len: int,
    num_valid_prefix: int,
    first_logits: Tensor | None,
    max_new_tokens: int,
    eos_id: int,
    temperature: float = 0.0,
    seed: int = 0,
    first_hidden: Tensor | None = None,
) -> LanguageRequest:
    """A request whose first token comes from the prefill's last-prefix-token logits, or (`first_logits` None)
    from `first_hidden`, that token's last-layer output, in its first decode step."""
    if (first_logits is None) == (first_hidden is None):
        raise ValueError("a request starts from its first token's logits or its last-layer output, one of them")
    request = LanguageRequest(request_id, slot, frame_id, stamp_ns, prefix_len, num_valid_prefix, max_new_tokens,
                              eos_id, temperature, seed)
    if max_new_tokens == 0:
        request.finish("length", time.perf_counter())
    elif first_logits is not None:
        request.accept(request.choose(first_logits), time.perf_counter())
    else:
        request.first_hidden = first_hidden
    return request


@dataclass
class _LastStep:
    """A batch's last decode step in one cache, kept so that the same batch's next step only advances its index."""

    members: tuple[tuple[int, int, int, int], ...]  # (slot, prefix_len, num_valid_prefix, tokens) per request after it
    index: DecodeIndex  # on the cache's device
    chosen: Tensor  # the tokens it chose, on the device: what the next step feeds
    chosen_list: list[int]


_LAST_STEPS: weakref.WeakKeyDictionary[KVCache, _LastStep] = weakref.WeakKeyDictionary()


def _members(active: list[LanguageRequest]) -> tuple[tuple[int, int, int, int], ...]:
    return tuple((r.slot, r.prefix_len, r.num_valid_prefix, len(r.tokens)) for r in active)


def decode_batch(model, cache: KVCache, requests: list[LanguageRequest]) -> int:
    """Advance every unfinished request by one token in a single model call; returns tokens produced.

    The batch's index tensors (slots, cache indices, RoPE positions) live on the cache's device: they are built
    when the batch changes (a request joins, leaves, moves slot or was fed elsewhere) and otherwise advanced by one
    in place, and the tokens a step chose are fed to the next step from the device. Whether the batch is the same
    is decided on values alone (each request's slot, prefix, length, and fed token), so reusing the index always
    gives what rebuilding it would.
    """
    # in slot order: when the slots form one range (the pool hands out the lowest free slot, so in steady state they
    # do), the model reads the batch's K/V as views of the cache instead of gathering them
    active = sorted((r for r in requests if not r.done), key=lambda r: r.slot)
    if not active:
        return 0
    starting = [r for r in active if r.first_hidden is not None]  # their first tokens, in the same head pass
    fed_rows = [r for r in active if r.first_hidden is None]
    first = torch.stack([r.first_hidden for r in starting]) if starting else None
    samplers = [r.sampler() for r in fed_rows + starting]
    if not fed_rows:
        chosen = model.next_tokens(first, samplers)
    else:
        members = _members(fed_rows)
        fed_list = [r.tokens[-1] for r in fed_rows]
        last = _LAST_STEPS.get(cache)
        if last is not None and last.members == members and last.chosen_list == fed_list:
            index, fed = last.index, last.chosen
            index.advance()
        else:
            offsets = [len(r.tokens) - 1 for r in fed_rows]
            index = DecodeIndex.from_lists(
                cache,
                [r.slot for r in fed_rows],
                [r.prefix_len + o for r, o in zip(fed_rows, offsets)],
                [r.num_valid_prefix + o for r, o in zip(fed_rows, offsets)],
            )
            fed = torch.tensor(fed_list)
        chosen = model.decode_tokens(cache, index, fed, samplers, first=first)
    chosen_list = chosen.tolist()
    now = time.perf_counter()
    for request, token in zip(fed_rows + starting, chosen_list):
        request.first_hidden = None
        request.accept(token, now)
    if fed_rows:  # the rows its index holds; a batch a request joined next step builds a new one
        _LAST_STEPS[cache] = _LastStep(_members(fed_rows), index, chosen[: len(fed_rows)],
                                       chosen_list[: len(fed_rows)])
    return len(active)
