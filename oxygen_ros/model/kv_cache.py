"""The static key/value cache the model writes into: one preallocated buffer per tensor, owned by the caller.

OxyGen's point is that one prefill per camera frame serves both the action expert and language decoding. So the
cache is not per call: the engine's pool owns a `KVCache` with a fixed number of slots, hands slot indices to the
model, and the model writes prefix K/V (and later generated tokens) in place. Nothing here allocates per frame.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import Pi05Config


class KVCache:
    """K/V of every backbone layer for `num_slots` sequences of up to `max_len` tokens.

    `k`, `v`: [depth, num_slots, kv_heads, max_len, head_dim]; `valid`: [num_slots, max_len] marks positions that
    hold real tokens (prefix padding and unused room are False). Buffers start zeroed, so masked-out positions
    never hold NaN that could leak through attention.
    """

    def __init__(
        self,
        config: Pi05Config,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if max_len < config.prefix_len:
            raise ValueError(f"max_len {max_len} is shorter than the prefix ({config.prefix_len} tokens)")
        g = config.backbone
        shape = (g.depth, num_slots, g.num_kv_heads, max_len, g.head_dim)
        self.config = config
        self.num_slots = num_slots
        self.max_len = max_len
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.valid = torch.zeros((num_slots, max_len), dtype=torch.bool, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.valid))

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device


class DecodeIndex:
    """Where one decode batch writes and reads in a `KVCache`, as tensors on the cache's device.

    Request b's fed token goes to cache index `cache_index[b]` of slot `slots[b]` with RoPE position
    `positions[b]`; the batch attends over the first `span` positions of its slots, addressed by `idx` (a slice
    when the slots are one ascending range, so every layer reads views; else the slot tensor). Built and checked
    once when a batch forms; `advance` moves every request on by one position in place, so the next step of the
    same batch copies nothing from the host and checks nothing again.
    """

    def __init__(self, cache: KVCache, slots: Tensor, cache_index: Tensor, positions: Tensor):
        b = len(slots)
        for name, t in (("cache_index", cache_index), ("positions", positions)):
            if tuple(t.shape) != (b,):
                raise ValueError(f"{name} must have shape ({b},), got {tuple(t.shape)}")
        hi = self._check(cache, int(cache_index.min()), int(cache_index.max()))
        window = slot_range(slots.tolist() if slots.ndim == 1 else [], cache.num_slots)
        with torch.inference_mode():  # the model reads these in inference mode; `advance` updates them there too
            # copies: `advance` updates them in place, never the caller's tensors
            self._keep(cache, window, hi, slots.to(cache.device, torch.long),
                       cache_index.to(cache.device, torch.long, copy=True),
                       positions.to(cache.device, torch.long, copy=True))

    @classmethod
    def from_lists(cls, cache: KVCache, slots: list[int], cache_index: list[int], positions: list[int]
                   ) -> DecodeIndex:
        """The same index from host lists (what the engine keeps per request): checked on the lists, sent to the
        device as one tensor whose rows are the index's three, so a new batch costs one tensor, not a dozen small
        operators on the thread that decodes beside the control path."""
        b = len(slots)
        for name, values in (("cache_index", cache_index), ("positions", positions)):
            if len(values) != b:
                raise ValueError(f"{name} must have shape ({b},), got ({len(values)},)")
        window = slot_range(slots, cache.num_slots)  # first: it refuses an empty batch
        hi = cls._check(cache, min(cache_index), max(cache_index))
        index = cls.__new__(cls)
        with torch.inference_mode():
            rows = torch.tensor([slots, cache_index, positions], dtype=torch.long, device=cache.device)
            index._keep(cache, window, hi, rows[0], rows[1], rows[2])
        return index

    @staticmethod
    def _check(cache: KVCache, lo: int, hi: int) -> int:
        """The cache indices' range checked; returns the highest."""
        if lo < cache.config.prefix_len or hi >= cache.max_len:
            raise ValueError(f"cache_index must lie in [{cache.config.prefix_len}, {cache.max_len}), got {lo}..{hi}")
        return hi

    def _keep(self, cache: KVCache, window: slice | None, hi: int, slots: Tensor, cache_index: Tensor,
              positions: Tensor) -> None:
        self.slots, self.cache_index, self.positions = slots, cache_index, positions
        self.idx = window if window is not None else slots
        self.span = hi + 1
        self.max_len = cache.max_len

    def __len__(self) -> int:
        return len(self.slots)

    def advance(self) -> None:
        """Every request one position on: the next token's cache index and RoPE position, one more to attend over."""
        if self.span >= self.max_len:
            raise ValueError(f"the batch's slots are full ({self.max_len} positions)")
        with torch.inference_mode():
            self.cache_index.add_(1)
            self.positions.add_(1)
        self.span += 1


def slot_index(slots: Tensor, num_slots: int) -> slice | Tensor:
    """Index for the slot dimension: a `slice` when the slots are one ascending contiguous range, else the tensor.

    Indexing with a slice gives views of the cache (no copy); a tensor index gathers. Callers decide once per call.
    """
    window = slot_range(slots.tolist() if slots.ndim == 1 else [], num_slots)
    return window if window is not None else slots.to(torch.long)


def slot_range(values: list[int], num_slots: int) -> slice | None:
    """The `slice` of slot indices `values` when they are one ascending contiguous range, else None; raises when
    they are empty (or were not 1-D), out of range or repeated."""
    if not values:
        raise ValueError("slots must be a non-empty 1-D sequence of slot indices")
    if min(values) < 0 or max(values) >= num_slots:
        raise ValueError(f"slot indices {values} out of range for {num_slots} slots")
    if len(set(values)) != len(values):
        raise ValueError(f"slot indices must be distinct, got {values}")
    start = values[0]
    if values == list(range(start, start + len(values))):
        return slice(start, start + len(values))
    return None


def read_slots(layer_buffer: Tensor, idx: slice | Tensor, span: int) -> Tensor:
    """The first `span` positions of the slots `idx` (from `slot_index`) of one layer's K or V
    [num_slots, kv_heads, max_len, head_dim]: a view for a slice, else one `index_select` copy (a plain memory copy
    per slot, where advanced indexing would address every element)."""
    window = layer_buffer[:, :, :span]
    if isinstance(idx, slice):
        return window[idx]
    return window.index_select(0, idx.to(layer_buffer.device))
