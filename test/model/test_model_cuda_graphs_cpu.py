"""What of the CUDA-graph path can be checked without a GPU (the graphs themselves are tested in test_gpu/): a CPU
model refuses graphs and keeps running eagerly, a bucket's padding repeats the batch's first row, and the capture
logic (one capture at a time in the process, stream order without events on the calling stream, decode graphs
that do not keep their cache alive, a denoise replay's inputs copied once into its buffers) with torch's CUDA calls
replaced by recording stand-ins: the captured function runs eagerly on the CPU, a replay does nothing."""

import gc
import threading
import weakref
from contextlib import contextmanager, nullcontext

import pytest
import torch

from oxygen_ros.model import cuda_graphs
from oxygen_ros.model.actions import denoise
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.cuda_graphs import CudaGraphs, _padded
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model

TINY = get_preset("tiny")


def test_a_cpu_model_refuses_graphs_and_stays_eager():
    model = build_model(TINY, seed=0)
    with pytest.raises(ValueError, match="CUDA device"):
        model.use_cuda_graphs()
    assert model._graphs is None


def test_padding_repeats_the_first_row_along_the_batch_dimension():
    rows = torch.arange(6).reshape(3, 2)
    assert torch.equal(_padded(rows, 3), rows)
    assert _padded(rows, 5).tolist() == [[0, 1], [2, 3], [4, 5], [0, 1], [0, 1]]
    layers = torch.arange(12).reshape(2, 3, 2)  # [depth, batch, ...]: padded along dim 1
    assert torch.equal(_padded(layers, 4, dim=1)[:, 3], layers[:, 0])


class Stream:
    """A stand-in CUDA stream: records the streams it was made to wait for."""

    def __init__(self, handle: int):
        self.device, self.cuda_stream, self.waited = "cuda:0", handle, []

    def wait_stream(self, other):
        self.waited.append(other.cuda_stream)


class Captures:
    """torch's capture calls replaced: which streams were current, and how many captures overlapped."""

    def __init__(self, monkeypatch):
        self.current = threading.local()
        self.inside = 0
        self.most_inside = 0
        self.unlocked = []  # warm-ups or captures that ran without the capture lock
        self.second = threading.Event()
        self.lock = threading.Lock()
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "device", lambda device: nullcontext())
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: self.current.stream)
        monkeypatch.setattr(cuda, "stream", self.stream)
        monkeypatch.setattr(cuda, "graph", self.graph)
        monkeypatch.setattr(cuda, "CUDAGraph", lambda: type("Graph", (), {"replay": lambda graph: None})())
        monkeypatch.setattr(cuda, "graph_pool_handle", object)
        handles = iter(range(100, 200))
        monkeypatch.setattr(cuda, "Stream", lambda device=None: Stream(next(handles)))

    def stream(self, stream):
        self.unlocked += [] if cuda_graphs.CAPTURE_LOCK.locked() else ["warm-up"]
        return nullcontext()

    @contextmanager
    def graph(self, graph, pool=None, stream=None, capture_error_mode="global"):
        self.unlocked += [] if cuda_graphs.CAPTURE_LOCK.locked() else ["capture"]
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            if self.inside == 2:
                self.second.set()
        self.second.wait(0.3)  # long enough for a second thread's capture to start beside this one
        try:
            yield
        finally:
            with self.lock:
                self.inside -= 1


def graphs_on(model, stream=None) -> CudaGraphs:
    """`CudaGraphs` for a CPU model (the CUDA device check skipped)."""
    graphs = CudaGraphs.__new__(CudaGraphs)
    graphs._setup(model, (2,), torch.device("cpu"), stream)
    return graphs


def decode(graphs: CudaGraphs, cache: KVCache):
    p = TINY.prefix_len
    return graphs.decode_logits(cache, torch.tensor([0, 1]), torch.tensor([5, 6]), torch.tensor([p, p]),
                                torch.tensor([3, 4]))


@torch.no_grad()
def test_captures_take_turns_keep_stream_order_and_let_their_cache_go(monkeypatch):
    captures = Captures(monkeypatch)
    model = build_model(TINY, seed=0)
    caches = [KVCache(TINY, 2, TINY.prefix_len + 4) for _ in range(2)]
    streams = [Stream(1), Stream(2)]
    shapes = []

    def worker(i: int):  # per-stream graphs (the fleet's stage workers): captured on the calling stream
        captures.current.stream = streams[i]
        with torch.no_grad():
            shapes.append(tuple(decode(graphs_on(model, streams[i]), caches[i]).shape))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert shapes == [(2, TINY.vocab_size)] * 2
    assert captures.most_inside == 1 and captures.unlocked == []  # one capture, with its warm-up, at a time
    assert [s.waited for s in streams] == [[], []]  # no stream waits for itself, no event is made
    # graphs of their own side stream: it starts after the calling stream's work, which waits for the capture
    captures.current.stream = caller = Stream(3)
    side = graphs_on(model)
    decode(side, caches[0])
    assert side._streams["decode"].waited == [3] and caller.waited == [side._streams["decode"].cuda_stream] * 2
    # a decode graph keeps no reference to its cache: a pool that goes takes its graphs with it
    kept = weakref.ref(caches[0])
    assert len(side._decode) == 1
    del caches[0]
    gc.collect()
    assert kept() is None and len(side._decode) == 0


class Denoiser:
    """A stand-in model for the denoise graph: the expert's velocity is minus the noisy actions, so the captured
    Euler loop (`actions.denoise`) returns the noise's shape, scaled."""

    def _velocity(self, x, cond, prefix_k, prefix_v, bias, cos, sin):
        return -x.float()


def denoise_inputs(batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    """The denoise graph's inputs for `batch` rows, shaped as the model's (the prefix K/V's batch on dim 1)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, 5, 2), (10, 8), (2, batch, 4, 6, 8), (2, batch, 4, 6, 8), (batch, 1, 5, 11), (batch, 11, 8),
              (batch, 11, 8))
    return tuple(torch.randn(shape, generator=gen) for shape in shapes)


@torch.no_grad()
def test_a_denoise_replay_copies_its_inputs_straight_into_the_static_buffers(monkeypatch):
    """The prefix K/V, the replay's largest inputs, go into the graph's buffers once: no padded copy first."""
    captures = Captures(monkeypatch)
    captures.current.stream = Stream(7)
    graphs = CudaGraphs.__new__(CudaGraphs)
    graphs._setup(Denoiser(), (4,), torch.device("cpu"))
    first = denoise_inputs(3, seed=1)
    assert torch.equal(graphs.denoise(*first), denoise(Denoiser(), *first))  # captured (run eagerly): bucket 4
    (captured,) = graphs._denoise.values()

    def no_cat(*args, **kwargs):
        raise AssertionError("a replay made a padded copy of an input")

    monkeypatch.setattr(torch, "cat", no_cat)
    for batch, seed in ((2, 2), (4, 3), (1, 4)):  # padded, full, padded again
        inputs = denoise_inputs(batch, seed)
        graphs.denoise(*inputs)
        for buffer, value, dim in zip(captured.inputs, inputs, (0, None, 1, 1, 0, 0, 0)):
            assert torch.equal(buffer, value if dim is None else _padded_rows(value, 4, dim))
    assert graphs.captures == 1


def _padded_rows(value: torch.Tensor, rows: int, dim: int) -> torch.Tensor:
    """The padding `_padded` makes (its first row repeated), built by indexing: torch.cat is refused in that test."""
    index = torch.tensor(list(range(value.shape[dim])) + [0] * (rows - value.shape[dim]))
    return value.index_select(dim, index)


@torch.no_grad()
def test_a_prefill_replay_writes_the_eager_prefix_and_belongs_to_its_cache(monkeypatch):
    """The prefill graph (captured function run eagerly here) pads a batch to its bucket with the first row, writes
    the eager prefill's K/V and validity into the slots, returns the rows' own outputs, and is kept per cache and
    per kind of output; a cache that goes takes its graphs with it."""
    from oxygen_ros.evaluation.bench.workloads import synthetic_frames
    from oxygen_ros.model.inputs import ModelInputs

    captures = Captures(monkeypatch)
    captures.current.stream = Stream(9)
    model = build_model(TINY, seed=0)
    graphs = CudaGraphs.__new__(CudaGraphs)
    graphs._setup(model, (4,), torch.device("cpu"))
    frames, _ = synthetic_frames(TINY, 3, seed=2)
    batch = ModelInputs(*(torch.cat([getattr(f, name) for f in frames]) for name in
                          ("images", "image_masks", "tokens", "token_masks")))
    eager_cache, graphed_cache = (KVCache(TINY, 5, TINY.prefix_len + 4) for _ in range(2))
    slots = torch.tensor([4, 0, 2])
    expected = model.prefill(batch, eager_cache, slots, want_hidden=True)
    got = graphs.prefill(graphed_cache, slots, batch, True)
    # the padded batch of 4 runs other matrix shapes than the 3 rows: equal up to the kernels' rounding, which
    # depends on the shape on some CPUs (AVX-512 without AMX here)
    assert torch.equal(got.num_valid, expected.num_valid)
    torch.testing.assert_close(got.hidden, expected.hidden, rtol=1e-5, atol=1e-5)
    assert got.num_valid.shape == (3,) and got.logits is None
    assert torch.equal(graphed_cache.valid, eager_cache.valid)
    for name in ("k", "v"):
        torch.testing.assert_close(getattr(graphed_cache, name), getattr(eager_cache, name), rtol=1e-5, atol=1e-5)
    (captured,) = graphs._prefill[graphed_cache].values()
    assert torch.equal(captured.inputs[0], torch.tensor([4, 0, 2, 4]))  # the first row's slot repeated
    # a second call of the same bucket and kind replays (no capture); the other kind is a graph of its own
    graphs.prefill(graphed_cache, torch.tensor([1]), ModelInputs(*(getattr(frames[0], n) for n in (
        "images", "image_masks", "tokens", "token_masks"))), True)
    assert graphs.captures == 1 and torch.equal(captured.inputs[0], torch.tensor([1, 1, 1, 1]))
    assert graphs.prefill(graphed_cache, slots, batch, False).hidden is None
    assert graphs.captures == 2
    # five rows exceed every bucket: no graph
    assert graphs.prefill(graphed_cache, torch.arange(5), batch, True) is None
    kept = weakref.ref(graphed_cache)
    del graphed_cache, captured
    gc.collect()
    assert kept() is None and len(graphs._prefill) == 0


@torch.no_grad()
def test_the_runner_captures_every_graph_before_the_first_frame(monkeypatch):
    """`capture_graphs` (the runtime's warm-up) captures each graph a batch of 1..max_batch frames or of
    1..language_slots requests replays, on scratch slots it gives back; frames and decode steps after it capture
    nothing mid-run."""
    from oxygen_ros.engine.model_runner import ModelRunner
    from oxygen_ros.evaluation.bench.workloads import synthetic_frames

    captures = Captures(monkeypatch)
    captures.current.stream = Stream(5)
    model = build_model(TINY, seed=0)
    model._graphs = CudaGraphs.__new__(CudaGraphs)
    model._graphs._setup(model, (1, 2, 4), torch.device("cpu"))
    runner = ModelRunner(model, language_slots=3, max_new_tokens=4, max_batch=3)
    used = runner.pool.slots_used  # the padding slots
    # batches of 1, 2 and 3 frames (buckets 1, 2, 4): two prefills (with and without the last output) and the
    # denoising each; 1, 2 and 3 requests: a decode step each
    assert runner.capture_graphs() == 3 * 3 + 3
    assert runner.pool.slots_used == used  # the scratch slots given back
    frames, noises = synthetic_frames(TINY, 3, seed=1)
    for n in (1, 2, 3):
        out = runner.act(frames[:n], noises[:n], n, [True] * n)
        runner.free(out.slots)
    p = TINY.prefix_len
    model.decode_step(runner.pool.cache, torch.tensor([0, 1]), torch.tensor([3, 4]), torch.tensor([p, p]),
                      torch.tensor([2, 2]))
    assert model._graphs.captures == 12
    # without graphs (a CPU model) nothing is captured
    assert ModelRunner(build_model(TINY, seed=0), 2, 4, max_batch=2).capture_graphs() == 0
