"""CUDA graphs of the decode step and the denoising loop against eager execution, float32 and bfloat16: a replay
gives what the same function gives eagerly within the dtype's tolerance (`gpu_precision.py`), greedy tokens equal the
eager decode step's wherever rounding cannot decide, actions stay within the dtype's tolerance of the eager loop, each bucket is captured once and larger batches run eagerly; and
the threaded runtime with graphs on gives the same chunks as without and the same text at float32's agreement rate."""

import pytest
import torch

from oxygen_ros.engine.model_runner import concat_inputs
from oxygen_ros.evaluation.bench.modes import RUNNERS, Workload
from oxygen_ros.evaluation.bench.workloads import arrivals, synthetic_frames
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.cuda_graphs import _padded
from oxygen_ros.model.decode import decode_logits
from oxygen_ros.model.kv_cache import DecodeIndex, KVCache
from oxygen_ros.model.pi05 import build_model

from engine_fixtures import TINY
from gpu_precision import assert_texts_agree, tolerance

DEVICE = torch.device("cuda")
CFG = get_preset("fullvocab")
P = CFG.prefix_len
DTYPES = (torch.float32, torch.bfloat16)


def filled_cache(dtype, slots: int, seed: int) -> KVCache:
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(CFG, num_slots=slots, max_len=P + 8, dtype=dtype, device=DEVICE)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    cache.valid[:, :P] = (torch.rand(slots, P, generator=gen) > 0.1).to(DEVICE)
    return cache


def assert_same_choice(replayed, expected):
    """Greedy tokens equal wherever rounding cannot decide: every row whose two best eager logits lie further apart
    than twice the largest difference between the two results (all rows, unless two logits nearly tie)."""
    replayed, expected = replayed.float(), expected.float()
    torch.testing.assert_close(replayed, expected, **tolerance(torch.bfloat16))
    diff = (replayed - expected).abs().max()
    top = expected.topk(2, dim=-1).values
    clear = (top[:, 0] - top[:, 1]) > 2 * diff
    assert clear.sum() >= 1
    assert torch.equal(replayed.argmax(dim=-1)[clear], expected.argmax(dim=-1)[clear])


def test_graphs_need_a_cuda_model():
    with pytest.raises(ValueError, match="CUDA device"):
        build_model(TINY, seed=0).use_cuda_graphs()


@pytest.mark.parametrize("dtype", DTYPES)
@torch.inference_mode()
def test_decode_replay_is_the_eager_step(dtype):
    eager = build_model(CFG, device=DEVICE, dtype=dtype, seed=3)
    graphed = build_model(CFG, device=DEVICE, dtype=dtype, seed=3).use_cuda_graphs(buckets=(1, 4))
    plain, fast, same = (filled_cache(dtype, 6, seed=4) for _ in range(3))
    slots = torch.tensor([4, 1, 5])  # 3 requests: bucket 4, one padding row
    offsets = torch.tensor([0, 2, 1])
    tokens = torch.tensor([7, 300, 257_151])
    num_valid = plain.valid[slots, :P].sum(dim=1).cpu()
    for step in range(4):
        index, positions = P + offsets + step, num_valid + offsets + step
        expected = eager.decode_step(plain, slots, tokens, index, positions)
        replayed = decode_logits(graphed, fast, DecodeIndex(fast, slots, index, positions), tokens)[0].clone()
        # the function the graph captured (4 rows, the first repeated), run eagerly on a third cache: the same
        # computation on the same inputs, within rounding (a capture may pick other GEMM kernels)
        args = [_padded(t.to(DEVICE), 4) for t in (slots, slots, tokens, index, positions)]
        direct = eager.backbone.logits(eager._decode_layers(same, *args, same.max_len))[:3]
        torch.testing.assert_close(replayed, direct, **tolerance(dtype))
        if dtype == torch.float32:
            torch.testing.assert_close(replayed, expected, **tolerance(dtype))
        assert_same_choice(replayed, expected)
        tokens = replayed.float().argmax(dim=-1).cpu()
    assert graphed._graphs.captures == 1
    assert torch.equal(plain.valid, fast.valid)
    torch.testing.assert_close(fast.k.float(), plain.k.float(), **tolerance(dtype))
    # one request (slot 2, untouched so far) takes bucket 1, and decode_next picks its own logits' maximum
    one, first = torch.tensor([2]), P + torch.tensor([0])
    start = plain.valid[one, :P].sum(dim=1).cpu()
    expected = eager.decode_step(plain, one, tokens[:1], first, start)
    replayed = graphed.decode_step(fast, one, tokens[:1], first, start)
    assert_same_choice(replayed, expected)
    assert torch.equal(graphed.decode_next(fast, one, tokens[:1], first, start).cpu(), replayed.argmax(dim=-1).cpu())
    assert graphed._graphs.captures == 2
    # five requests exceed every bucket: the eager step (slot 2 is left out: only `fast` decoded it; the others'
    # K/V came from replays in `fast` and from the direct calls in `same`, alike within rounding)
    five = torch.tensor([0, 1, 3, 4, 5])
    index = torch.full((5,), P + 6)
    positions = plain.valid[five, :P].sum(dim=1).cpu() + 6
    torch.testing.assert_close(graphed.decode_step(fast, five, torch.arange(5), index, positions),
                               eager.decode_step(same, five, torch.arange(5), index, positions), **tolerance(dtype))
    assert graphed._graphs.captures == 2


@pytest.mark.parametrize("dtype", DTYPES)
@torch.inference_mode()
def test_denoise_replay_matches_the_eager_loop(dtype):
    eager = build_model(CFG, device=DEVICE, dtype=dtype, seed=5)
    graphed = build_model(CFG, device=DEVICE, dtype=dtype, seed=5).use_cuda_graphs(buckets=(1, 4))
    frames, _ = synthetic_frames(CFG, 3, seed=6, device=DEVICE, dtype=dtype)
    cache = KVCache(CFG, num_slots=3, max_len=P, dtype=dtype, device=DEVICE)
    for slot, inputs in enumerate(frames):
        eager.prefill(inputs, cache, torch.tensor([slot]))
    gen = torch.Generator().manual_seed(7)
    for slots in ([0], [0, 1, 2], [2, 0, 1], [1]):  # bucket 1, bucket 4 (padded), scattered, bucket 1 again
        slots = torch.tensor(slots)
        for _ in range(2):  # a second replay of the same bucket reads its new inputs
            noise = torch.randn(len(slots), CFG.action_horizon, CFG.action_dim, generator=gen).to(DEVICE)
            expected = eager.sample_actions(cache, slots, noise, num_steps=10)
            actions = graphed.sample_actions(cache, slots, noise, num_steps=10)
            assert actions.shape == expected.shape and actions.dtype == torch.float32
            torch.testing.assert_close(actions, expected, **tolerance(dtype))
    assert graphed._graphs.captures == 2
    big = torch.randn(5, CFG.action_horizon, CFG.action_dim, generator=gen).to(DEVICE)
    cache5 = KVCache(CFG, num_slots=5, max_len=P, dtype=dtype, device=DEVICE)
    cache5.k.copy_(cache.k[:, [0, 1, 2, 0, 1]])
    cache5.v.copy_(cache.v[:, [0, 1, 2, 0, 1]])
    cache5.valid.copy_(cache.valid[[0, 1, 2, 0, 1]])
    torch.testing.assert_close(graphed.sample_actions(cache5, torch.arange(5), big, 10),
                               eager.sample_actions(cache5, torch.arange(5), big, 10), **tolerance(dtype))
    assert graphed._graphs.captures == 2  # five rows exceed every bucket: eager


@pytest.mark.parametrize("dtype", DTYPES)
@torch.inference_mode()
def test_prefill_replay_writes_the_eager_prefix(dtype):
    """The prefill graph (no logits) writes the eager prefill's K/V and validity and returns its valid lengths and
    last-token outputs, padded batch included; each (bucket, output kind) is captured once per cache."""
    eager = build_model(CFG, device=DEVICE, dtype=dtype, seed=8)
    graphed = build_model(CFG, device=DEVICE, dtype=dtype, seed=8).use_cuda_graphs(buckets=(1, 4))
    frames, _ = synthetic_frames(CFG, 3, seed=9, device=DEVICE, dtype=dtype)
    plain, fast = (KVCache(CFG, num_slots=5, max_len=P + 4, dtype=dtype, device=DEVICE) for _ in range(2))
    for order in ([0, 1, 2], [2, 0, 1], [1]):  # bucket 4 (one padding row), replayed, bucket 1
        batch = concat_inputs([frames[i] for i in order])
        slots = torch.tensor([4, 0, 3][: len(order)])
        expected = eager.prefill(batch, plain, slots, want_hidden=True)
        got = graphed.prefill(batch, fast, slots, want_hidden=True)
        assert torch.equal(got.num_valid, expected.num_valid)
        torch.testing.assert_close(got.hidden.float(), expected.hidden.float(), **tolerance(dtype))
        assert torch.equal(fast.valid, plain.valid)
        torch.testing.assert_close(fast.k.float(), plain.k.float(), **tolerance(dtype))
        torch.testing.assert_close(fast.v.float(), plain.v.float(), **tolerance(dtype))
    assert graphed._graphs.captures == 2
    assert graphed.prefill(batch, fast, torch.tensor([2]), want_logits=True).logits is not None  # eager
    assert graphed._graphs.captures == 2


def test_runtime_with_graphs_gives_the_eager_chunks_and_text():
    """Continuous batching (the threaded runtime: control and language streams) on the tiny model (float32) with
    graphs on, against the same run without: greedy text at float32's agreement rate, chunks within tolerance."""
    frames, noises = synthetic_frames(TINY, 7, seed=11, device=DEVICE)
    workload = Workload(frames, noises, arrivals("every_frame", 7), decode_len=6, num_steps=3, tokens_per_frame=2)
    runs = []
    for graphs in (False, True):
        model = build_model(TINY, device=DEVICE, seed=3)
        if graphs:
            model.use_cuda_graphs()
        runs.append(RUNNERS["continuous_batching"](model, workload, drain=True))
    assert model._graphs.captures >= 2
    eager, graphed = runs
    assert len(eager.texts) == 7 and model.dtype == torch.float32
    assert_texts_agree(graphed.texts, eager.texts, model.dtype)
    for frame in range(7):
        torch.testing.assert_close(graphed.actions[frame], eager.actions[frame], **tolerance(model.dtype))
