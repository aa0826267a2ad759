"""`Pi05Model.use_cpu_kernel` (`model/cpu_kernel.py`): the compiled decode step gives the eager step's logits (to
float32 rounding; bfloat16 to a rounding step), writes the same cache, and picks the same greedy tokens step after
step, in float32 and bfloat16, for every attention shape it has a path for; its greedy choice is the float argmax;
the head fused with the greedy choice picks what the eager head's logits pick, ties and bfloat16 rounding included;
it is built once per cache and chosen as `auto` / `on` / `off` say."""

import copy
import dataclasses
import os
import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from oxygen_ros.evaluation.bench.model_bench import random_inputs
from oxygen_ros.model import cpu_kernel
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.gemma import rope_cos_sin
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.sampling import Sampler, greedy_tokens

TINY = get_preset("tiny")


def with_heads(heads: int, kv_heads: int, head_dim: int):
    """tiny with other attention shapes (the expert attends to the backbone's K/V, so it gets them too)."""
    shape = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim}
    return dataclasses.replace(TINY, backbone=dataclasses.replace(TINY.backbone, **shape),
                               expert=dataclasses.replace(TINY.expert, **shape))


CONFIGS = {
    "tiny: 4 heads per K/V head": TINY,
    "8 heads per K/V head (the fullvocab and pi05 grouping)": with_heads(8, 1, 16),
    "16 heads per K/V head (two groups of 8)": with_heads(16, 1, 16),
    "head_dim 24 (not a multiple of 16), 2 K/V heads": with_heads(4, 2, 24),
}
DTYPES = [torch.float32, torch.bfloat16]


def models(config, dtype):
    """(eager, kernel) models with the same weights and an untied random text head, so greedy text moves on
    instead of echoing the fed token through the tied embedding."""
    pair = []
    for _ in range(2):
        model = build_model(config, dtype=dtype, seed=2)
        head = torch.randn(model.backbone.embed_tokens.weight.shape, generator=torch.Generator().manual_seed(5))
        model.backbone.set_text_head(head.to(dtype))
        pair.append(model)
    pair[1].use_cpu_kernel()
    return pair


def random_cache(config, dtype, num_slots: int, max_len: int, seed: int) -> KVCache:
    """Random K/V with a fifth of the positions invalid (padding anywhere, as a padded prompt leaves it)."""
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(config, num_slots=num_slots, max_len=max_len, dtype=dtype)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    cache.valid.copy_(torch.rand(cache.valid.shape, generator=gen) > 0.2)
    cache.valid[:, 0] = True
    return cache


STEP_SLOTS, STEP_TOKENS = torch.tensor([4, 1, 2, 0, 5]), torch.tensor([5, 900, 17, 3, 250])


def step_index(config):
    """The cache index each of STEP_SLOTS' requests is fed at."""
    return torch.tensor([650, config.prefix_len + 3, 520, config.prefix_len + 40, 600])


def assert_close_logits(actual, expected, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
    else:  # a bfloat16 rounding step of the largest logits at most, and in a few logits only (measured: 0 to 0.14
        # of them, mean difference under 6e-4 of the mean logit; leaving the fed token out of the attention gives 2e-3)
        difference = (actual - expected).abs()
        assert difference.max() <= expected.abs().max() * 2**-7
        assert difference.mean() <= expected.abs().mean() * 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", CONFIGS)
@torch.inference_mode()
def test_one_step_over_a_random_cache_matches_the_eager_step(name, dtype):
    config = CONFIGS[name]
    eager, kernel = models(config, dtype)
    caches = [random_cache(config, dtype, num_slots=6, max_len=700, seed=1) for _ in range(2)]
    # scattered slots; spans across the 512-key softmax blocks, one far inside the first block; 5 requests, so the
    # linear layers run both their 4-row blocks and a single row
    slots, index, tokens = STEP_SLOTS, step_index(config), STEP_TOKENS
    positions = index - 7
    expected = eager.decode_step(caches[0], slots, tokens, index, positions)
    actual = kernel.decode_step(caches[1], slots, tokens, index, positions)
    assert_close_logits(actual, expected, dtype)
    assert torch.equal(caches[1].valid, caches[0].valid)  # the fed positions marked, nothing else touched
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.02, "rtol": 0.02}
    torch.testing.assert_close(caches[1].k.float(), caches[0].k.float(), **tol)
    torch.testing.assert_close(caches[1].v.float(), caches[0].v.float(), **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_one_call_steps_tables_and_weights_follow_the_model(dtype):
    """The kernel's step reads RoPE from tables made once: each row is the eager table of that position, bit for
    bit. It reads the weights through pointers gathered once: a weight given new storage (as `.to()` does) is
    read from there on the next step, and the step still matches the eager one."""
    config = CONFIGS["8 heads per K/V head (the fullvocab and pi05 grouping)"]
    g = config.backbone
    positions = torch.tensor([0, 1, 37, 350, 699, 3, 500])
    for head_dim in (g.head_dim, 24, 256):  # 24: not a whole vector of 16, so an eager table has a scalar tail
        cos, sin = cpu_kernel.rope_tables(700, head_dim, config.rope_theta, dtype)
        for batch in (positions[:1], positions[1:2], positions[:5], positions):  # the step's own tables
            want_cos, want_sin = rope_cos_sin(batch[:, None], head_dim, config.rope_theta, dtype)
            assert torch.equal(cos[batch], want_cos.reshape(len(batch), -1))
            assert torch.equal(sin[batch], want_sin.reshape(len(batch), -1))
    eager, kernel = models(config, dtype)
    args = (torch.tensor([0, 1]), torch.tensor([9, 31]), torch.tensor([600, 650]), torch.tensor([590, 640]))
    kernel.decode_step(random_cache(config, dtype, num_slots=2, max_len=700, seed=2), *args)  # gathers its weights
    for model in (eager, kernel):  # a final norm and an up projection with new storage and other values
        with torch.no_grad():
            model.backbone.norm.weight.data = torch.full_like(model.backbone.norm.weight, 0.5)
            up = model.backbone.layers[1].mlp.up_proj
            up.weight.data = up.weight.data * 2
    caches = [random_cache(config, dtype, num_slots=2, max_len=700, seed=2) for _ in range(2)]
    assert_close_logits(kernel.decode_step(caches[1], *args), eager.decode_step(caches[0], *args), dtype)
    copied = copy.deepcopy(kernel)  # a copy (the benchmark's language model) reads its own weights
    assert copied._cpu.step_weights.backbone is copied.backbone
    assert copied._cpu.step_weights.embed.data_ptr() == copied.backbone.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CONFIGS)[:2])
@torch.inference_mode()
def test_greedy_text_equals_the_eager_models_step_after_step(name, dtype):
    config = CONFIGS[name]
    eager, kernel = models(config, dtype)
    slots = torch.tensor([2, 0, 1])
    inputs = random_inputs(config, 3, seed=3)
    caches = [KVCache(config, num_slots=3, max_len=config.prefix_len + 40, dtype=dtype) for _ in range(2)]
    first = [m.prefill(inputs, c, slots, want_logits=True) for m, c in zip((eager, kernel), caches)]
    fed = [first[0].logits.argmax(dim=-1)] * 2
    texts = [[], []]
    for step in range(30):
        index, positions = torch.full((3,), config.prefix_len + step), first[0].num_valid + step
        for i, (model, cache) in enumerate(zip((eager, kernel), caches)):
            fed[i] = model.decode_next(cache, slots, fed[i], index, positions)
            texts[i].append(fed[i].tolist())
    assert texts[1] == texts[0]
    assert len({token for step in texts[0] for token in step}) > 30  # real text, not one token repeated


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_choice_is_the_float_argmax(dtype):
    gen = torch.Generator().manual_seed(0)
    for n in (7, 1024, 1500, 5000):
        logits = torch.randn(7, n, generator=gen).to(dtype)
        logits[1] = -logits[1].abs() - 1  # every logit negative: searched as floats
        logits[2, 5] = logits[2].max() + 1
        logits[2, n - 1] = logits[2, 5]  # a tie: the first index wins
        logits[3] = 0  # all zero
        logits[4] = 3.0  # constant
        logits[5, n - 1] = logits[5].max() + 1  # the maximum in the tail after the last whole block
        expected = logits.float().argmax(dim=-1)
        assert torch.equal(cpu_kernel.greedy_tokens(logits), expected)
        rows = logits[:, 1:]  # rows further apart than their length
        assert torch.equal(cpu_kernel.greedy_tokens(rows), rows.float().argmax(dim=-1))


# (dtype, matrix tiles): float32 on tiles is screened with the head's bfloat16 copy
HEAD_PATHS = [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, True)]


def needs_tiles(amx: bool) -> None:
    if amx and not cpu_kernel.has_amx():
        pytest.skip("this CPU has no AMX tiles (the vector path is tested on every CPU)")


def fused(h, head, threads, amx):
    """`head_greedy` on the path asked for, with the head's copy where float32 runs on tiles."""
    copy = cpu_kernel.head_copy(head) if amx and head.dtype == torch.float32 else None
    return cpu_kernel.head_greedy(h, head, threads, amx, copy=copy)


@pytest.mark.parametrize(("dtype", "amx"), HEAD_PATHS)
def test_fused_head_picks_what_the_eager_heads_logits_pick(dtype, amx):
    """`head_greedy` against `greedy_tokens(h @ head.T)` in the model's dtype: batches across its 16-request
    vectors and 64-request passes, a vocabulary with rows after the last whole tile of 16, widths that are and are
    not whole tiles (on vector lanes, an odd one that bfloat16's pair dot products leave to the widened path), one
    to three threads."""
    needs_tiles(amx)
    gen = torch.Generator().manual_seed(0)
    for width in (64, 96) if amx else (64, 40, 41):  # 41: bfloat16 without pair dot products
        head = torch.randn(16 * 300 + 5, width, generator=gen).to(dtype)
        for batch in (1, 2, 3, 15, 16, 17, 50, 64, 65, 130):  # 1-3: row by row where the build has it
            h = torch.randn(batch, width, generator=gen).to(dtype)
            expected = greedy_tokens(h @ head.T)
            for threads in (1, 2, 3):
                assert torch.equal(fused(h, head, threads, amx), expected), (width, batch, threads)


@pytest.mark.parametrize(("dtype", "amx"), HEAD_PATHS)
def test_fused_head_keeps_the_first_of_equal_logits(dtype, amx):
    """Equal logits resolve to the first index, within a tile, across tiles and across threads' ranges; in
    bfloat16, logits that differ in float32 but round to one bfloat16 value are equal, as the eager logits are."""
    needs_tiles(amx)
    vocab, width = 16 * 64, 64
    head = torch.zeros(vocab, width)
    head[:, 1] = -1.0  # every other row scores below the planted ones
    h = torch.zeros(3, width)
    h[:, 0], h[:, 1] = 1.0, 2.0**-9
    for row in (3, 5, 40, 900):  # 3 and 5 share a tile; 900 is in the last thread's range
        head[row, 0] = 1.0
    head[5, 1] = 0.0  # the first maximum in float32 arithmetic: 1.0 against 1.0 - 2^-9 for rows 3, 40, 900
    head[900, 1] = 1.0  # 1 + 2^-9: the largest, yet 1.0 once rounded to bfloat16 (2^-7 apart there)
    h[1] = 0.0  # request 1: every logit 0: the first index
    h[2] = -h[2]  # request 2: the planted rows score lowest; the others tie at 2^-9
    h, head = h.to(dtype), head.to(dtype)
    expected = greedy_tokens(h @ head.T)
    assert expected.tolist() == ([900 if dtype == torch.float32 else 3, 0, 0])
    for threads in (1, 2, 4):
        assert torch.equal(fused(h, head, threads, amx), expected)


def test_the_kept_worker_threads_serve_concurrent_callers_and_forked_children():
    """The fused head's threads are kept between calls: two Python threads calling it at once (one has the kept
    workers, the other starts its own), calls with fewer and more threads than are kept, and a child forked from a
    process that has workers (it has none of them and must make its own) all get the eager head's tokens."""
    import threading

    gen = torch.Generator().manual_seed(3)
    head = torch.randn(16 * 200 + 3, 64, generator=gen)
    hs = [torch.randn(b, 64, generator=gen) for b in (1, 2, 5, 17)]
    expected = [greedy_tokens(h @ head.T) for h in hs]
    for threads in (2, 4, 3, 1, 2):  # grows the kept workers, then uses fewer of them
        for h, want in zip(hs, expected):
            assert torch.equal(cpu_kernel.head_greedy(h, head, threads), want)
    wrong = []

    def caller(threads: int) -> None:
        for _ in range(40):
            for h, want in zip(hs, expected):
                if not torch.equal(cpu_kernel.head_greedy(h, head, threads), want):
                    wrong.append(threads)

    callers = [threading.Thread(target=caller, args=(t,)) for t in (2, 3, 2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in callers) and not wrong
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's workers are not here
        ok = all(torch.equal(cpu_kernel.head_greedy(h, head, 2), want) for h, want in zip(hs, expected))
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1" and status == 0
    os.close(read)


def test_fused_head_refuses_what_it_cannot_run(monkeypatch):
    h, head = torch.zeros(2, 40, dtype=torch.bfloat16), torch.zeros(32, 40, dtype=torch.bfloat16)
    if cpu_kernel.has_amx():  # tiles need whole 32-wide pieces of the width
        with pytest.raises(ValueError, match="no matrix tiles"):
            cpu_kernel.head_greedy(h, head, 1, amx=True)
    if cpu_kernel.has_amx():  # float32 on tiles: screened with the head's copy, so not without one
        h32, head32 = torch.zeros(2, 64), torch.zeros(32, 64)
        with pytest.raises(ValueError, match="needs its head_copy"):
            cpu_kernel.head_greedy(h32, head32, 1, amx=True)
        with pytest.raises(ValueError, match="needs its head_copy"):
            cpu_kernel.head_greedy(h32, head32, 1, amx=True, copy=cpu_kernel.head_copy(head32[:16]))
        with pytest.raises(ValueError, match="no matrix tiles"):
            cpu_kernel.head_greedy(h.float(), head.float(), 1, amx=True, copy=cpu_kernel.head_copy(head.float()))
    h32, head32 = torch.zeros(2, 41), torch.zeros(32, 41)  # pairs need an even width, or the build to have them
    with pytest.raises(ValueError, match="no pair dot products"):
        cpu_kernel.head_greedy(h32, head32, 1, amx=False, copy=cpu_kernel.head_copy(head32))
    with pytest.raises(ValueError, match="contiguous float32"):
        cpu_kernel.head_copy(head)
    with pytest.raises(ValueError, match="one float dtype"):
        cpu_kernel.head_greedy(h, head.float())
    with pytest.raises(ValueError, match="one float dtype"):
        cpu_kernel.head_greedy(h[:, :8], head)
    # which steps take the fused head: any on tiles; on vector lanes from HEAD_GREEDY_MIN_ROWS requests, float32,
    # and bfloat16 only where the build has the pair dot products (and the width is even)
    # and below it only where the build runs those few requests row by row
    few = cpu_kernel.HEAD_GREEDY_MIN_ROWS
    assert few == cpu_kernel.load().oxy_head_rows_below()  # the kernel's own threshold for the row path
    for tiles in (True, False):
        monkeypatch.setattr(cpu_kernel, "has_amx", lambda tiles=tiles: tiles)
        for pairs in (True, False):
            monkeypatch.setattr(cpu_kernel, "has_pair_head", lambda pairs=pairs: pairs)
            for by_rows in (True, False):
                monkeypatch.setattr(cpu_kernel, "has_row_head", lambda dtype, width, by_rows=by_rows: by_rows)
                for dtype in DTYPES:
                    assert cpu_kernel.head_greedy_pays(dtype, few - 1, 40) is by_rows
                for dtype in DTYPES:  # one request too
                    assert cpu_kernel.head_greedy_pays(dtype, 1, 64) is (tiles or by_rows)
                assert cpu_kernel.head_greedy_pays(torch.bfloat16, 50, 40) is pairs
                assert not cpu_kernel.head_greedy_pays(torch.bfloat16, 50, 41)
                assert cpu_kernel.head_greedy_pays(torch.float32, few, 40)


@pytest.fixture(scope="module")
def narrower_builds():
    """The kernel built for the x86-64 levels below this CPU's (AVX-512 where it has it, AVX2, SSE4.2), compiled
    side by side: each compiler run is single-threaded and takes tens of seconds on a fresh machine's first run
    (the builds are then in the user cache)."""
    if platform.machine() != "x86_64":
        return {}
    marches = [m for m in ("x86-64-v4", "x86-64-v3", "x86-64-v2")
               if m != "x86-64-v4" or "avx512f" in cpu_kernel.cpu_flags()]
    with ThreadPoolExecutor(len(marches)) as pool:
        return dict(zip(marches, pool.map(cpu_kernel.load, marches)))


def test_the_pair_and_row_heads_are_built_where_the_cpu_has_them(narrower_builds):
    """The bfloat16 head's pair dot products are in the kernel built for this machine exactly where its CPU has
    AVX-512 BF16, the row path for few requests where it has AVX-512 (float32, widths of whole 16s; bfloat16 with
    the pair dot products, whole 32s) or AVX2 with FMA (float32, whole 8s: the AVX2 head) and the AVX2 paths where
    it has AVX2 with FMA but no AVX-512: then the tests above run them. The AVX2 build has the AVX2 paths and no
    pairs; the SSE4.2 build has none of them; an AVX-512 build without BF16 has only the float32 row path."""
    flags = cpu_kernel.cpu_flags()
    pairs = {"avx512f", "avx512_bf16"} <= flags
    avx2 = {"avx2", "fma"} <= flags and "avx512f" not in flags
    assert cpu_kernel.has_pair_head() == pairs and cpu_kernel.has_avx2() == avx2
    for dtype, width, built in ((torch.float32, 64, "avx512f" in flags or avx2), (torch.float32, 40, avx2),
                                (torch.float32, 36, False), (torch.bfloat16, 64, pairs), (torch.bfloat16, 48, False)):
        assert cpu_kernel.has_row_head(dtype, width) == built, (dtype, width)
    if platform.machine() == "x86_64":
        v3 = narrower_builds["x86-64-v3"]  # AVX2 and FMA: the float32 head's 8-lane path, at any batch
        assert v3.oxy_has_avx2() and v3.oxy_has_row_head(0, 64) and v3.oxy_has_row_head(0, 40)
        assert not v3.oxy_has_pair_head() and not v3.oxy_has_row_head(1, 64) and not v3.oxy_has_row_head(0, 36)
        v2 = narrower_builds["x86-64-v2"]
        assert not v2.oxy_has_pair_head() and not v2.oxy_has_row_head(0, 64) and not v2.oxy_has_avx2()
        if "avx512f" in flags:  # AVX-512 without BF16: the float32 row path only
            v4 = narrower_builds["x86-64-v4"]
            assert not v4.oxy_has_pair_head() and v4.oxy_has_row_head(0, 64) and not v4.oxy_has_row_head(1, 64)


def lanes(h, head, threads=1):
    return cpu_kernel.head_greedy(h, head, threads, amx=False)


# where a float32 head is screened on its bfloat16 copy: matrix tiles (amx=True), AVX-512 BF16's pair dot products
SCREENS = {"tiles": True, "pairs": False}


def needs_screen(screen: str) -> bool:
    """The `amx` argument that screens on `screen`; skips where this CPU has no such screen."""
    if screen == "tiles":
        needs_tiles(True)
    elif not cpu_kernel.has_pair_head():
        pytest.skip("this CPU has no AVX-512 BF16 pair dot products (the vector path is tested on every CPU)")
    return SCREENS[screen]


@pytest.mark.parametrize("screen", SCREENS)
def test_the_screened_float32_head_picks_the_vector_lanes_token_bit_for_bit(screen):
    """float32 on tiles or pair dot products: rows the bfloat16 screen cannot tell apart (relative gaps of 1e-7 to 1e-3, far inside a
    bfloat16 step) are chosen in float32, before and after the best row, within a tile, across tiles and threads'
    ranges and in the rows after the last whole tile: the vector lanes' token every time, and where the gap is
    larger than float32's own rounding the float64 argmax."""
    amx = needs_screen(screen)
    gen = torch.Generator().manual_seed(5)
    vocab, width = 16 * 400 + 7, 64
    head = torch.randn(vocab, width, generator=gen)
    h = torch.randn(65, width, generator=gen)
    best = (h @ head.T).argmax(dim=-1)
    places = (0, 1, best.tolist()[0] + 1, 2000, 3199, 3200, 6399, vocab - 1)  # 3200: the second of two ranges
    for gap in (1e-7, 1e-6, 1e-5, 1e-4, 1e-3):
        planted = head.clone()
        for b in range(len(places)):  # request b's best row, scaled copies planted around the vocabulary
            for i, place in enumerate(places):
                if place != best[b]:
                    planted[place] = head[best[b]] * (1 + gap * (i - b))
        copy = cpu_kernel.head_copy(planted)
        exact = (h.double() @ planted.double().T).argmax(dim=-1)
        for threads in (1, 2, 3):
            got = cpu_kernel.head_greedy(h, planted, threads, amx=amx, copy=copy)
            assert torch.equal(got, lanes(h, planted, threads)), (gap, threads)
            if gap >= 1e-4:
                assert torch.equal(got, exact), (gap, threads)


@pytest.mark.parametrize("screen", SCREENS)
def test_the_screened_float32_head_bound_covers_the_worst_bfloat16_rounding(screen):
    """Rows built so that bfloat16 rounding moves their sums as far as it can, opposite ways: row P's factors all
    round up, row Q's all down, so Q's screened sum is 0.49 below P's while Q's float32 sum is the larger. The
    screen must keep Q: request 0 has h and both rows of one magnitude (Q's sum within two bounds of P's);
    request 1 puts Q's weight on small h entries times a large row (Q's sum below P's lower bound, only its own
    larger bound keeps it: the block holding it must not be skipped on P's bound). P comes first, in one thread's
    range with Q or in the one before."""
    amx = needs_screen(screen)
    u, t = 2.0**-8, 2.0**-16  # above 1 + u a bfloat16 rounds up to 1 + 2u, below it down to 1
    width, vocab = 128, 16 * 100
    head = torch.randn(vocab, width, generator=torch.Generator().manual_seed(8)) * 0.01
    h = torch.zeros(2, width, dtype=torch.float64)
    for b, scale in ((0, 1.0), (1, 2.0**-3)):
        cols = slice(64 * b, 64 * b + 64)
        p_cols, q_cols = slice(64 * b, 64 * b + 32), slice(64 * b + 32, 64 * b + 64)
        h[b, p_cols], h[b, q_cols] = 1 + u + t, scale * (1 + u - t)
        p, q = torch.zeros(width, dtype=torch.float64), torch.zeros(width, dtype=torch.float64)
        p[p_cols], q[q_cols] = 1 + u + t, (1 + u - t) / scale
        p[64 * b] -= 0.003  # P's float32 sum just below Q's
        head[(40, 840)[b], cols], head[(1100, 1300)[b], cols] = p[cols].float(), q[cols].float()
    h = h.float()
    exact = (h.double() @ head.double().T)
    assert exact.argmax(dim=-1).tolist() == [1100, 1300]  # the Q rows
    approx = h.bfloat16().double() @ head.bfloat16().double().T
    assert approx.argmax(dim=-1).tolist() == [40, 840]  # the P rows, by 0.49
    copy = cpu_kernel.head_copy(head)
    for threads in (1, 2):
        assert cpu_kernel.head_greedy(h, head, threads, amx=amx, copy=copy).tolist() == [1100, 1300]


@pytest.mark.parametrize("screen", SCREENS)
def test_the_screened_float32_head_with_many_rows_near_the_top(screen):
    """A run of rows each a little above the last (every one a new best when seen: the kept rows are pruned as the
    screen's lower bound rises), and many equal best rows (more than the screen keeps: those requests are searched
    on vector lanes): the vector lanes' tokens, the last of the run and the first of the equal rows."""
    amx = needs_screen(screen)
    gen = torch.Generator().manual_seed(6)
    vocab, width = 16 * 300, 64
    h = torch.zeros(3, width)
    h[:, 0] = 1.0
    h[1, 1] = 1.0
    h[2] = torch.randn(width, generator=gen)
    head = torch.randn(vocab, width, generator=gen) * 0.01
    head[100:2100, 0] = 1.0 + torch.arange(2000) * 2e-4  # request 0: a rising run of 2000 rows, ~100 within a bound
    head[3000:4000] = 0.0
    head[3000:4000, 1] = 2.0  # request 1: 1000 equal rows (and above the run)
    copy = cpu_kernel.head_copy(head)
    for threads in (1, 2):
        got = cpu_kernel.head_greedy(h, head, threads, amx=amx, copy=copy)
        assert got[:2].tolist() == [2099, 3000]
        assert torch.equal(got, lanes(h, head, threads))


@pytest.mark.parametrize("screen", SCREENS)
def test_the_screened_float32_head_leaves_unbounded_inputs_to_the_vector_lanes(screen):
    """Hidden states or heads whose products could leave float32's range (or are not finite) are not screened: the
    same tokens as the vector lanes, NaN and infinity included."""
    amx = needs_screen(screen)
    gen = torch.Generator().manual_seed(7)
    head, h = torch.randn(16 * 40 + 3, 64, generator=gen), torch.randn(4, 64, generator=gen)
    cases = []
    big = h.clone()
    big[1] *= 1e36  # its products overflow no float32, its bounds would
    cases.append((big, head))
    odd = h.clone()
    odd[2, 5], odd[3, 7] = float("inf"), float("nan")
    cases.append((odd, head))
    huge_row = head.clone()
    huge_row[17] = 3e38
    cases.append((h, huge_row))
    for hs, hd in cases:
        assert torch.equal(cpu_kernel.head_greedy(hs, hd, 2, amx=amx, copy=cpu_kernel.head_copy(hd)),
                           lanes(hs, hd, 2))


def test_the_model_keeps_one_head_copy_until_the_head_changes(monkeypatch):
    """A float32 model on tiles makes its head's copy when the kernel is turned on and reuses it step after step; a
    head changed in place (new weights loaded) gets a new copy, so the tokens follow the new head."""
    if not cpu_kernel.screens(torch.float32, 64):
        pytest.skip("this CPU has neither AMX tiles nor AVX-512 BF16 to screen on (the vector path is tested everywhere)")
    made = []
    real = cpu_kernel.head_copy
    monkeypatch.setattr(cpu_kernel, "head_copy", lambda head: made.append(1) or real(head))
    config = CONFIGS["8 heads per K/V head (the fullvocab and pi05 grouping)"]
    eager, kernel = models(config, torch.float32)
    caches = [random_cache(config, torch.float32, num_slots=6, max_len=700, seed=2) for _ in range(2)]
    slots, index, tokens = torch.arange(6), torch.full((6,), 600), torch.tensor([5, 9, 17, 3, 40, 2])
    step = [lambda m=m, c=c: torch.inference_mode()(m.decode_next)(c, slots, tokens, index, index - 7)
            for m, c in zip((eager, kernel), caches)]
    for _ in range(3):
        assert torch.equal(step[1](), step[0]())
    assert len(made) == 1  # when the kernel was turned on
    vocab, width = kernel.backbone.text_head.shape
    assert kernel.memory_bytes() - eager.memory_bytes() == vocab * width * 2 + vocab * 4  # counted as the model's
    with torch.no_grad():
        for model in (eager, kernel):
            model.backbone.text_head.mul_(-1.0)
    assert torch.equal(step[1](), step[0]())
    assert len(made) == 2


@pytest.mark.parametrize("dtype", DTYPES)
@torch.inference_mode()
def test_greedy_text_through_the_fused_head_equals_the_eager_models(dtype, monkeypatch):
    """A batch large enough for the fused head in either dtype (forced on, so the vector path runs in bfloat16 on a
    CPU without tiles too): 30 greedy steps give the eager model's tokens, and the fused head made every one."""
    monkeypatch.setattr(cpu_kernel, "head_greedy_pays", lambda dtype, rows, width: True)
    calls = []
    real = cpu_kernel.head_greedy
    monkeypatch.setattr(cpu_kernel, "head_greedy", lambda *a, **k: calls.append(1) or real(*a, **k))
    config = CONFIGS["8 heads per K/V head (the fullvocab and pi05 grouping)"]
    eager, kernel = models(config, dtype)
    n = 17
    slots = torch.arange(n).flip(0)
    inputs = random_inputs(config, n, seed=4)
    caches = [KVCache(config, num_slots=n, max_len=config.prefix_len + 32, dtype=dtype) for _ in range(2)]
    first = eager.prefill(inputs, caches[0], slots, want_logits=True)
    kernel.prefill(inputs, caches[1], slots)
    fed = [first.logits.argmax(dim=-1)] * 2
    texts = [[], []]
    for step in range(30):
        index, positions = torch.full((n,), config.prefix_len + step), first.num_valid + step
        for i, (model, cache) in enumerate(zip((eager, kernel), caches)):
            fed[i] = model.decode_next(cache, slots, fed[i], index, positions)
            texts[i].append(fed[i].tolist())
    assert texts[1] == texts[0]
    assert len(calls) == 30
    assert len({token for step in texts[0] for token in step}) > 100
    # a sampled request in the batch: its row needs logits, so the step takes torch's head (and the greedy rows
    # still get the eager model's tokens)
    samplers = [None] * n
    samplers[3] = Sampler(1.0, torch.Generator().manual_seed(0))
    index, positions = torch.full((n,), config.prefix_len + 30), first.num_valid + 30
    chosen = [model.decode_next(cache, slots, fed[i], index, positions, samplers)
              for i, (model, cache) in enumerate(zip((eager, kernel), caches))]
    assert len(calls) == 30
    greedy_rows = torch.arange(n) != 3
    assert torch.equal(chosen[1][greedy_rows], chosen[0][greedy_rows])


@torch.inference_mode()
def test_bad_indices_and_unsupported_models_are_refused():
    model = build_model(TINY, seed=0).use_cpu_kernel()
    cache = KVCache(TINY, num_slots=2, max_len=TINY.prefix_len + 4)
    x = torch.zeros(1, TINY.backbone.width)
    rope = torch.zeros(1, TINY.backbone.head_dim)
    weights = cpu_kernel.layer_weights(model.backbone.layers)
    for slot, index, span in ((2, TINY.prefix_len, TINY.prefix_len + 1),  # no such slot
                              (0, TINY.prefix_len + 1, TINY.prefix_len + 1),  # index past the span
                              (0, TINY.prefix_len, TINY.prefix_len + 5)):  # span past the cache
        before = cache.valid.clone()
        with pytest.raises(ValueError, match="out of range"):
            cpu_kernel.decode_layers(x, weights, TINY, cache, torch.tensor([slot]), torch.tensor([index]), rope,
                                     rope, span)
        assert torch.equal(cache.valid, before)  # nothing written
    # the whole step in one call also refuses a token outside the vocabulary and a position outside its tables
    tables = cpu_kernel.rope_tables(TINY.prefix_len + 4, TINY.backbone.head_dim, TINY.rope_theta, torch.float32)
    step_weights = cpu_kernel.StepWeights(model.backbone)
    for token, position in ((TINY.vocab_size, 3), (-1, 3), (3, TINY.prefix_len + 4), (3, -1)):
        before = (cache.valid.clone(), cache.k.clone())
        with pytest.raises(ValueError, match="token or a RoPE position is out of range"):
            cpu_kernel.decode_step(torch.tensor([token]), step_weights, TINY, cache, torch.tensor([0]),
                                   torch.tensor([TINY.prefix_len]), torch.tensor([position]), TINY.prefix_len + 1,
                                   tables)
        assert torch.equal(cache.valid, before[0]) and torch.equal(cache.k, before[1])
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        build_model(TINY, dtype=torch.float16).use_cpu_kernel()
    with pytest.raises(ValueError, match="cache in the model's dtype"):
        model.decode_step(KVCache(TINY, num_slots=1, max_len=TINY.prefix_len + 2, dtype=torch.bfloat16),
                          torch.tensor([0]), torch.tensor([3]), torch.tensor([TINY.prefix_len]), torch.tensor([5]))


def test_auto_on_and_off(monkeypatch):
    real_load = cpu_kernel.load
    monkeypatch.setattr(cpu_kernel, "cpu_flags", lambda: {"avx512f"})  # auto's CPU check passes
    model = build_model(TINY, seed=0)
    assert cpu_kernel.apply(model, "off") == "off (as configured)" and not model.uses_cpu_kernel
    assert cpu_kernel.apply(model, "auto") == "on (auto)" and model.uses_cpu_kernel
    assert cpu_kernel.apply(build_model(TINY, seed=0), "on") == "on"
    half = build_model(TINY, dtype=torch.float16)
    assert cpu_kernel.apply(half, "auto").startswith("off (auto: the CPU kernel runs float32 or bfloat16")
    assert not half.uses_cpu_kernel
    with pytest.raises(ValueError):
        cpu_kernel.apply(half, "on")
    with pytest.raises(ValueError, match="unknown cpu_kernel choice"):
        cpu_kernel.apply(model, "yes")

    def no_compiler():
        raise cpu_kernel.CpuKernelUnavailable("no C++ compiler found")

    monkeypatch.setattr(cpu_kernel, "load", no_compiler)
    fallback = build_model(TINY, seed=0)
    assert cpu_kernel.apply(fallback, "auto") == "off (auto: no C++ compiler found)"
    assert not fallback.uses_cpu_kernel
    with pytest.raises(cpu_kernel.CpuKernelUnavailable):
        cpu_kernel.apply(fallback, "on")
    monkeypatch.setattr(cpu_kernel, "load", real_load)
    monkeypatch.setattr(cpu_kernel, "cpu_flags", lambda: {"avx2", "fma"})  # AVX2 with FMA: its 8-lane paths
    for dtype in DTYPES:
        avx2 = build_model(TINY, dtype=dtype, seed=0)
        assert cpu_kernel.apply(avx2, "auto") == "on (auto)" and avx2.uses_cpu_kernel
    refusal = "this CPU has neither AVX-512 nor AVX2 with FMA, the vector widths the kernel was measured on"
    for flags in ({"sse4_2", "avx"}, {"avx2"}, {"fma"}):  # narrower: auto keeps the eager step, on runs the kernel
        monkeypatch.setattr(cpu_kernel, "cpu_flags", lambda flags=flags: flags)
        for dtype in DTYPES:
            plain = build_model(TINY, dtype=dtype, seed=0)
            assert cpu_kernel.apply(plain, "auto") == f"off (auto: {refusal})" and not plain.uses_cpu_kernel
            assert cpu_kernel.apply(plain, "on") == "on" and plain.uses_cpu_kernel
    monkeypatch.setattr(cpu_kernel.shutil, "which", lambda name: None)
    with pytest.raises(cpu_kernel.CpuKernelUnavailable, match="no C\\+\\+ compiler"):
        cpu_kernel.compiler()


def test_built_once_into_the_user_cache_then_loaded(tmp_path):
    """A fresh user cache and two processes starting together: one runs the compiler, once, with the kernel's flags,
    into a temporary file it then renames into the cache; the other waits for that file instead of building its
    own; a later process loads it without running the compiler. The compiler here ($CXX, which `compiler()` takes
    first) records its call, takes its time, and writes the library this run has already built (compiling it again
    would take a CPU-minute on a fresh machine; the build itself is what every other test of the kernel loads)."""
    built_here = cpu_kernel.load()._name
    calls = tmp_path / "calls"
    cxx = tmp_path / "cxx"
    cxx.write_text("#!/bin/sh\n"
                   f'echo "$*" >> "{calls}"\n'
                   'while [ "$#" -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
                   f'sleep 3; cp "{built_here}" "$out"\n')
    cxx.chmod(0o755)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "CXX": str(cxx)}
    script = "from oxygen_ros.model import cpu_kernel; print(cpu_kernel.load()._name)"
    together = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
                for _ in range(2)]
    paths = {process.communicate(timeout=300)[0].strip() for process in together}
    assert [process.returncode for process in together] == [0, 0] and len(paths) == 1
    [path] = paths
    assert path.startswith(str(tmp_path / "cache" / "oxygen_ros" / "cpu_kernel-")) and path.endswith(".so")
    [call] = calls.read_text().splitlines()
    assert call.startswith(" ".join(cpu_kernel.flags("native")) + " -o ")
    assert call.endswith(".tmp " + str(cpu_kernel.SOURCE)) and os.path.basename(path) in call
    built = os.stat(path).st_mtime_ns
    later = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert later.stdout.strip() == path and os.stat(path).st_mtime_ns == built
    assert len(calls.read_text().splitlines()) == 1  # loaded, not built again
    # neither a temporary file nor the lock is left
    assert [p.name for p in (tmp_path / "cache" / "oxygen_ros").iterdir()] == [os.path.basename(path)]


@torch.inference_mode()
def test_logits_the_caller_keeps_are_not_overwritten_by_the_next_step():
    """A CPU decode step reuses one logits buffer (eager or kernel); `decode_step`'s float32 logits must be the
    caller's own."""
    for model in models(TINY, torch.float32):
        cache = random_cache(TINY, torch.float32, num_slots=2, max_len=TINY.prefix_len + 4, seed=2)
        slots, index = torch.tensor([0, 1]), torch.full((2,), TINY.prefix_len)
        first = model.decode_step(cache, slots, torch.tensor([5, 6]), index, index)
        kept = first.clone()
        model.decode_step(cache, slots, torch.tensor([7, 8]), index + 1, index + 1)
        assert torch.equal(first, kept)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 instruction-set levels")
# AVX-512 without AVX-512 BF16 (Skylake-X, Ice Lake: the row path in float32, bfloat16 widened); AVX2 (desktop CPUs
# without AVX-512); SSE4.2
@pytest.mark.parametrize("march", ["x86-64-v4", "x86-64-v3", "x86-64-v2"])
@torch.inference_mode()
def test_the_kernel_built_for_narrower_vectors_gives_the_same_step(march, monkeypatch, narrower_builds):
    """The kernel built for CPUs without AVX-512 BF16 (AVX-512 alone; or without AVX-512: on AVX2 its 8-lane
    paths for the layers, attention and the float32 head; on SSE4.2 its 16-lane vectors lowered): the same checks
    against the eager step as above, for every attention shape, in both dtypes, with the greedy choice too."""
    if march == "x86-64-v4" and "avx512f" not in cpu_kernel.cpu_flags():
        pytest.skip("an AVX-512 build runs only on a CPU with AVX-512 (the narrower builds run everywhere)")
    narrow = narrower_builds[march]
    assert narrow is cpu_kernel.load(march) and narrow is not cpu_kernel.load()
    monkeypatch.setattr(cpu_kernel, "load", lambda: narrow)
    for config in CONFIGS.values():
        for dtype in DTYPES:
            eager, kernel = models(config, dtype)
            caches = [random_cache(config, dtype, num_slots=6, max_len=700, seed=1) for _ in range(2)]
            slots, index, tokens = STEP_SLOTS, step_index(config), STEP_TOKENS
            expected = eager.decode_step(caches[0], slots, tokens, index, index - 7)
            assert_close_logits(kernel.decode_step(caches[1], slots, tokens, index, index - 7), expected, dtype)
            assert torch.equal(kernel.decode_next(caches[1], slots, tokens, index + 1, index - 6),
                               eager.decode_next(caches[0], slots, tokens, index + 1, index - 6))
    for dtype in DTYPES:
        gen = torch.Generator().manual_seed(3)
        h, head = torch.randn(50, 64, generator=gen).to(dtype), torch.randn(1000, 64, generator=gen).to(dtype)
        assert not narrow.oxy_has_amx()
        assert torch.equal(cpu_kernel.head_greedy(h, head, 2), greedy_tokens(h @ head.T))
        winner = int(greedy_tokens(h[:1] @ head.T)[0])  # equal rows before and after it (a partial last block)
        tied = torch.cat([head, head[winner:winner + 1]])
        tied[3] = head[winner]
        assert cpu_kernel.head_greedy(h[:1], tied, 2).tolist() == [min(3, winner)]
