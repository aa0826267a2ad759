"""CUDA graphs of the two hot loops on a GPU: the decode step and the denoising loop, one graph per batch bucket.

A small model on a GPU spends much of a decode step or a denoise step launching kernels; a CUDA graph records the
launches once and replays them with one call. A graph replays fixed shapes at fixed addresses, so each bucket has
static input buffers that a call copies into, and static outputs it reads from:
- decode: slots, fed tokens, cache indices and RoPE positions [bucket]; the step attends over the cache's whole
  length (masked as eagerly, so the result is the eager step's up to rounding) and writes the cache in place, so
  each graph belongs to one cache. Rows past the batch repeat its first row: they write the same K/V to the same
  place, and their logits are dropped.
- denoise: the noise, the frame's prefix K/V (copied in: a graph cannot follow views of other slots), the
  prefix mask, RoPE tables and the time conditions of all Euler steps; one replay runs the whole loop.

A bucket is captured on its first call: a few warm-up runs on a side stream (they do the call's own work, which a
replay repeats with the same result), then capture on that stream, as the torch.cuda.graphs documentation
prescribes. Nothing in the captured code syncs with the host or copies from it. Decode graphs share one memory
pool and side stream, denoise graphs another: the language worker replays the first kind while the control path
may replay the second on its own stream, so they must not share intermediate memory; within a kind replays are
serial on one stream. Capture errors only on unsafe calls of the capturing thread (`thread_local`), as the other
path keeps running. `Pi05Model.use_cuda_graphs` turns this on; without it, and on a CPU, everything runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

WARMUP_RUNS = 2


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor, ...]
    output: Tensor
    cache: object = None  # a decode graph writes this cache: kept alive, so its id is never another cache's


def _padded(t: Tensor, rows: int, dim: int = 0) -> Tensor:
    """`t` with its first entry along `dim` repeated up to `rows` entries."""
    extra = rows - t.shape[dim]
    if extra == 0:
        return t
    first = t.narrow(dim, 0, 1)
    return torch.cat([t, first.expand(*[extra if d == dim else -1 for d in range(t.dim())])], dim=dim)


class CudaGraphs:
    """Graphs of one model's decode step (per cache and bucket) and denoising loop (per bucket and step count)."""

    def __init__(self, model, buckets: Sequence[int]):
        if model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, not {model.device}")
        if not buckets or any(b < 1 for b in buckets):
            raise ValueError(f"buckets must be positive batch sizes, got {list(buckets)}")
        self._setup(model, buckets, model.device)

    def __deepcopy__(self, memo):
        """A copy of the model (the benchmark's `parallel` setting) gets graphs of its own, captured on first use:
        a graph replays into the buffers it was captured with."""
        copied = CudaGraphs.__new__(CudaGraphs)
        copied._setup(memo.get(id(self.model), self.model), self.buckets, self.device)
        return copied

    def _setup(self, model, buckets: Sequence[int], device: torch.device) -> None:
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        self.device = device
        self._pools = {kind: torch.cuda.graph_pool_handle() for kind in ("decode", "denoise")}
        self._streams = {kind: torch.cuda.Stream(self.device) for kind in ("decode", "denoise")}  # warm-up, capture
        self._decode: dict[tuple[int, int], _Captured] = {}
        self._denoise: dict[tuple[int, int, torch.dtype], _Captured] = {}
        self.captures = 0  # graphs captured so far (tests, logs)

    def bucket(self, batch: int) -> int | None:
        """The smallest bucket holding `batch` rows; None when the batch is larger than every bucket."""
        return next((b for b in self.buckets if b >= batch), None)

    def _capture(self, kind: str, run: Callable[[], Tensor], inputs: tuple[Tensor, ...]) -> _Captured:
        stream = self._streams[kind]
        with torch.cuda.device(self.device):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_RUNS):
                    run()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pools[kind], stream=stream, capture_error_mode="thread_local"):
                output = run()
            torch.cuda.current_stream().wait_stream(stream)
        self.captures += 1
        return _Captured(graph, inputs, output)

    # ---- decode -----------------------------------------------------------------------------------------------

    def decode_logits(self, cache, slots: Tensor, tokens: Tensor, cache_index: Tensor, positions: Tensor
                      ) -> Tensor | None:
        """The decode step's logits [B, vocab] (model dtype) by replay; None when B exceeds every bucket.

        The batch was checked when its `DecodeIndex` was built; it writes the fed tokens' K/V as eagerly."""
        batch = len(slots)
        bucket = self.bucket(batch)
        if bucket is None:
            return None
        values = [_padded(t.to(self.device, torch.long), bucket) for t in (slots, tokens, cache_index, positions)]
        key = (id(cache), bucket)
        captured = self._decode.get(key)
        if captured is None:
            static = tuple(v.clone() for v in values)
            model = self.model

            def run() -> Tensor:
                s, t, i, p = static
                hidden = model._decode_layers(cache, s, s, t, i, p, cache.max_len)
                return model.backbone.logits(hidden)

            captured = self._decode[key] = self._capture("decode", run, static)
            captured.cache = cache
        else:
            for buffer, value in zip(captured.inputs, values):
                buffer.copy_(value)
        captured.graph.replay()
        return captured.output[:batch]

    # ---- denoise ----------------------------------------------------------------------------------------------

    def denoise(self, x: Tensor, conds: Tensor, prefix_k: Tensor, prefix_v: Tensor, bias: Tensor, cos: Tensor,
                sin: Tensor) -> Tensor | None:
        """`Pi05Model._denoise` by replay: actions [B, H, A] float32 (a fresh tensor); None when B exceeds every
        bucket."""
        batch = x.shape[0]
        bucket = self.bucket(batch)
        if bucket is None:
            return None
        values = (_padded(x, bucket), conds, _padded(prefix_k, bucket, dim=1), _padded(prefix_v, bucket, dim=1),
                  _padded(bias, bucket), _padded(cos, bucket), _padded(sin, bucket))
        key = (bucket, conds.shape[0], prefix_k.dtype)
        captured = self._denoise.get(key)
        if captured is None:
            static = tuple(v.clone() for v in values)
            captured = self._denoise[key] = self._capture("denoise", lambda: self.model._denoise(*static), static)
        else:
            for buffer, value in zip(captured.inputs, values):
                buffer.copy_(value)
        captured.graph.replay()
        return captured.output[:batch].clone()  # the static output is overwritten by the next replay
