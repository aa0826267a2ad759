"""The KV cache pool: a fixed number of slots over one preallocated `KVCache`, with byte accounting.

A slot holds one camera frame's prefix K/V plus room for the text that a language request generates from it. The
action path fills a slot with one prefill and reads it in place; if the frame also asks for language, the same
slot is handed to the language request instead of being freed, which is the cross-task sharing. Allocation never
touches tensors, so a frame costs no allocation at all. The lowest free slot is always taken, so the requests in
flight tend to hold one contiguous range of slots, which a decode step reads as a view of the cache (no gather).
"""

from __future__ import annotations

import heapq
import threading

import torch

from ..model.config import Pi05Config
from ..model.kv_cache import KVCache


class KVPool:
    """Slot allocator over a `KVCache` of `num_slots` slots, each `prefix_len + max_new_tokens` long.

    Thread-safe: the control path allocates and the language worker frees from another thread.
    """

    def __init__(
        self,
        config: Pi05Config,
        num_slots: int,
        max_new_tokens: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if num_slots < 1:
            raise ValueError("the pool needs at least one slot")
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        self.config = config
        self.max_new_tokens = max_new_tokens
        self.cache = KVCache(config, num_slots, config.prefix_len + max_new_tokens, dtype, device)
        self._free: list[int] = list(range(num_slots))  # a heap: the lowest free slot first
        self._owners: dict[int, str] = {}
        self._lock = threading.Lock()

    # ---- allocation -----------------------------------------------------------------------------------------

    def allocate(self, owner: str) -> int | None:
        """Take a free slot for `owner` (a label kept for reports), or None when the pool is full."""
        with self._lock:
            if not self._free:
                return None
            slot = heapq.heappop(self._free)
            self._owners[slot] = owner
            return slot

    def free(self, slot: int) -> None:
        with self._lock:
            if slot not in self._owners:
                raise ValueError(f"slot {slot} is not allocated")
            del self._owners[slot]
            heapq.heappush(self._free, slot)

    def transfer(self, slot: int, owner: str) -> None:
        """Give an allocated slot a new owner (a frame's slot becoming a language request's) without copying."""
        with self._lock:
            if slot not in self._owners:
                raise ValueError(f"slot {slot} is not allocated")
            self._owners[slot] = owner

    # ---- accounting -----------------------------------------------------------------------------------------

    @property
    def slots_total(self) -> int:
        return self.cache.num_slots

    @property
    def slots_used(self) -> int:
        with self._lock:
            return len(self._owners)

    @property
    def bytes_total(self) -> int:
        return self.cache.nbytes

    @property
    def bytes_per_slot(self) -> int:
        return self.cache.nbytes // self.cache.num_slots

    @property
    def bytes_used(self) -> int:
        return self.slots_used * self.bytes_per_slot
