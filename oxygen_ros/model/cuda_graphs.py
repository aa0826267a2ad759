"""CUDA graphs of the hot paths on a GPU: the prefill, the decode step and the denoising loop, one graph per batch
bucket.

A model on a GPU spends much of a prefill, a decode step or a denoise step launching kernels; a CUDA graph records the
launches once and replays them with one call. A graph replays fixed shapes at fixed addresses, so each bucket has
static input buffers that a call copies into, and static outputs it reads from:
- prefill (a frame's prefix without the text head's logits): slots, images, image and token masks, tokens
  [bucket, ...]; it writes every layer's K/V into the cache in place, so each graph belongs to one cache (and to
  whether the last token's output is kept). Rows past the batch repeat its first row, as in decode.
- decode: slots, fed tokens, cache indices and RoPE positions [bucket]; the step attends over the cache's whole
  length (masked as eagerly, so the result is the eager step's up to rounding) and writes the cache in place, so
  each graph belongs to one cache. Rows past the batch repeat its first row: they write the same K/V to the same
  place, and their logits are dropped.
- denoise: the noise, the frame's prefix K/V (copied in: a graph cannot follow views of other slots), the
  prefix mask, RoPE tables and the time conditions of all Euler steps; one replay runs the whole loop.

A bucket is captured on its first call: a few warm-up runs on a side stream (they do the call's own work, which a
replay repeats with the same result), then capture on that stream, as the torch.cuda.graphs documentation
prescribes. Nothing in the captured code syncs with the host or copies from it. Each kind (prefill, decode,
denoise) has one memory pool and side stream of its own: the language worker replays decode graphs while the
control path may replay the others on its own stream, so kinds must not share intermediate memory; within a kind replays are
serial on one stream. Capture errors only on unsafe calls of the capturing thread (`thread_local`), as the other
path keeps running; but only one capture may be under way in a process (torch 2.13, `torch/cuda/graphs.py`,
`graph.__init__`), and both the language worker and the control path capture, so a process-wide lock holds each
bucket's warm-up and capture. A decode graph belongs to the cache it writes, held weakly: a cache that goes
(a benchmark's next pool) takes its graphs and their memory with it. `Pi05Model.use_cuda_graphs` turns this on;
without it, and on a CPU, everything runs eagerly.

Per stream (`StreamGraphs`, `use_cuda_graphs(per_stream=True)`, the fleet's stage workers): a stage that issues on
an SM partition's stream (a green context) must run its graph there, so each stream the calls come from gets its
own graphs, warmed up, captured and replayed on that very stream, with pools of its own (a pool's captures share
one stream). A graph is then found by (model, stage, bucket, partition): the model's `StreamGraphs`, the kind
(denoise: the action stage; decode: the language path; the VLM stage's prefill has none and runs eagerly), the
bucket, and the stream. The VLM stage's prefill runs eagerly there. Warm-up and capture then run on the calling stream itself, in stream order, with no
event between streams: torch makes its events in the device's primary context, and the driver records an event
only on a stream of the event's own context (a green context's stream is not).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .actions import denoise

WARMUP_RUNS = 2
CAPTURE_LOCK = threading.Lock()  # one capture (with its warm-up) at a time in the process


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor, ...]
    output: Any  # a tensor, or the prefill's result (tensors in a dataclass)


def _padded(t: Tensor, rows: int, dim: int = 0) -> Tensor:
    """`t` with its first entry along `dim` repeated up to `rows` entries."""
    extra = rows - t.shape[dim]
    if extra == 0:
        return t
    first = t.narrow(dim, 0, 1)
    return torch.cat([t, first.expand(*[extra if d == dim else -1 for d in range(t.dim())])], dim=dim)


def _copy_padded(buffer: Tensor, value: Tensor, dim: int = 0) -> None:
    """`buffer.copy_(_padded(value, rows, dim))` without making the padded tensor first: the rows of `value`, then
    its first row into the rest (a replay's inputs are copied into its static buffers once, not twice)."""
    rows = value.shape[dim]
    buffer.narrow(dim, 0, rows).copy_(value)
    rest = buffer.narrow(dim, rows, buffer.shape[dim] - rows)
    if rest.numel():
        rest.copy_(value.narrow(dim, 0, 1).expand_as(rest))


class CudaGraphs:
    """Graphs of one model's decode step (per cache and bucket) and denoising loop (per bucket and step count)."""

    def __init__(self, model, buckets: Sequence[int], stream: torch.cuda.Stream | None = None):
        """`stream`: warm up and capture on this stream (the one the graphs will be replayed on) instead of side
        streams of their own."""
        check_graph_setup(model, buckets)
        self._setup(model, buckets, model.device, stream)

    def __deepcopy__(self, memo):
        """A copy of the model (the benchmark's `parallel` setting) gets graphs of its own, captured on first use:
        a graph replays into the buffers it was captured with."""
        copied = CudaGraphs.__new__(CudaGraphs)
        copied._setup(memo.get(id(self.model), self.model), self.buckets, self.device)
        return copied

    def _setup(self, model, buckets: Sequence[int], device: torch.device, stream=None) -> None:
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        self.device = device
        kinds = ("prefill", "decode", "denoise")
        self._pools = {kind: torch.cuda.graph_pool_handle() for kind in kinds}
        self._streams = {kind: stream or torch.cuda.Stream(self.device) for kind in kinds}  # capture
        # cache -> (bucket, want_hidden) -> graph, held weakly as the decode graphs are
        self._prefill: weakref.WeakKeyDictionary[object, dict[tuple[int, bool], _Captured]] = \
            weakref.WeakKeyDictionary()
        # cache -> bucket -> graph; weak keys: a graph holds no reference to the cache it writes
        self._decode: weakref.WeakKeyDictionary[object, dict[int, _Captured]] = weakref.WeakKeyDictionary()
        self._denoise: dict[tuple[int, int, torch.dtype], _Captured] = {}
        self.captures = 0  # graphs captured so far (tests, logs)

    def bucket(self, batch: int) -> int | None:
        """The smallest bucket holding `batch` rows; None when the batch is larger than every bucket."""
        return graph_bucket(self.buckets, batch)

    def _capture(self, kind: str, run: Callable[[], Tensor], inputs: tuple[Tensor, ...]) -> _Captured:
        """Warm up and capture `run` on this kind's stream. A side stream (one of this object's own) is ordered
        after the calling stream's work and the calling stream after the capture; on the calling stream itself
        (per-stream graphs) stream order does that, and no event is made (see the module's docstring)."""
        stream = self._streams[kind]
        with CAPTURE_LOCK, torch.cuda.device(self.device):
            current = torch.cuda.current_stream(self.device)
            side = stream_key(stream) != stream_key(current)
            if side:
                stream.wait_stream(current)
            with torch.cuda.stream(stream):
                for _ in range(WARMUP_RUNS):
                    run()
            if side:
                current.wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pools[kind], stream=stream, capture_error_mode="thread_local"):
                output = run()
            if side:
                current.wait_stream(stream)
            self.captures += 1
        return _Captured(graph, inputs, output)

    # ---- prefill ----------------------------------------------------------------------------------------------

    def prefill(self, cache, slots: Tensor, batch, want_hidden: bool):
        """`Pi05Model.prefill` (without logits) by replay: the prefix's K/V written into `cache` at `slots`, and a
        `PrefillResult` of fresh tensors; None when the batch exceeds every bucket. The call has checked the slots
        and the batch's shapes. Rows past the batch repeat its first row (same slot, same K/V), as in decode."""
        rows = len(slots)
        bucket = self.bucket(rows)
        if bucket is None:
            return None
        values = (slots.to(self.device, torch.long), batch.images, batch.image_masks, batch.tokens,
                  batch.token_masks)
        graphs = self._prefill.get(cache)
        if graphs is None:
            graphs = self._prefill[cache] = {}
        captured = graphs.get((bucket, want_hidden))
        if captured is None:
            static = tuple(_padded(v.to(self.device), bucket).clone() for v in values)
            model = self.model

            def run():
                idx, images, image_masks, tokens, token_masks = static
                inputs = type(batch)(images=images, image_masks=image_masks, tokens=tokens, token_masks=token_masks)
                return model._prefill_layers(inputs, cache, idx, False, want_hidden)

            captured = graphs[(bucket, want_hidden)] = self._capture("prefill", run, static)
        else:
            for buffer, value in zip(captured.inputs, values):
                _copy_padded(buffer, value.to(self.device))
        captured.graph.replay()
        out = captured.output  # static: overwritten by this graph's next replay
        return dataclasses.replace(out, num_valid=out.num_valid[:rows].clone(),
                                   hidden=None if out.hidden is None else out.hidden[:rows].clone())

    # ---- decode -----------------------------------------------------------------------------------------------

    def decode_logits(self, cache, slots: Tensor, tokens: Tensor, cache_index: Tensor, positions: Tensor
                      ) -> Tensor | None:
        """The decode step's logits [B, vocab] (model dtype) by replay, a view of the graph's static output that its
        next replay overwrites; None when B exceeds every bucket.

        The batch was checked when its `DecodeIndex` was built; it writes the fed tokens' K/V as eagerly."""
        batch = len(slots)
        bucket = self.bucket(batch)
        if bucket is None:
            return None
        values = [_padded(t.to(self.device, torch.long), bucket) for t in (slots, tokens, cache_index, positions)]
        graphs = self._decode.get(cache)
        if graphs is None:
            graphs = self._decode[cache] = {}
        captured = graphs.get(bucket)
        if captured is None:
            static = tuple(v.clone() for v in values)
            model = self.model

            def run() -> Tensor:
                s, t, i, p = static
                hidden = model._decode_layers(cache, s, s, t, i, p, cache.max_len)
                return model.backbone.logits(hidden)

            captured = graphs[bucket] = self._capture("decode", run, static)
        else:
            for buffer, value in zip(captured.inputs, values):
                buffer.copy_(value)
        captured.graph.replay()
        return captured.output[:batch]  # the static output: valid until this graph's next replay

    # ---- denoise ----------------------------------------------------------------------------------------------

    def denoise(self, x: Tensor, conds: Tensor, prefix_k: Tensor, prefix_v: Tensor, bias: Tensor, cos: Tensor,
                sin: Tensor) -> Tensor | None:
        """`actions.denoise` by replay: actions [B, H, A] float32 (a fresh tensor); None when B exceeds every
        bucket."""
        batch = x.shape[0]
        bucket = self.bucket(batch)
        if bucket is None:
            return None
        # each input and the dimension its batch is on (the time conditions are the same for every row)
        values = ((x, 0), (conds, None), (prefix_k, 1), (prefix_v, 1), (bias, 0), (cos, 0), (sin, 0))
        key = (bucket, conds.shape[0], prefix_k.dtype)
        captured = self._denoise.get(key)
        if captured is None:
            static = tuple(v.clone() if dim is None else _padded(v, bucket, dim).clone() for v, dim in values)
            captured = self._denoise[key] = self._capture("denoise", lambda: denoise(self.model, *static), static)
        else:
            # straight into the static buffers: the prefix K/V, the largest inputs, are copied once per replay
            for buffer, (value, dim) in zip(captured.inputs, values):
                if dim is None:
                    buffer.copy_(value)
                else:
                    _copy_padded(buffer, value, dim)
        captured.graph.replay()
        return captured.output[:batch].clone()  # the static output is overwritten by the next replay


def check_graph_setup(model, buckets: Sequence[int]) -> None:
    if model.device.type != "cuda":
        raise ValueError(f"CUDA graphs need the model on a CUDA device, not {model.device}")
    if not buckets or any(b < 1 for b in buckets):
        raise ValueError(f"buckets must be positive batch sizes, got {list(buckets)}")


def graph_bucket(buckets: Sequence[int], batch: int) -> int | None:
    """The smallest of `buckets` holding `batch` rows; None when the batch is larger than every bucket (eager)."""
    return next((b for b in sorted(buckets) if b >= batch), None)


def stream_key(stream: torch.cuda.Stream) -> Hashable:
    """What identifies a stream: its device and its CUDA handle (two stream objects may wrap one handle)."""
    return (str(stream.device), stream.cuda_stream)


class StreamGraphs:
    """A model's graphs per stream: each call replays the graph of the stream it is issued on, captured on that
    stream at its first call there. `current_stream` and `make` (a `CudaGraphs` factory) are what the tests of
    the keying replace."""

    def __init__(self, model, buckets: Sequence[int], current_stream: Callable[[], object] | None = None,
                 make: Callable[..., CudaGraphs] = CudaGraphs):
        if current_stream is None:
            check_graph_setup(model, buckets)
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        self._current = current_stream or torch.cuda.current_stream
        self._make = make
        self._by_stream: dict[Hashable, CudaGraphs] = {}
        self._streams: dict[Hashable, object] = {}  # kept alive: a handle is never another stream's
        self._lock = threading.Lock()  # the stage workers and the language worker call from their threads

    def __deepcopy__(self, memo):
        return StreamGraphs(memo.get(id(self.model), self.model), self.buckets, self._current, self._make)

    def for_stream(self, stream) -> CudaGraphs:
        """The graphs replayed on `stream` (made on first use)."""
        key = stream_key(stream)
        with self._lock:
            if key not in self._by_stream:
                self._by_stream[key] = self._make(self.model, self.buckets, stream=stream)
                self._streams[key] = stream
            return self._by_stream[key]

    @property
    def captures(self) -> int:
        return sum(graphs.captures for graphs in self._by_stream.values())

    def prefill(self, *args):
        """None: the fleet's VLM stage runs its prefill eagerly on its partition (only the decode step and the
        denoising loop have per-stream graphs)."""
        return None

    def decode_logits(self, *args) -> Tensor | None:
        return self.for_stream(self._current()).decode_logits(*args)

    def denoise(self, *args) -> Tensor | None:
        return self.for_stream(self._current()).denoise(*args)
