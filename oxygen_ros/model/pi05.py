"""The pi0.5 Mixture-of-Transformers network, split into the three calls OxyGen schedules separately.

- `prefill`: images + prompt through the VLM backbone once per frame; every layer's K/V goes into a cache slot.
- `sample_actions`: the action expert denoises an action chunk against that slot's prefix K/V (read only).
- `decode_step`: the backbone generates text one token per request, appending to the request's own slot.

This module is the network: its weights, the embeddings and its passes over the cache (the prefix, one action
expert pass `_velocity`, one decode step's layers `_decode_layers`). What generates with them are plain functions
in modules of their own, which the methods of the same names call: the flow-matching sampler (`model/actions.py`)
and text decoding with its token choice (`model/decode.py`) on its back ends (eager layers, the CPU's
`model/cpu_decode.py`, CUDA graphs' `model/cuda_graphs.py`).

Every layer of the original model is one joint attention over [prefix ; actions] with Q/K/V from each token's own
expert. Because the prefix never attends to the actions (prefix-LM mask), the prefix half does not depend on the
actions at all, so computing it once and caching its K/V gives exactly the joint model's result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import actions, cpu_kernel, decode
from .config import Pi05Config
from .cpu_decode import CpuDecode
from .gemma import (
    GemmaStack,
    attend,
    attend_one_query,
    attend_prefix_and_self,
    rope_cos_sin,
)
from .inputs import ModelInputs
from .kv_cache import DecodeIndex, KVCache, read_slots, slot_index
from .sampling import Sampler
from .vision import VisionEncoder


@dataclass
class PrefillResult:
    """num_valid [B] long: valid prefix tokens per sample, which is also the first free RoPE position.
    logits [B, vocab] float32 of the last valid prefix token when asked for, else None.
    hidden [B, W] that token's last-layer output (before the final norm, in the model's dtype, on its device) when
    asked for, else None: `next_tokens` chooses the first token from it later, anywhere."""

    num_valid: Tensor
    logits: Tensor | None
    hidden: Tensor | None = None


def time_embedding(t: Tensor, width: int, min_period: float, max_period: float) -> Tensor:
    """Sin-cos embedding of flow-matching times t [B] -> [B, width], periods spaced geometrically."""
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = t.to(torch.float64)[:, None] * (2.0 * math.pi / period)[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


class Pi05Model(nn.Module):
    """SigLIP + Gemma backbone (prefix) and a time-conditioned Gemma action expert (suffix)."""

    def __init__(self, config: Pi05Config):
        super().__init__()
        self.config = config
        width = config.expert.width
        self.vision = VisionEncoder(config.vision, config.backbone.width)
        self.backbone = GemmaStack(config.backbone, vocab_size=config.vocab_size)
        self.expert = GemmaStack(config.expert, cond_dim=width)
        self.action_in_proj = nn.Linear(config.action_dim, width)
        self.action_out_proj = nn.Linear(width, config.action_dim)
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)
        self._graphs = None  # CudaGraphs once `use_cuda_graphs` is called
        self._cpu = CpuDecode()  # what decode steps on the CPU keep between steps; the kernel's once it is on

    @property
    def dtype(self) -> torch.dtype:
        return self.action_in_proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.action_in_proj.weight.device

    def compile_steps(self) -> Pi05Model:
        """Opt in to `torch.compile` (inductor; on a CPU it needs a C++ compiler) for the two hot loops: one
        denoise step of the action expert and the backbone layers of a decode step. The first calls compile (tens
        of seconds on a CPU, again for each new batch size); outputs match the eager model to floating-point
        rounding. Returns the model."""
        self._velocity = torch.compile(self._velocity)
        self._decode_hidden = torch.compile(self._decode_hidden)
        return self

    def use_cpu_kernel(self) -> Pi05Model:
        """Opt in (a float32 or bfloat16 model on the CPU) to running a decode step's backbone layers as one
        compiled call (`model/cpu_kernel.py`) instead of hundreds of tensor operators; a greedy step's text head and
        token choice as one more (no logits; `cpu_kernel.head_greedy_pays` says which steps), else torch's head and
        the greedy choice as one pass per row. A float32 model on a CPU with matrix tiles or AVX-512 BF16 also keeps
        a bfloat16 copy of its text head to screen it with (made here; half the head's memory). The first call in a
        process builds or loads the kernel: `CpuKernelUnavailable` where it cannot be built (no C++ compiler),
        ValueError for a model it does not run. Outputs match the eager model to floating-point rounding. Returns
        the model."""
        cpu_kernel.check_supported(self)
        cpu_kernel.load()
        self._cpu = CpuDecode(kernel=True)  # a state of its own: a shallow copy of the model keeps the one it had
        self._cpu.head_copy(self.backbone.text_head, self.dtype)  # now rather than in the first greedy step
        return self

    @property
    def uses_cpu_kernel(self) -> bool:
        return self._cpu.kernel

    def memory_bytes(self) -> int:
        """Bytes the model holds: its parameters and, where it keeps one, its text head's screening copy."""
        return sum(p.numel() * p.element_size() for p in self.parameters()) + self._cpu.kept_bytes()

    def use_cuda_graphs(self, buckets: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), per_stream: bool = False
                        ) -> Pi05Model:
        """Opt in (a model on a CUDA device only) to replaying CUDA graphs of the prefill (without logits), the
        decode step and the denoising loop, one per batch bucket, captured on the first call of each bucket (`model/cuda_graphs.py`). Call it
        after the model is on its device. Batches larger than the largest bucket run eagerly. `per_stream`: graphs
        of their own for each stream the calls are issued on, captured there (SM partitions). Returns the model."""
        from .cuda_graphs import CudaGraphs, StreamGraphs

        self._graphs = StreamGraphs(self, buckets) if per_stream else CudaGraphs(self, buckets)
        return self

    # ---- embeddings -------------------------------------------------------------------------------------------

    def check_prefix(self, batch: ModelInputs) -> None:
        """Refuses a batch whose camera count or token length is not the model's (shapes only: no host read)."""
        n_cams = batch.image_masks.shape[1]
        if n_cams != self.config.num_cameras or batch.tokens.shape[1] != self.config.max_token_len:
            raise ValueError(
                f"expected {self.config.num_cameras} cameras and {self.config.max_token_len} tokens, "
                f"got {n_cams} and {batch.tokens.shape[1]}"
            )

    def embed_prefix(self, batch: ModelInputs) -> tuple[Tensor, Tensor]:
        """Prefix embeddings [B, prefix_len, W] and validity [B, prefix_len]: camera tokens, then prompt tokens."""
        self.check_prefix(batch)
        b, n_cams = batch.image_masks.shape
        per_image = self.config.tokens_per_image
        images = self.vision(batch.images.flatten(0, 1).to(self.dtype))
        images = images.reshape(b, n_cams * per_image, -1)
        image_valid = batch.image_masks.repeat_interleave(per_image, dim=1)
        text = self.backbone.embed(batch.tokens)
        return torch.cat([images, text], dim=1), torch.cat([image_valid, batch.token_masks.bool()], dim=1)

    def time_condition(self, t: Tensor) -> Tensor:
        """The adaRMS condition for times t [B]: sin-cos embedding -> MLP with swish after both layers."""
        cfg = self.config
        emb = time_embedding(t, cfg.expert.width, cfg.time_min_period, cfg.time_max_period).to(self.dtype)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))

    # ---- prefill ----------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(
        self, batch: ModelInputs, cache: KVCache, slots: Tensor, want_logits: bool = False, want_hidden: bool = False
    ) -> PrefillResult:
        """Run the prefix through the backbone, writing every layer's K/V into `cache[:, slots, :, :prefix_len]`.

        The slot's room after the prefix is marked invalid, so a reused slot forgets the previous frame's text.
        `want_logits` / `want_hidden`: also the last valid token's next-token logits / last-layer output (the
        latter without running the text head: the engine chooses the first token off the control path).
        Nothing is read back to the host (on a GPU that would wait for the vision tower before the layers could
        be launched): a prefix without a valid token gets `num_valid` 0 and outputs that mean nothing, and callers
        that read the valid lengths refuse it (the engine's model runner does).
        """
        idx = slot_index(slots, cache.num_slots)
        self.check_prefix(batch)
        if len(slots) != batch.images.shape[0]:
            raise ValueError(f"{len(slots)} slots for a batch of {batch.images.shape[0]}")
        if self._graphs is not None and not want_logits:
            replayed = self._graphs.prefill(cache, slots, batch, want_hidden)
            if replayed is not None:
                return replayed
        return self._prefill_layers(batch, cache, idx, want_logits, want_hidden)

    def _prefill_layers(self, batch: ModelInputs, cache: KVCache, idx: slice | Tensor, want_logits: bool,
                        want_hidden: bool) -> PrefillResult:
        """`prefill` after its checks: device work only (no host read, no host tensor), so a CUDA graph captures it
        with `idx` a tensor of slot indices on the device."""
        cfg = self.config
        length = cfg.prefix_len
        x, valid = self.embed_prefix(batch)
        positions = valid.long().cumsum(dim=1) - 1
        cos, sin = rope_cos_sin(positions, cfg.backbone.head_dim, cfg.rope_theta, x.dtype)
        # Bidirectional among valid tokens. Padding rows also see themselves so no softmax row is empty;
        # no valid token ever reads a padding key, so this does not change any real output.
        eye = torch.eye(length, dtype=torch.bool, device=x.device)
        mask = ((valid[:, None, :] & valid[:, :, None]) | eye)[:, None]
        last = length - 1 - valid.flip(1).long().argmax(dim=1)  # index of the last valid token
        rows = torch.arange(x.shape[0], device=x.device)

        layers = self.backbone.layers
        for i, layer in enumerate(layers):
            q, k, v, gate = layer.project_qkv(x, None, cos, sin)
            cache.k[i, idx, :, :length] = k.to(cache.dtype)
            cache.v[i, idx, :, :length] = v.to(cache.dtype)
            if i == len(layers) - 1:
                # The cache is complete; the last layer's outputs matter only for the next token.
                if not (want_logits or want_hidden):
                    break
                q, x, mask = (
                    q[rows, :, last][:, :, None],
                    x[rows, last][:, None],
                    mask[rows, :, last][:, :, None],
                )
            x = layer.finish(x, attend(q, k, v, mask), gate, None)

        cache.valid[idx, :length] = valid
        # a device scalar: a Python False would be copied from the host, which a CUDA graph cannot capture
        cache.valid[idx, length:] = torch.zeros((), dtype=torch.bool, device=cache.device)
        logits = self.backbone.logits(x[:, -1]).float() if want_logits else None
        return PrefillResult(num_valid=valid.sum(dim=1), logits=logits, hidden=x[:, -1] if want_hidden else None)

    # ---- the generation calls (`model/actions.py`, `model/decode.py`) ----------------------------------------

    def sample_actions(self, cache: KVCache, slots: Tensor, noise: Tensor, num_steps: int | None = None) -> Tensor:
        """`actions.sample_actions`: an action chunk [B, horizon, action_dim] float32 from `noise`."""
        return actions.sample_actions(self, cache, slots, noise, num_steps)

    def decode_step(self, cache: KVCache, slots: Tensor, tokens: Tensor, cache_index: Tensor, positions: Tensor
                    ) -> Tensor:
        """`decode.decode_step`: one fed token per request -> next-token logits [B, vocab] float32."""
        return decode.decode_step(self, cache, slots, tokens, cache_index, positions)

    def decode_next(self, cache: KVCache, slots: Tensor, tokens: Tensor, cache_index: Tensor, positions: Tensor,
                    samplers: Sequence[Sampler | None] | None = None) -> Tensor:
        """`decode.decode_next`: `decode_step` returning the chosen next tokens [B]."""
        return decode.decode_next(self, cache, slots, tokens, cache_index, positions, samplers)

    def decode_tokens(self, cache: KVCache, index: DecodeIndex, tokens: Tensor,
                      samplers: Sequence[Sampler | None] | None = None, first: Tensor | None = None) -> Tensor:
        """`decode.decode_tokens`: one decode step of the batch `index` -> the chosen next tokens."""
        return decode.decode_tokens(self, cache, index, tokens, samplers, first)

    def next_tokens(self, hidden: Tensor, samplers: Sequence[Sampler | None] | None = None) -> Tensor:
        """`decode.next_tokens`: the next tokens chosen from last-layer outputs hidden [B, W]."""
        return decode.next_tokens(self, hidden, samplers)

    # ---- the network's passes over the cache -----------------------------------------------------------------

    def _velocity(
        self, x: Tensor, cond: Tensor, prefix_k: Tensor, prefix_v: Tensor, bias: Tensor, cos: Tensor, sin: Tensor
    ) -> Tensor:
        """One expert forward pass: noisy actions [B, H, A] -> velocity [B, H, A] float32.

        prefix_k/v [depth, B, KV, P, D] (views of the cache when possible); bias masks the prefix's padding.
        """
        h = self.action_in_proj(x.to(self.dtype))
        for i, layer in enumerate(self.expert.layers):
            q, k, v, gate = layer.project_qkv(h, cond, cos, sin)
            attn = attend_prefix_and_self(q, prefix_k[i], prefix_v[i], bias, k, v)
            h = layer.finish(h, attn, gate, cond)
        h, _ = self.expert.norm(h, cond)
        return self.action_out_proj(h).float()

    def _decode_hidden(self, cache: KVCache, index: DecodeIndex, tokens: Tensor) -> Tensor:
        """The backbone's last-layer hidden states [B, W] for one fed token per request (see `decode_step`)."""
        return self._decode_layers(cache, index.idx, index.slots, tokens.to(self.device), index.cache_index,
                                   index.positions, index.span)

    def _decode_layers(
        self, cache: KVCache, idx: slice | Tensor, slots: Tensor, tokens: Tensor, cache_index: Tensor,
        positions: Tensor, span: int
    ) -> Tensor:
        """`_decode_hidden` after its checks: device work only (no host sync, no host tensor), attending over the
        first `span` positions of the slots `idx`; a CUDA graph captures it with span = the cache's length."""
        cfg = self.config
        cache.valid.index_put_((slots, cache_index), torch.ones((), dtype=torch.bool, device=cache.device))
        causal = torch.arange(span, device=cache.device)[None, :] <= cache_index[:, None]
        valid = cache.valid[idx, :span] if isinstance(idx, slice) else cache.valid[:, :span].index_select(0, idx)
        x = self.backbone.embed(tokens[:, None])
        # additive (0 / -inf) and built once for the step: the attention kernel would turn a boolean mask into
        # this in every layer
        masked = (valid & causal)[:, None, None, :].logical_not()
        mask = torch.zeros(masked.shape, dtype=x.dtype, device=x.device).masked_fill_(masked, float("-inf"))
        cos, sin = rope_cos_sin(positions[:, None], cfg.backbone.head_dim, cfg.rope_theta, x.dtype)
        for i, layer in enumerate(self.backbone.layers):
            q, k, v, gate = layer.project_qkv(x, None, cos, sin)
            cache.k[i, slots, :, cache_index] = k[:, :, 0].to(cache.dtype)
            cache.v[i, slots, :, cache_index] = v[:, :, 0].to(cache.dtype)
            keys = read_slots(cache.k[i], idx, span).to(x.dtype)
            values = read_slots(cache.v[i], idx, span).to(x.dtype)
            x = layer.finish(x, attend_one_query(q, keys, values, mask), gate, None)
        return x[:, 0]


def build_model(
    config: Pi05Config,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Pi05Model:
    """A randomly initialised model; the same seed gives the same weights whatever the target device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Pi05Model(config)
    return model.to(device=device, dtype=dtype).eval()


def parameter_counts(model: Pi05Model) -> dict[str, int]:
    """Parameters per part; works on a model built on the `meta` device (no memory is allocated)."""
    parts = {
        "vision": model.vision,
        "backbone": model.backbone,
        "expert": model.expert,
        "action_heads": nn.ModuleList(
            [model.action_in_proj, model.action_out_proj, model.time_mlp_in, model.time_mlp_out]
        ),
    }
    counts = {name: sum(p.numel() for p in part.parameters()) for name, part in parts.items()}
    counts["total"] = sum(counts.values())
    return counts
