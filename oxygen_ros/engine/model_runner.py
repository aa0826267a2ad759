"""The only code that calls the model: executes the scheduler's plans over one model's KV pool.

- `act`: the frames of an action plan are prefilled into fresh slots and denoised together, padded to the plan's
  power-of-two bucket with zero-filled rows (into slots kept for padding, never synthetic frames); a narrating
  frame's prefill keeps its last token's last-layer output, from which the request's first decode step chooses the
  first token (the text head never runs on the control path), and the valid lengths are read back before the
  denoising is launched.
- Real-time chunking: a frame may bring its robot's previous chunk and delay (`Committed`); with `rtc` set, a
  batch holding such frames is denoised by the guided sampler (`model/rtc.py`), the other frames of the batch
  plainly in the same pass; requests it cannot guide fall back to plain sampling, counted in `rtc_fallbacks`.
- `decode`: one batched decode step over any set of requests of this model.
- `resume`: a preempted request gets a slot again, its prefix recomputed and its tokens replayed, so its text is
  what it would have been without the preemption.

Streams (`PriorityStreams`): on a GPU the control path issues on a high-priority CUDA stream and the language
worker on a low-priority one, so a decode step on the device gives way to a chunk block by block. No events are
needed between the two streams because every hand-over already passes a host sync: a frame's slot reaches the
worker only after its prefill's valid lengths were read back, a request's slot is freed only after its last step's
tokens were read back and a frame's that no request takes only after its chunk was (the runtime's part), and
decode steps write only the text part of their own slots while a chunk reads its slot's prefix. This path is
written for GPUs but has not run on one yet (`test_gpu/`, `make test-gpu`, is its proof).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.inputs import ModelInputs
from ..model.rtc import Committed, GuidedSampler, RtcConfig
from .frames import bucket_for
from .kv_pool import KVPool
from .language import LanguageRequest, decode_batch

HIGHEST_PRIORITY = -100  # CUDA clamps stream priorities into its range; lower numbers run first
LOWEST_PRIORITY = 0


class PriorityStreams:
    """The control path's stream and the language worker's. `prioritized=False` gives two streams of equal
    priority (two independent workers, as two processes would be); on a CPU both contexts do nothing.

    Make them once the weights and pools they will read are set up: on a GPU this waits for the device, since
    torch's streams do not wait for the work queued on the default stream (uploads, zero-filled pools, copies)."""

    def __init__(self, device: torch.device | str, prioritized: bool = True):
        device = torch.device(device)
        self.enabled = device.type == "cuda"
        high = HIGHEST_PRIORITY if prioritized else LOWEST_PRIORITY
        self.control_stream = torch.cuda.Stream(device, priority=high) if self.enabled else None
        self.language_stream = torch.cuda.Stream(device, priority=LOWEST_PRIORITY) if self.enabled else None
        self.device = device
        self.settle()

    def settle(self) -> None:
        """Wait for the work queued on the device so far (a new pool's zero fill, uploaded weights): neither stream
        waits for it by itself. Nothing on a CPU."""
        if self.enabled:
            torch.cuda.synchronize(self.device)

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
class Prefilled:
    """Frames whose prefixes a VLM stage wrote: one slot per frame, still allocated."""

    slots: list[int]
    num_valid: list[int]  # valid prefix tokens per frame
    first_hidden: list[Tensor | None]  # each narrating frame's last prefix token's last-layer output [W], on the device


@dataclass
class ActOutput(Prefilled):
    actions: Tensor  # [frames, horizon, action_dim], model space, possibly still in flight on the device
    seconds: float  # launch time on a GPU, compute time on a CPU


class ModelRunner:
    """One model and its pool: `language_slots` for requests, `frame_slots` (default `max_batch`) for frames
    between their prefill and the end of their denoising, and padding slots.

    `act` runs both stages of a batch in one call. With `stage_split` the two stages also run apart, as a lockstep
    or a disaggregated device runs them (possibly side by side on two stage workers, `stage_workers`):
    `prefill_stage` writes a batch's prefixes into slots that stay allocated, `denoise_stage` denoises a batch of
    such slots (any grouping, padded to a bucket). Its padding rows read slots of their own, prefilled once with
    zero-filled inputs, so a VLM batch and an action batch of the same model never touch each other's padding.
    `rtc`: real-time chunking's settings, for frames that bring their previous chunk (`act`'s and `denoise_stage`'s
    `committed`); without it such frames are refused (ValueError)."""

    def __init__(self, model, language_slots: int, max_new_tokens: int, max_batch: int = 1, num_steps: int | None = None,
                 frame_slots: int | None = None, stage_split: bool = False, rtc: RtcConfig | None = None):
        if language_slots < 0:
            raise ValueError("language_slots must be >= 0")
        frame_slots = max_batch if frame_slots is None else frame_slots
        if frame_slots < max_batch:
            raise ValueError(f"frame_slots ({frame_slots}) must hold a batch of max_batch ({max_batch})")
        self.model = model
        self.max_batch = max_batch
        self.num_steps = num_steps
        self.language_slots = language_slots
        self.frame_slots = frame_slots
        self._guided = GuidedSampler(rtc) if rtc is not None else None
        padding = max(bucket_for(n, max_batch) - n for n in range(1, max_batch + 1))
        action_padding = max_batch if stage_split else 0
        self.pool = KVPool(model.config, language_slots + frame_slots + padding + action_padding, max_new_tokens,
                           model.dtype, model.device)
        self._pad_slots = [self.pool.allocate("padding") for _ in range(padding)]
        self._action_pad_slots = [self.pool.allocate("action padding") for _ in range(action_padding)]
        if action_padding:
            zeros = zero_inputs(model.config, action_padding, model.device, model.dtype)
            model.prefill(zeros, self.pool.cache, torch.tensor(self._action_pad_slots))

    @property
    def eos_id(self) -> int:
        return self.model.config.eos_id

    @property
    def config(self):
        return self.model.config

    # ---- the two stages -----------------------------------------------------------------------------------------

    def _allocate(self, count: int) -> list[int]:
        slots = [self.pool.allocate("frame") for _ in range(count)]
        if None in slots:
            self.free([s for s in slots if s is not None])
            raise RuntimeError(f"no KV slot left for frames: all {self.frame_slots} frame slots hold frames "
                               "between their two stages")
        return slots

    def _prefill(self, inputs: list[ModelInputs | None], bucket: int, slot_ids: list[int],
                 narrate: list[bool]) -> tuple[list[int], list[Tensor | None]]:
        """Prefill `inputs` (None: a zero-filled row) padded to `bucket` with zero-filled rows into `slot_ids`."""
        device, dtype = self.model.device, self.model.dtype
        pad = bucket - len(inputs)
        rows = [i.to(device, dtype) if i is not None else zero_inputs(self.model.config, 1, device, dtype)
                for i in inputs]
        if pad:
            rows.append(zero_inputs(self.model.config, pad, device, dtype))
        prefill = self.model.prefill(concat_inputs(rows) if len(rows) > 1 else rows[0], self.pool.cache,
                                     torch.tensor(slot_ids), want_hidden=any(narrate))
        # read back before denoising: on a GPU this waits for the prefill, not for the chunk too
        num_valid = prefill.num_valid[: len(inputs)].tolist()
        if 0 in num_valid:  # checked here, on the values read back anyway: the model's prefill reads nothing back
            raise ValueError("every prefix needs at least one valid token")
        return num_valid, [prefill.hidden[i] if n else None for i, n in enumerate(narrate)]

    @property
    def rtc_fallbacks(self) -> dict[str, int]:
        """Frames that brought a previous chunk the guided sampler could not use, by kind (`model/rtc.py`)."""
        return dict(self._guided.fallbacks) if self._guided is not None else {}

    def _check_committed(self, committed: list[Committed | None] | None, frames: int) -> None:
        if committed is None:
            return
        if len(committed) != frames:
            raise ValueError(f"{len(committed)} previous chunks for {frames} frames")
        if self._guided is None and any(c is not None for c in committed):
            raise ValueError("frames bring previous chunks but this runner has no real-time chunking settings (rtc)")

    def _denoise(self, slot_ids: list[int], noises: list[Tensor], committed: list[Committed | None] | None = None
                 ) -> Tensor:
        """`noises`: one [1, horizon, action_dim] per real row; the padding rows after them start from zeros.
        `committed`: each real row's previous chunk or None (checked by `_check_committed`)."""
        cfg, device = self.model.config, self.model.device
        pad = len(slot_ids) - len(noises)
        rows = [n.to(device) for n in noises]  # and the padding made there too, not on the host
        noise = torch.cat(rows + [torch.zeros(pad, cfg.action_horizon, cfg.action_dim, device=device)] if pad else rows)
        slots = torch.tensor(slot_ids)
        if committed is not None and any(c is not None for c in committed):
            actions = self._guided.sample(self.model, self.pool.cache, slots, noise, list(committed) + [None] * pad,
                                          self.num_steps)
        else:
            actions = self.model.sample_actions(self.pool.cache, slots, noise, self.num_steps)
        return actions[: len(noises)]

    def act(self, inputs: list[ModelInputs], noises: list[Tensor], bucket: int, narrate: list[bool],
            denoise_window: Callable[[], AbstractContextManager] | None = None,
            committed: list[Committed | None] | None = None) -> ActOutput:
        """Prefill + denoise the frames together; their slots stay allocated (the caller hands them over or frees
        them). The denoising runs inside `denoise_window()` when given (the runtime lets decode steps run beside
        it there). `committed`: each frame's previous chunk and delay for real-time chunking, or None. Raises
        after giving the slots back if the model fails."""
        self._check_committed(committed, len(inputs))
        start = time.perf_counter()
        slots = self._allocate(len(inputs))
        slot_ids = slots + self._pad_slots[: bucket - len(inputs)]
        try:
            num_valid, first = self._prefill(inputs, bucket, slot_ids, narrate)
            with denoise_window() if denoise_window is not None else nullcontext():
                actions = self._denoise(slot_ids, [n.float() for n in noises], committed)
        except Exception:
            self.free(slots)
            raise
        return ActOutput(slots, num_valid, first, actions, time.perf_counter() - start)

    def prefill_stage(self, inputs: list[ModelInputs | None], bucket: int, narrate: list[bool] | None = None
                      ) -> Prefilled:
        """The VLM stage of a batch: each frame's prefix into a fresh slot that stays allocated for its action
        stage (None: a zero-filled placeholder row). Raises after giving the slots back if the model fails."""
        if len(inputs) > bucket or bucket > self.max_batch:
            raise ValueError(f"a batch of {len(inputs)} in bucket {bucket} exceeds max_batch {self.max_batch}")
        narrate = narrate or [False] * len(inputs)
        slots = self._allocate(len(inputs))
        try:
            num_valid, first = self._prefill(inputs, bucket, slots + self._pad_slots[: bucket - len(inputs)], narrate)
        except Exception:
            self.free(slots)
            raise
        return Prefilled(slots, num_valid, first)

    def denoise_stage(self, slots: list[int], noises: list[Tensor], bucket: int,
                      committed: list[Committed | None] | None = None) -> Tensor:
        """The action stage of a batch whose prefixes are in `slots` (read in place, left allocated), padded to
        `bucket` with rows of the action padding slots: [frames, horizon, action_dim], model space. `committed`:
        as `act`'s."""
        if len(slots) > bucket or bucket > len(self._action_pad_slots):
            raise ValueError(f"a batch of {len(slots)} in bucket {bucket} needs a runner built with stage_split "
                             f"and max_batch >= {bucket}")
        if len(noises) != len(slots):
            raise ValueError("one noise per slot")
        self._check_committed(committed, len(slots))
        return self._denoise(slots + self._action_pad_slots[: bucket - len(slots)], [n.float() for n in noises],
                             committed)

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

    # ---- CUDA graphs ------------------------------------------------------------------------------------------

    def capture_graphs(self) -> int:
        """Capture now every CUDA graph this runner's calls can replay, so none is captured mid-run (a capture
        synchronizes the device and may free cached memory while the other path's work runs): the prefill with and
        without the last token's output and the denoising loop for each graph bucket a batch of 1..max_batch
        falls in, and the decode step for each bucket of 1..language_slots requests. Runs on scratch slots of the
        free pool (a later prefill overwrites what they hold) and gives them back. Returns how many graphs were
        captured; 0 for a model without graphs (a CPU) or with per-stream graphs (the fleet's stage workers, which
        its profile runs at every share before serving)."""
        graphs = self.model._graphs
        if graphs is None or not hasattr(graphs, "bucket"):
            return 0
        before = graphs.captures
        cfg, device = self.model.config, self.model.device

        def largest_rows(limit: int) -> list[int]:
            """For each graph bucket that batches of 1..limit rows use, the largest such batch."""
            rows: dict[int, int] = {}
            for n in range(1, limit + 1):
                bucket = graphs.bucket(n)
                if bucket is not None:
                    rows[bucket] = n
            return sorted(rows.values())

        for n in largest_rows(self.max_batch):
            slots = self._allocate(n)
            try:
                zeros = zero_inputs(cfg, n, device, self.model.dtype)
                for want_hidden in (False, True):
                    self.model.prefill(zeros, self.pool.cache, torch.tensor(slots), want_hidden=want_hidden)
                noise = torch.zeros(n, cfg.action_horizon, cfg.action_dim, device=device)
                self.model.sample_actions(self.pool.cache, torch.tensor(slots), noise, self.num_steps)
            finally:
                self.free(slots)
        room = self.pool.cache.max_len > cfg.prefix_len  # a decode step writes after the prefix
        for n in largest_rows(self.language_slots if room else 0):
            slots = [self.pool.allocate("graph capture") for _ in range(n)]
            try:
                if None in slots:
                    raise RuntimeError(f"no {n} free slots to capture the decode graphs with")
                at = torch.full((n,), cfg.prefix_len)
                self.model.decode_step(self.pool.cache, torch.tensor(slots), torch.zeros(n, dtype=torch.long), at,
                                       torch.zeros(n, dtype=torch.long))
            finally:
                self.free([s for s in slots if s is not None])
        return graphs.captures - before

    def hand_over(self, slot: int, request: LanguageRequest) -> None:
        self.pool.transfer(slot, f"request {request.request_id}")

    @property
    def slots_in_use(self) -> int:
        """Slots held by frames and requests (padding slots not counted)."""
        return self.pool.slots_used - len(self._pad_slots) - len(self._action_pad_slots)
