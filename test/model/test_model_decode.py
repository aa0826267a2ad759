"""The fast decode path against the plain one: `decode_next` picks exactly the tokens `decode_step`'s float32
logits give (greedy and seeded sampling), at pi0.5's real vocabulary, in float32 and bfloat16."""

import pytest
import torch

from oxygen_ros.model.config import get_preset
from oxygen_ros.model.gemma import attend, attend_one_query
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.sampling import GREEDY_BLOCK, Sampler, greedy_tokens, sample_token

CFG = get_preset("fullvocab")
P = CFG.prefix_len
DTYPES = (torch.float32, torch.bfloat16)


def filled_cache(dtype: torch.dtype, slots: int, seed: int) -> KVCache:
    """A cache whose prefixes hold random K/V with a few padding positions, as a prefill leaves it."""
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(CFG, num_slots=slots, max_len=P + 8, dtype=dtype)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    cache.valid[:, :P] = torch.rand(slots, P, generator=gen) > 0.1
    return cache


@pytest.mark.parametrize("dtype", DTYPES + (torch.float16,))
@pytest.mark.parametrize("vocab", [GREEDY_BLOCK // 2, 4 * GREEDY_BLOCK, 257_152])
def test_greedy_tokens_is_argmax_ties_included(dtype, vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(9, vocab, generator=gen).to(dtype)
    logits[1, :] = 0.0  # a row of ties: the first index wins
    logits[2, vocab - 1] = logits[2, 3] = 50.0  # tied maxima in the first block and in the tail (or last block)
    logits[3, vocab // 2] = logits[3, vocab // 2 + 1] = 60.0
    logits[4, vocab - 1] = 70.0  # the maximum alone at the very end
    logits[5] = -logits[5].abs() - 1.0  # every logit negative: the bits' integer order is reversed there
    logits[5, vocab - 2] = logits[5, vocab // 3] = -0.5
    logits[6] = -logits[6].abs()  # the maximum is zero, -0.0 before +0.0: equal floats, different bits
    logits[6, 7], logits[6, vocab - 3] = -0.0, 0.0
    logits[7] = logits[7].abs() + 1.0  # all positive, one tie between the first and the last block
    logits[7, 1] = logits[7, vocab - GREEDY_BLOCK // 4] = 9.0
    assert torch.equal(greedy_tokens(logits), logits.float().argmax(dim=-1))
    assert greedy_tokens(logits)[1] == 0 and greedy_tokens(logits)[2] == 3 and greedy_tokens(logits)[6] == 7


def test_one_query_attention_matches_the_per_head_attention():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(5, 8, 1, 16, generator=gen)
    k, v = torch.randn(2, 5, 2, 40, 16, generator=gen)
    mask = torch.rand(5, 1, 1, 40, generator=gen) > 0.3
    mask[..., 0] = True
    torch.testing.assert_close(attend_one_query(q, k, v, mask), attend(q, k, v, mask), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@torch.inference_mode()
def test_decode_next_picks_what_decode_step_logits_give(dtype):
    """Two identical caches decode the same steps, one through each call; scattered slots, mixed lengths."""
    model = build_model(CFG, dtype=dtype, seed=3)
    plain, fast = filled_cache(dtype, 6, seed=4), filled_cache(dtype, 6, seed=4)
    slots = torch.tensor([4, 1, 5, 2])
    offsets = torch.tensor([0, 2, 1, 0])
    tokens = torch.tensor([7, 300, 100_000, 257_151])
    num_valid = plain.valid[slots, :P].sum(dim=1)
    for step in range(4):
        index, positions = P + offsets + step, num_valid + offsets + step
        logits = model.decode_step(plain, slots, tokens, index, positions)
        chosen = model.decode_next(fast, slots, tokens, index, positions)
        assert logits.dtype == torch.float32 and chosen.dtype == torch.long
        assert torch.equal(chosen, logits.argmax(dim=-1))
        tokens = chosen
    assert torch.equal(plain.k, fast.k) and torch.equal(plain.valid, fast.valid)


@pytest.mark.parametrize("dtype", DTYPES)
@torch.inference_mode()
def test_sampled_rows_follow_each_requests_own_stream(dtype):
    """Rows with a sampler draw exactly what `sample_token` draws from decode_step's float32 logits with the same
    seed, step after step; greedy rows beside them stay greedy."""
    model = build_model(CFG, dtype=dtype, seed=5)
    plain, fast = filled_cache(dtype, 3, seed=6), filled_cache(dtype, 3, seed=6)
    slots = torch.tensor([0, 1, 2])
    num_valid = plain.valid[:, :P].sum(dim=1)

    def samplers():
        return [Sampler(4.0, torch.Generator().manual_seed(11)), None, Sampler(20.0, torch.Generator().manual_seed(12))]

    reference, ours = samplers(), samplers()
    tokens = torch.tensor([9, 10, 11])
    off_greedy = 0
    for step in range(4):
        index, positions = torch.full((3,), P + step), num_valid + step
        logits = model.decode_step(plain, slots, tokens, index, positions)
        greedy = logits.argmax(dim=-1).tolist()
        expected = [g if s is None else sample_token(row, s) for row, g, s in zip(logits, greedy, reference)]
        chosen = model.decode_next(fast, slots, tokens, index, positions, ours).tolist()
        assert chosen == expected
        off_greedy += sum(c != g for c, g in zip(chosen, greedy))
        tokens = torch.tensor(chosen)
    assert off_greedy > 0  # the samplers were used, not just the argmax
    with pytest.raises(ValueError, match="2 samplers for 3 requests"):
        model.decode_next(fast, slots, tokens, index, positions, ours[:2])
