"""The CPU's decode back end: what a model's decode steps on the CPU keep from one step to the next.

- the logits buffer: a [rows, vocab] block reused step after step (a fresh [50, 257152] float32 block each step
  costs its page faults: a float32 batch-50 head product took 38 ms into a new tensor, 17 ms into a kept one,
  docs/results/2026-11-benchmarks.md);
- the text head's largest row norm, which bounds every logit (`decode._nonfinite_rows`);
- with the compiled kernel on (`Pi05Model.use_cpu_kernel`, `model/cpu_kernel.py`): its RoPE tables, the weights it
  reads (`cpu_kernel.StepWeights`) and the float32 head's bfloat16 screening copy.

One `CpuDecode` per model, kept on it (`Pi05Model._cpu`); everything is made again when what it was made of changes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import cpu_kernel
from .kv_cache import DecodeIndex, KVCache


class CpuDecode:
    def __init__(self, kernel: bool = False):
        self.kernel = kernel  # the compiled kernel runs the step's layers and the greedy choice
        self._logits_buffer: Tensor | None = None
        self._rope_tables: tuple[Tensor, Tensor] | None = None  # (cos, sin)
        self.step_weights: cpu_kernel.StepWeights | None = None
        # (the head it was made of, that head's storage, version and shape, the copy), one attribute so that a
        # reader on another thread sees a copy only with the head it belongs to
        self._head_copy_made: tuple[Tensor, tuple, cpu_kernel.HeadCopy] | None = None
        self._head_norm: tuple[tuple, float] | None = None  # (the head's identity, its largest row norm)

    def kept_bytes(self) -> int:
        """Bytes of the head's screening copy, where one is kept."""
        made = self._head_copy_made
        return 0 if made is None else sum(t.numel() * t.element_size() for t in (made[2].bf16, made[2].norms))

    def logits_out(self, model, rows: int) -> Tensor | None:
        """A [rows, vocab] view of the logits buffer (grown to the largest batch seen, in the model's dtype). None
        for one row (a matrix-vector product) and off the CPU (the CUDA allocator reuses its blocks)."""
        if rows == 1 or model.device.type != "cpu":
            return None
        if self._logits_buffer is None or self._logits_buffer.shape[0] < rows:
            self._logits_buffer = torch.empty(rows, model.config.vocab_size, dtype=model.dtype, device=model.device)
        return self._logits_buffer[:rows]

    def kernel_normed(self, model, cache: KVCache, index: DecodeIndex, tokens: Tensor) -> Tensor:
        """The final norm's outputs [B, W] of a decode step as one kernel call: embedding, RoPE (tables kept for
        the cache's length), every layer and the final norm."""
        cfg = model.config
        tables = self._rope_tables
        if tables is None or len(tables[0]) < cache.max_len or tables[0].dtype != model.dtype:
            tables = self._rope_tables = cpu_kernel.rope_tables(cache.max_len, cfg.backbone.head_dim, cfg.rope_theta,
                                                                model.dtype)
        if self.step_weights is None:
            self.step_weights = cpu_kernel.StepWeights(model.backbone)
        return cpu_kernel.decode_step(tokens.to(model.device, torch.long).contiguous(), self.step_weights, cfg, cache,
                                      index.slots, index.cache_index, index.positions, index.span, tables)

    def head_copy(self, head: Tensor, dtype: torch.dtype) -> cpu_kernel.HeadCopy | None:
        """The float32 text head's bfloat16 copy and row norms that `cpu_kernel.head_greedy` screens it with on
        matrix tiles or AVX-512 BF16's pair dot products (None where it is not screened); made when the kernel is
        turned on and again whenever the head's storage or contents change (contents: by its version counter, which
        a head made under `torch.inference_mode` does not have; such a head is taken as fixed while its storage
        is)."""
        if not cpu_kernel.screens(dtype, head.shape[1]):
            return None
        state = (head.data_ptr(), None if head.is_inference() else head._version, tuple(head.shape))
        made = self._head_copy_made
        if made is None or made[0] is not head or made[1] != state:
            made = self._head_copy_made = (head, state, cpu_kernel.head_copy(head.detach()))
        return made[2]

    def head_row_norm(self, head: Tensor) -> float:
        """The text head's largest row norm (float32, in blocks of rows: no float32 copy of a bfloat16 head), made
        again whenever the head's storage or contents change (as `head_copy`)."""
        state = (head.data_ptr(), None if head.is_inference() else head._version, tuple(head.shape), head.dtype)
        if self._head_norm is None or self._head_norm[0] != state:
            with torch.no_grad():
                best = max(float(torch.linalg.vector_norm(head[i:i + 8192].float(), dim=-1).max())
                           for i in range(0, len(head), 8192))
            self._head_norm = (state, best)
        return self._head_norm[1]
