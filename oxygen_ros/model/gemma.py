"""Gemma building blocks shared by the VLM backbone and the action expert.

pi0.5 runs two Gemma stacks side by side and lets them meet only inside attention, so a layer here is split in
two halves around the attention call: `project_qkv` (norm, Q/K/V, RoPE) and `finish` (o_proj, residual, MLP).
The model in `pi05.py` decides which keys and values each half of the joint sequence attends to.

Module and parameter names follow the Hugging Face Gemma layout (`self_attn.q_proj`, `input_layernorm`, ...)
so that checkpoint loading is a prefix rename.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import GemmaConfig


class RMSNorm(nn.Module):
    """Gemma RMSNorm: the weight is stored as an offset from one, so a zero weight is the identity scale."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor, cond: Tensor | None = None) -> tuple[Tensor, None]:
        del cond  # same call shape as AdaRMSNorm; the backbone is not time-conditioned
        normed = _rms(x.float(), self.eps) * (1.0 + self.weight.float())
        return normed.to(x.dtype), None


class AdaRMSNorm(nn.Module):
    """pi0.5's adaptive RMSNorm: the flow-matching time embedding sets scale, shift and a residual gate.

    `dense` maps the condition to (scale, shift, gate); it starts at zero so an untrained expert behaves like a
    plain RMSNorm with a zero gate. The condition is one per sample [B, W] or one per token [B, tokens, W]
    (training-time real-time chunking gives the known prefix actions the time of finished actions). There is no separate weight (the checkpoint has only `dense`).
    """

    def __init__(self, dim: int, cond_dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)
        nn.init.zeros_(self.dense.weight)

    def forward(self, x: Tensor, cond: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if cond is None:
            raise ValueError("AdaRMSNorm needs the time condition")
        modulation = self.dense(cond)
        if modulation.ndim == 2:  # one condition per sample [B, W], for every token
            modulation = modulation.unsqueeze(1)
        scale, shift, gate = modulation.chunk(3, dim=-1)  # each [B, 1 or tokens, dim]
        normed = _rms(x.float(), self.eps) * (1.0 + scale.float()) + shift.float()
        return normed.to(x.dtype), gate.to(x.dtype)


def _rms(x: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def gated_residual(x: Tensor, y: Tensor, gate: Tensor | None) -> Tensor:
    """The expert scales each sublayer's output by its adaRMS gate before adding it back; the backbone does not."""
    return x + y if gate is None else x + y * gate


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin tables [B, 1, T, head_dim] for integer positions [B, T], computed in float32 for exactness."""
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(half, device=positions.device, dtype=torch.float32) * 2.0 / head_dim)
    angles = positions.float()[..., None] * inv_freq  # [B, T, half]
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the two halves of each head vector (the split-half convention of Gemma and openpi)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Softmax attention with multi-query/grouped K/V.

    q [B, H, T, D]; k, v [B, KV, S, D]; mask [B, 1, T, S] bool (True = may attend). Every query row must allow
    at least one key, otherwise softmax has nothing to normalise over.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=heads != kv_heads)


def attend_one_query(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """`attend` for one query per sequence (a decode step): q [B, H, 1, D]; k, v [B, KV, S, D]; mask [B, 1, 1, S],
    boolean or additive in q's dtype.

    The query heads that share a K/V head become that head's query rows, so each K/V head is read once by one
    attention over [B, KV, H/KV, D] instead of once per query head.
    """
    b, heads, _, d = q.shape
    kv_heads = k.shape[1]
    grouped = F.scaled_dot_product_attention(q.reshape(b, kv_heads, heads // kv_heads, d), k, v, attn_mask=mask)
    return grouped.reshape(b, heads, 1, d)


def prefix_attention_bias(prefix_valid: Tensor, group: int, queries: int, dtype: torch.dtype) -> Tensor:
    """Additive mask [B, 1, group*queries, P] (0 = visible, -inf = padding) for `attend_prefix_and_self`.

    Built once per call and shared by every layer and denoising step. prefix_valid [B, P] bool.
    """
    b, length = prefix_valid.shape
    bias = torch.zeros(b, 1, 1, 1, length, dtype=dtype, device=prefix_valid.device)
    bias = bias.masked_fill(~prefix_valid.reshape(b, 1, 1, 1, length), float("-inf"))
    return bias.expand(b, 1, group, queries, length).reshape(b, 1, group * queries, length)


def attend_prefix_and_self(
    q: Tensor, prefix_k: Tensor, prefix_v: Tensor, prefix_bias: Tensor, self_k: Tensor, self_v: Tensor
) -> Tensor:
    """Attention over [prefix ; self] that reads the prefix K/V in place instead of concatenating it.

    The action expert attends to a frame's prefix K/V, which lives in the shared cache, and to its own tokens; not
    copying the prefix is what lets one prefill serve the action and the text at no extra memory. Only the small
    score matrices are joined for one softmax. q [B, H, T, D]; prefix_k/v [B, KV, P, D]; prefix_bias from
    `prefix_attention_bias`; self_k/v [B, KV, T, D] (every query sees every self key).
    """
    b, heads, t, d = q.shape
    kv_heads, length = prefix_k.shape[1], prefix_k.shape[2]
    q = q.reshape(b, kv_heads, (heads // kv_heads) * t, d) * (d**-0.5)  # rows: (head in group, position)
    scores = torch.cat([q @ prefix_k.transpose(-1, -2) + prefix_bias, q @ self_k.transpose(-1, -2)], dim=-1)
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    out = weights[..., :length] @ prefix_v + weights[..., length:] @ self_v
    return out.reshape(b, heads, t, d)


class GeGLU(nn.Module):
    """Gemma MLP: gate and up projections, tanh-approximated GELU on the gate, down projection."""

    def __init__(self, width: int, mlp_dim: int):
        super().__init__()
        self.gate_proj = nn.Linear(width, mlp_dim, bias=False)
        self.up_proj = nn.Linear(width, mlp_dim, bias=False)
        self.down_proj = nn.Linear(mlp_dim, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class AttentionProjections(nn.Module):
    """Q/K/V/O weights of one layer; the attention itself is done jointly by the caller."""

    def __init__(self, cfg: GemmaConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.width, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.width, bias=False)


class GemmaLayer(nn.Module):
    """One decoder layer, split around attention so two stacks can share one attention call."""

    def __init__(self, cfg: GemmaConfig, cond_dim: int | None):
        super().__init__()
        if cond_dim is None:
            self.input_layernorm = RMSNorm(cfg.width, cfg.rms_eps)
            self.post_attention_layernorm = RMSNorm(cfg.width, cfg.rms_eps)
        else:
            self.input_layernorm = AdaRMSNorm(cfg.width, cond_dim, cfg.rms_eps)
            self.post_attention_layernorm = AdaRMSNorm(cfg.width, cond_dim, cfg.rms_eps)
        self.self_attn = AttentionProjections(cfg)
        self.mlp = GeGLU(cfg.width, cfg.mlp_dim)

    def project_qkv(
        self, x: Tensor, cond: Tensor | None, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """x [B, T, W] -> q [B, H, T, D], k and v [B, KV, T, D] (q and k rotated), and the residual gate."""
        h, gate = self.input_layernorm(x, cond)
        attn = self.self_attn
        b, t, _ = x.shape
        q = attn.q_proj(h).view(b, t, attn.num_heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(b, t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(b, t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, gate

    def finish(self, x: Tensor, attn_out: Tensor, gate: Tensor | None, cond: Tensor | None) -> Tensor:
        """Attention output [B, H, T, D] -> o_proj, residual, norm, MLP, residual: the layer's output [B, T, W]."""
        b, _, t, _ = attn_out.shape
        x = gated_residual(x, self.self_attn.o_proj(attn_out.transpose(1, 2).reshape(b, t, -1)), gate)
        h, gate = self.post_attention_layernorm(x, cond)
        return gated_residual(x, self.mlp(h), gate)


class GemmaStack(nn.Module):
    """A Gemma decoder stack. The backbone has a token embedding; the expert is time-conditioned instead.

    The backbone decodes text with its embedding table (tied) unless `set_text_head` gives it a separate head, as a
    fine-tuned LeRobot checkpoint carries one (`lm_head`); tied, there is no second copy of the table in memory.
    """

    def __init__(self, cfg: GemmaConfig, vocab_size: int | None = None, cond_dim: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(vocab_size, cfg.width) if vocab_size else None
        self.layers = nn.ModuleList(GemmaLayer(cfg, cond_dim) for _ in range(cfg.depth))
        self.norm = (
            RMSNorm(cfg.width, cfg.rms_eps)
            if cond_dim is None
            else AdaRMSNorm(cfg.width, cond_dim, cfg.rms_eps)
        )
        self.register_parameter("lm_head", None)  # untied text head [vocab, width]; None: the embedding

    def set_text_head(self, weight: Tensor | None) -> None:
        """Decode with `weight` [vocab, width] (an untied head), or with the embedding table when None."""
        if weight is not None and tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            raise ValueError(f"text head must have shape {tuple(self.embed_tokens.weight.shape)}, "
                             f"got {tuple(weight.shape)}")
        self.lm_head = None if weight is None else nn.Parameter(weight)

    @property
    def text_head(self) -> Tensor:
        """The [vocab, width] matrix next-token logits are computed with."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head

    def embed(self, tokens: Tensor) -> Tensor:
        """Token embeddings scaled by sqrt(width), as Gemma does for text (image tokens are not scaled)."""
        x = self.embed_tokens(tokens)
        # the scale rounded to x's dtype, filled on x's device (no host copy, so a CUDA graph can capture it)
        return x * torch.full((), math.sqrt(self.cfg.width), dtype=x.dtype, device=x.device)

    def logits(self, hidden: Tensor, out: Tensor | None = None) -> Tensor:
        """Next-token logits [..., vocab] from final-layer hidden states [..., W], through the final norm and the text
        head. One row [1, W] is a matrix-vector product: on a CPU the matrix product's kernel reads a bfloat16 head at
        about two thirds the speed of `torch.mv` (docs/benchmarks.md, batch 1). `out` [B, vocab] (rows [B, W] of
        several requests only): written and returned instead of a new tensor, so a caller that keeps one spares
        the allocator a fresh [B, vocab] block (on a CPU, pages touched for the first time) every step."""
        h, _ = self.norm(hidden)
        return self.head_logits(h, out)

    def head_logits(self, h: Tensor, out: Tensor | None = None) -> Tensor:
        """`logits` of the final norm's outputs h (the norm already applied)."""
        if h.dim() == 2 and h.shape[0] == 1:
            return torch.mv(self.text_head, h[0])[None]
        if out is not None:
            return torch.mm(h, self.text_head.T, out=out)
        return h @ self.text_head.T
