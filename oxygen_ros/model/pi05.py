"""The pi0.5 Mixture-of-Transformers, split into the three calls OxyGen schedules separately.

- `prefill`: images + prompt through the VLM backbone once per frame; every layer's K/V goes into a cache slot.
- `sample_actions`: the action expert denoises an action chunk against that slot's prefix K/V (read only).
- `decode_step`: the backbone generates text one token per request, appending to the request's own slot.

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

from . import cpu_kernel
from .config import Pi05Config
from .gemma import (
    GemmaStack,
    attend,
    attend_one_query,
    attend_prefix_and_self,
    prefix_attention_bias,
    rope_cos_sin,
)
from .inputs import ModelInputs
from .kv_cache import DecodeIndex, KVCache, read_slots, slot_index
from .sampling import NONFINITE_TOKEN, Sampler, greedy_tokens, sample_token
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
        self._cpu_kernel = False  # True once `use_cpu_kernel` is called
        self._logits_buffer: Tensor | None = None  # a CPU decode step's [rows, vocab] logits, reused step after step
        # the CPU kernel's step: its RoPE tables (cos, sin) and the weights it reads (`StepWeights`)
        self._rope_tables: tuple[Tensor, Tensor] | None = None
        self._step_weights: cpu_kernel.StepWeights | None = None
        # `_head_copy`: (the head it was made of, that head's storage, version and shape, the copy), one attribute
        # so that a reader on another thread sees a copy only with the head it belongs to
        self._head_copy_made: tuple[Tensor, tuple, cpu_kernel.HeadCopy] | None = None
        self._head_norm: tuple[tuple, float] | None = None  # (the head's identity, its largest row norm)

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
        self._cpu_kernel = True
        self._head_copy(self.backbone.text_head)  # now rather than in the first greedy step
        return self

    @property
    def uses_cpu_kernel(self) -> bool:
        return self._cpu_kernel

    def memory_bytes(self) -> int:
        """Bytes the model holds: its parameters and, where it keeps one, its text head's screening copy."""
        params = sum(p.numel() * p.element_size() for p in self.parameters())
        made = self._head_copy_made
        kept = 0 if made is None else sum(t.numel() * t.element_size() for t in (made[2].bf16, made[2].norms))
        return params + kept

    def use_cuda_graphs(self, buckets: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), per_stream: bool = False
                        ) -> Pi05Model:
        """Opt in (a model on a CUDA device only) to replaying CUDA graphs of the decode step and of the denoising
        loop, one per batch bucket, captured on the first call of each bucket (`model/cuda_graphs.py`). Call it
        after the model is on its device. Batches larger than the largest bucket run eagerly. `per_stream`: graphs
        of their own for each stream the calls are issued on, captured there (SM partitions). Returns the model."""
        from .cuda_graphs import CudaGraphs, StreamGraphs

        self._graphs = StreamGraphs(self, buckets) if per_stream else CudaGraphs(self, buckets)
        return self

    # ---- embeddings -------------------------------------------------------------------------------------------

    def embed_prefix(self, batch: ModelInputs) -> tuple[Tensor, Tensor]:
        """Prefix embeddings [B, prefix_len, W] and validity [B, prefix_len]: camera tokens, then prompt tokens."""
        b, n_cams = batch.image_masks.shape
        if n_cams != self.config.num_cameras or batch.tokens.shape[1] != self.config.max_token_len:
            raise ValueError(
                f"expected {self.config.num_cameras} cameras and {self.config.max_token_len} tokens, "
                f"got {n_cams} and {batch.tokens.shape[1]}"
            )
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
        cfg = self.config
        length = cfg.prefix_len
        idx = slot_index(slots, cache.num_slots)
        x, valid = self.embed_prefix(batch)
        if len(slots) != x.shape[0]:
            raise ValueError(f"{len(slots)} slots for a batch of {x.shape[0]}")
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
        cache.valid[idx, length:] = False
        logits = self.backbone.logits(x[:, -1]).float() if want_logits else None
        return PrefillResult(num_valid=valid.sum(dim=1), logits=logits, hidden=x[:, -1] if want_hidden else None)

    # ---- actions ----------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def sample_actions(
        self, cache: KVCache, slots: Tensor, noise: Tensor, num_steps: int | None = None
    ) -> Tensor:
        """Euler-integrate the flow from noise (t=1) to actions (t=0): [B, horizon, action_dim] float32.

        Reads each slot's prefix K/V in place and never writes the cache: for one slot or a contiguous range of
        slots the expert attends to views of the cache (zero copy); other slot sets are gathered once per call.
        """
        cfg = self.config
        steps = cfg.num_steps if num_steps is None else num_steps
        if steps < 1:
            raise ValueError("num_steps must be at least 1")
        expected = (len(slots), cfg.action_horizon, cfg.action_dim)
        if tuple(noise.shape) != expected:
            raise ValueError(f"noise must have shape {expected}, got {tuple(noise.shape)}")
        length, horizon = cfg.prefix_len, cfg.action_horizon
        idx = slot_index(slots, cache.num_slots)

        # Actions see the valid prefix and each other; the prefix rows are not computed at all.
        prefix_valid = cache.valid[idx, :length]
        num_valid = prefix_valid.sum(dim=1)
        prefix_k = cache.k[:, idx, :, :length]
        prefix_v = cache.v[:, idx, :, :length]
        if prefix_k.dtype != self.dtype:  # a cache kept in another precision than the weights
            prefix_k, prefix_v = prefix_k.to(self.dtype), prefix_v.to(self.dtype)
        positions = num_valid[:, None].to(self.device) + torch.arange(horizon, device=self.device)
        cos, sin = rope_cos_sin(positions, cfg.expert.head_dim, cfg.rope_theta, self.dtype)
        group = cfg.expert.num_heads // cfg.expert.num_kv_heads
        bias = prefix_attention_bias(prefix_valid.to(self.device), group, horizon, self.dtype)

        times = 1.0 + (-1.0 / steps) * torch.arange(steps, device=self.device, dtype=torch.float64)
        conds = self.time_condition(times)  # [steps, W], same time for every sample
        x = noise.to(self.device, torch.float32)
        if self._graphs is not None:
            graphed = self._graphs.denoise(x, conds, prefix_k, prefix_v, bias, cos, sin)
            if graphed is not None:
                return graphed
        return self._denoise(x, conds, prefix_k, prefix_v, bias, cos, sin)

    def _denoise(
        self, x: Tensor, conds: Tensor, prefix_k: Tensor, prefix_v: Tensor, bias: Tensor, cos: Tensor, sin: Tensor
    ) -> Tensor:
        """Euler steps from noise x [B, H, A] float32, one per row of conds [steps, W]: device work only."""
        dt = -1.0 / conds.shape[0]
        for step in range(conds.shape[0]):
            cond = conds[step].expand(x.shape[0], -1)
            velocity = self._velocity(x, cond, prefix_k, prefix_v, bias, cos, sin)
            x = x + dt * velocity
        return x

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

    # ---- text ---------------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def decode_step(
        self, cache: KVCache, slots: Tensor, tokens: Tensor, cache_index: Tensor, positions: Tensor
    ) -> Tensor:
        """Feed one token per request; returns next-token logits [B, vocab] float32.

        Request b's token is written at `cache_index[b]` of slot `slots[b]` (marked valid) with RoPE position
        `positions[b]`, and attends to the valid positions of its own slot up to and including that index.
        Requests may sit at different lengths.
        """
        logits, reused = self._decode_logits(cache, DecodeIndex(cache, slots, cache_index, positions), tokens)
        return logits.to(torch.float32, copy=reused)  # the caller keeps these: never memory the model reuses

    @torch.inference_mode()
    def decode_next(
        self,
        cache: KVCache,
        slots: Tensor,
        tokens: Tensor,
        cache_index: Tensor,
        positions: Tensor,
        samplers: Sequence[Sampler | None] | None = None,
    ) -> Tensor:
        """`decode_step` that returns the chosen next tokens [B] long instead of the logits (`decode_tokens`)."""
        return self.decode_tokens(cache, DecodeIndex(cache, slots, cache_index, positions), tokens, samplers)

    @torch.inference_mode()
    def decode_tokens(
        self, cache: KVCache, index: DecodeIndex, tokens: Tensor, samplers: Sequence[Sampler | None] | None = None,
        first: Tensor | None = None,
    ) -> Tensor:
        """One decode step of the batch `index` (built for `cache`) feeding `tokens` [B]; returns the chosen next
        tokens [B] long, on the model's device, as `next_tokens` chooses them. A caller that keeps the batch
        advances `index` in place and feeds back what this returned: the next step copies nothing from the host.

        `first` [N, W]: prefixes' last-layer outputs (`PrefillResult.hidden`) whose first tokens are chosen in the
        same pass over the text head; their tokens follow the batch's ([B + N] in all, `samplers` alike).
        """
        rows = len(index) + (0 if first is None else len(first))
        if samplers is not None and len(samplers) != rows:
            raise ValueError(f"{len(samplers)} samplers for {rows} requests")
        self._check_tokens(index, tokens)
        logits = self._graph_logits(cache, index, tokens)
        if logits is not None:
            if first is not None:
                logits = torch.cat([logits, self.backbone.logits(first.to(logits.dtype))])
            bad = ~torch.isfinite(logits).all(dim=-1)  # on the device, one pass
            return self._unless_nonfinite(self._choose(logits, samplers, skip=bad), bad)
        if self._cpu_kernel:  # the kernel's step ends with the final norm: the prefixes' rows are normed apart
            h = self._kernel_normed(cache, index, tokens)
            if first is not None:
                h = torch.cat([h, self.backbone.norm(first.to(h.dtype))[0]])
            return self._tokens_of_normed(h, samplers)
        hidden = self._decode_hidden(cache, index, tokens)
        if first is not None:
            hidden = torch.cat([hidden, first.to(hidden.dtype)])
        return self._next_tokens(hidden, samplers)

    @torch.inference_mode()
    def next_tokens(self, hidden: Tensor, samplers: Sequence[Sampler | None] | None = None) -> Tensor:
        """The next tokens [B] long chosen from last-layer outputs hidden [B, W] (before the final norm): row b
        takes the first maximum of its logits, or with `samplers[b]` a sample from that request's own stream;
        either way exactly what the float32 logits give. The logits stay in the model's dtype and only sampled
        rows are converted, so no [B, vocab] float32 copy is made; a greedy batch on the CPU kernel makes no
        logits at all where `cpu_kernel.head_greedy_pays`."""
        if samplers is not None and len(samplers) != len(hidden):
            raise ValueError(f"{len(samplers)} samplers for {len(hidden)} requests")
        return self._next_tokens(hidden, samplers)

    def _next_tokens(self, hidden: Tensor, samplers: Sequence[Sampler | None] | None) -> Tensor:
        return self._tokens_of_normed(self.backbone.norm(hidden)[0], samplers)

    def _tokens_of_normed(self, h: Tensor, samplers: Sequence[Sampler | None] | None) -> Tensor:
        """`_next_tokens` of the final norm's outputs h [B, W]."""
        if h.device.type != "cpu":  # the logits are made anyway: checked on the device, nothing read back
            logits = self.backbone.head_logits(h, self._logits_out(len(h)))
            bad = ~torch.isfinite(logits).all(dim=-1)
            return self._unless_nonfinite(self._choose(logits, samplers, skip=bad), bad)
        bad = self._nonfinite_rows(h)
        if self._cpu_kernel and not any(s is not None for s in samplers or ()) \
                and cpu_kernel.head_greedy_pays(self.dtype, len(h), self.config.backbone.width):
            head = self.backbone.text_head
            chosen = cpu_kernel.head_greedy(h.contiguous(), head, torch.get_num_threads(), copy=self._head_copy(head))
            return self._unless_nonfinite(chosen, bad)
        logits = self.backbone.head_logits(h, self._logits_out(len(h)))
        return self._unless_nonfinite(self._choose(logits, samplers, skip=bad), bad)

    def _choose(self, logits: Tensor, samplers: Sequence[Sampler | None] | None, skip: Tensor | None = None) -> Tensor:
        """The chosen tokens; rows in `skip` (non-finite logits) are not sampled (softmax of NaN refuses)."""
        chosen = cpu_kernel.greedy_tokens(logits) if self._cpu_kernel else greedy_tokens(logits)
        for row, sampler in enumerate(samplers or ()):
            if sampler is not None and (skip is None or not bool(skip[row])):
                chosen[row] = sample_token(logits[row], sampler)
        return chosen

    @staticmethod
    def _unless_nonfinite(chosen: Tensor, bad: Tensor | None) -> Tensor:
        """`chosen` with NONFINITE_TOKEN in each row whose logits were not all finite: a token picked from an
        overflowing text head is garbage, and the request it belongs to ends as a model error
        (`LanguageRequest.accept`). Nothing is read back to the host."""
        return chosen if bad is None else chosen.masked_fill(bad.to(chosen.device), NONFINITE_TOKEN)

    def _nonfinite_rows(self, h: Tensor) -> Tensor | None:
        """Which rows of h [B, W] (on the CPU: the bound is read back) give a non-finite logit (bool [B]; None: none),
        without the logits for the rest.

        Each logit and every partial sum of it is at most ||h_b|| max_v ||head_v|| in size (Cauchy-Schwarz): a row
        whose bound stays below half the dtype's range cannot overflow, which is every row of a healthy model and
        costs one norm per row. Only rows past it (or with a non-finite h) get their logits computed and checked."""
        limit = 0.5 * torch.finfo(self.dtype).max
        bound = torch.linalg.vector_norm(h.float(), dim=-1) * self._head_row_norm()
        risky = ~(bound < limit)  # NaN compares False: risky
        if not bool(risky.any()):
            return None
        rows = risky.nonzero()[:, 0]
        bad = torch.zeros(len(h), dtype=torch.bool, device=h.device)
        bad[rows] = ~torch.isfinite(self.backbone.head_logits(h[rows])).all(dim=-1)
        return bad

    def _head_row_norm(self) -> float:
        """The text head's largest row norm (float32, in blocks of rows: no float32 copy of a bfloat16 head), made
        again whenever the head's storage or contents change (as `_head_copy`)."""
        head = self.backbone.text_head
        state = (head.data_ptr(), None if head.is_inference() else head._version, tuple(head.shape), head.dtype)
        if self._head_norm is None or self._head_norm[0] != state:
            with torch.no_grad():
                best = max(float(torch.linalg.vector_norm(head[i:i + 8192].float(), dim=-1).max())
                           for i in range(0, len(head), 8192))
            self._head_norm = (state, best)
        return self._head_norm[1]

    def _decode_logits(self, cache: KVCache, index: DecodeIndex, tokens: Tensor) -> tuple[Tensor, bool]:
        """Next-token logits [B, vocab] in the model's dtype (a CUDA graph's replay when one serves the batch), and
        whether they lie in memory the model writes again: a graph's static output, which its next replay
        overwrites, or the CPU step's reused logits buffer."""
        self._check_tokens(index, tokens)
        logits = self._graph_logits(cache, index, tokens)
        if logits is not None:
            return logits, True
        out = self._logits_out(len(index))
        if self._cpu_kernel:
            return self.backbone.head_logits(self._kernel_normed(cache, index, tokens), out), out is not None
        return self.backbone.logits(self._decode_hidden(cache, index, tokens), out), out is not None

    def _graph_logits(self, cache: KVCache, index: DecodeIndex, tokens: Tensor) -> Tensor | None:
        """A CUDA graph's replay of the step's logits when one serves the batch, else None. The logits are the
        graph's static output, valid until its next replay: fine for a choice made on the same stream right after
        (`decode_tokens`), copied where a caller keeps them (`decode_step`)."""
        if self._graphs is None:
            return None
        return self._graphs.decode_logits(cache, index.slots, tokens, index.cache_index, index.positions)

    def _head_copy(self, head: Tensor) -> cpu_kernel.HeadCopy | None:
        """The float32 text head's bfloat16 copy and row norms that `cpu_kernel.head_greedy` screens it with on
        matrix tiles or AVX-512 BF16's pair dot products (None where it is not screened); made when the kernel is
        turned on and again whenever the head's storage or contents change (contents: by its version counter, which
        a head made under `torch.inference_mode` does not have; such a head is taken as fixed while its storage
        is)."""
        if not cpu_kernel.screens(self.dtype, head.shape[1]):
            return None
        state = (head.data_ptr(), None if head.is_inference() else head._version, tuple(head.shape))
        made = self._head_copy_made
        if made is None or made[0] is not head or made[1] != state:
            made = self._head_copy_made = (head, state, cpu_kernel.head_copy(head.detach()))
        return made[2]

    @staticmethod
    def _check_tokens(index: DecodeIndex, tokens: Tensor) -> None:
        if tuple(tokens.shape) != (len(index),):
            raise ValueError(f"tokens must have shape ({len(index)},), got {tuple(tokens.shape)}")

    def _logits_out(self, rows: int) -> Tensor | None:
        """A [rows, vocab] view of the CPU decode step's logits buffer (grown to the largest batch seen, in the model's
        dtype): a fresh [50, 257152] float32 block each step costs its page faults, 20 ms a step here
        (docs/benchmarks.md). None for one row (a matrix-vector product) and off the CPU (the CUDA allocator reuses
        its blocks)."""
        if rows == 1 or self.device.type != "cpu":
            return None
        if self._logits_buffer is None or self._logits_buffer.shape[0] < rows:
            self._logits_buffer = torch.empty(rows, self.config.vocab_size, dtype=self.dtype, device=self.device)
        return self._logits_buffer[:rows]

    def _kernel_normed(self, cache: KVCache, index: DecodeIndex, tokens: Tensor) -> Tensor:
        """The final norm's outputs [B, W] of a decode step (see `decode_step`) as one CPU kernel call: embedding,
        RoPE (tables kept for the cache's length), every layer and the final norm."""
        cfg = self.config
        tables = self._rope_tables
        if tables is None or len(tables[0]) < cache.max_len or tables[0].dtype != self.dtype:
            tables = self._rope_tables = cpu_kernel.rope_tables(cache.max_len, cfg.backbone.head_dim, cfg.rope_theta,
                                                                self.dtype)
        if self._step_weights is None:
            self._step_weights = cpu_kernel.StepWeights(self.backbone)
        return cpu_kernel.decode_step(tokens.to(self.device, torch.long).contiguous(), self._step_weights, cfg, cache,
                                      index.slots, index.cache_index, index.positions, index.span, tables)

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
