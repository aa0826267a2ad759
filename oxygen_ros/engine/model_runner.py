"""The only code that calls the model: executes the scheduler's plans over one model's KV pool.

- `act`: the frames of an action plan are prefilled into fresh slots and denoised together, padded to the plan's
  power-of-two bucket with zero-filled rows (into slots kept for padding, never synthetic frames); the first-token
  logits of narrating frames are read back before the denoising is launched.
- `decode`: one batched decode step over any set of requests of this model.
- `resume`: a preempted request gets a slot again, its prefix recomputed and its tokens replayed, so its text is
  what it would have been without the preemption.

Streams (`PriorityStreams`): on a GPU the control path issues on a high-priority CUDA stream and the language
worker on a low-priority one, so a decode step on the device gives way to a chunk block by block. No events are
needed between the two streams because every hand-over already passes a host sync: a frame's slot reaches the
worker only after its first-token logits were read back, a slot is freed only after its last step's tokens were
read back, and decode steps write only the text part of their own slots while a chunk reads its slot's prefix.
This path is written for GPUs but has not run on one yet (`test_gpu/`, `make test-gpu`, is its proof).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.inputs import ModelInputs
from .kv_pool import KVPool
from .language import LanguageRequest, decode_batch
from .scheduler import bucket_for

HIGHEST_PRIORITY = -100  # CUDA clamps stream priorities into its range; lower numbers run first
LOWEST_PRIORITY = 0


class PriorityStreams:
    """The control path's stream and the language worker's. `prioritized=False` gives two streams of equal
    priority (two independent workers, as two processes would be); on a CPU both contexts do nothing."""

    def __init__(self, device: torch.device | str, prioritized: bool = True):
        device = torch.device(device)
        self.enabled = device.type == "cuda"
        high = HIGHEST_PRIORITY if prioritized else LOWEST_PRIORITY
        self.control_stream = torch.cuda.Stream(device, priority=high) if self.enabled else None
        self.language_stream = torch.cuda.Stream(device, priority=LOWEST_PRIORITY) if self.enabled else None

    def control(self):
        return torch.cuda.stream(self.control_stream) if self.enabled else nullcontext()

    def language(self):
        return torch.cuda.stream(self.language_stream) if self.enabled else nullcontext()


def concat_inputs(items: list[ModelInputs]) -> ModelInputs:
    return ModelInputs(torch.cat([i.images for i in items]), torch.cat([i.image_masks for i in items]),
                       torch.cat([i.tokens for i in items]), torch.cat([i.token_masks for i in items]))


def zero_inputs(config, rows: int, device, dtype) -> ModelInputs:
    """Padding rows: zero images (cameras marked present, so no row attends to nothing) and no prompt tokens."""
    size = config.vision.image_size
    return ModelInputs(torch.zeros(rows, config.num_cameras, 3, size, size, dtype=dtype, device=device),
                       torch.ones(rows, config.num_cameras, dtype=torch.bool, device=device),
                       torch.zeros(rows, config.max_token_len, dtype=torch.long, device=device),
                       torch.zeros(rows, config.max_token_len, dtype=torch.bool, device=device))


@dataclass
class ActOutput:
    slots: list[int]  # one per frame, still allocated
    actions: Tensor  # [frames, horizon, action_dim], model space, possibly still in flight on the device
    num_valid: list[int]  # valid prefix tokens per frame
    first_logits: list[Tensor | None]  # host logits of each narrating frame's first token
    seconds: float  # launch time on a GPU, compute time on a CPU


class ModelRunner:
    """One model and its pool: `language_slots` for requests, `max_batch` for frames, and padding slots."""

    def __init__(self, model, language_slots: int, max_new_tokens: int, max_batch: int = 1, num_steps: int = 10):
        if language_slots < 0:
            raise ValueError("language_slots must be >= 0")
        self.model = model
        self.max_batch = max_batch
        self.num_steps = num_steps
        self.language_slots = language_slots
        padding = max(bucket_for(n, max_batch) - n for n in range(1, max_batch + 1))
        self.pool = KVPool(model.config, language_slots + max_batch + padding, max_new_tokens, model.dtype,
                           model.device)
        self._pad_slots = [self.pool.allocate("padding") for _ in range(padding)]

    @property
    def eos_id(self) -> int:
        return self.model.config.eos_id

    # ---- control path -----------------------------------------------------------------------------------------

    def act(self, inputs: list[ModelInputs], noises: list[Tensor], bucket: int, narrate: list[bool]) -> ActOutput:
        """Prefill + denoise the frames together; their slots stay allocated (the caller hands them over or frees
        them). Raises after giving the slots back if the model fails."""
        start = time.perf_counter()
        slots = [self.pool.allocate("frame") for _ in inputs]
        if None in slots:  # cannot happen while the scheduler keeps its capacity: a bug, not a load condition
            self.free([s for s in slots if s is not None])
            raise RuntimeError("no KV slot left for the action path")
        pad = bucket - len(inputs)
        device, dtype = self.model.device, self.model.dtype
        rows = [i.to(device, dtype) for i in inputs]
        if pad:
            rows.append(zero_inputs(self.model.config, pad, device, dtype))
        slot_ids = torch.tensor(slots + self._pad_slots[:pad])
        noise = torch.cat(noises + [torch.zeros_like(noises[0]).expand(pad, -1, -1)] if pad else noises)
        try:
            prefill = self.model.prefill(concat_inputs(rows) if len(rows) > 1 else rows[0], self.pool.cache,
                                         slot_ids, want_logits=any(narrate))
            # read back before denoising: on a GPU this waits for the prefill, not for the chunk too
            num_valid = prefill.num_valid[: len(inputs)].tolist()
            first = [prefill.logits[i].cpu() if n else None for i, n in enumerate(narrate)]
            actions = self.model.sample_actions(self.pool.cache, slot_ids, noise.to(device), self.num_steps)
        except Exception:
            self.free(slots)
            raise
        return ActOutput(slots, actions[: len(inputs)], num_valid, first, time.perf_counter() - start)

    # ---- language path ----------------------------------------------------------------------------------------

    def decode(self, requests: list[LanguageRequest]) -> int:
        """One batched step; returns the tokens produced."""
        return decode_batch(self.model, self.pool.cache, requests)

    def resume(self, request: LanguageRequest, inputs: ModelInputs) -> None:
        """Give a preempted request a slot again: recompute its prefix, replay all but its last token (the next
        decode step feeds that one)."""
        slot = self.pool.allocate(f"request {request.request_id}")
        if slot is None:
            raise RuntimeError("no KV slot to resume a preempted request")
        request.slot = slot
        one = torch.tensor([slot])
        self.model.prefill(inputs.to(self.model.device, self.model.dtype), self.pool.cache, one, want_logits=False)
        for i, token in enumerate(request.tokens[:-1]):
            self.model.decode_step(self.pool.cache, one, torch.tensor([token]), torch.tensor([request.prefix_len + i]),
                                   torch.tensor([request.num_valid_prefix + i]))

    # ---- slots --------------------------------------------------------------------------------------------------

    def free(self, slots: list[int]) -> None:
        for slot in slots:
            self.pool.free(slot)

    def hand_over(self, slot: int, request: LanguageRequest) -> None:
        self.pool.transfer(slot, f"request {request.request_id}")

    @property
    def slots_in_use(self) -> int:
        """Slots held by frames and requests (padding slots not counted)."""
        return self.pool.slots_used - len(self._pad_slots)
