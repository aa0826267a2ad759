"""The cached, split calls of Pi05Model against an uncached forward over the whole joint sequence.

The references below are written from the pi0 recipe (cumulative `ar_mask`, positions = cumsum(valid) - 1,
one attention over [prefix ; suffix] with explicit softmax) and share only the per-token layer pieces with the
model, so they check exactly what the cache layout, masks and RoPE positions must preserve.
"""

import pytest
import torch

from oxygen_ros.engine.model_runner import zero_inputs
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.gemma import rope_cos_sin
from oxygen_ros.model.generate import greedy_decode
from oxygen_ros.model.inputs import ModelInputs
from oxygen_ros.model.kv_cache import DecodeIndex, KVCache
from oxygen_ros.model.pi05 import Pi05Model, build_model

CFG = get_preset("tiny")
P = CFG.prefix_len
TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, seed=1)


def make_inputs(seed: int, text_lens: list[int], cams: list[list[bool]]) -> ModelInputs:
    gen = torch.Generator().manual_seed(seed)
    b, size = len(text_lens), CFG.vision.image_size
    tokens = torch.randint(4, CFG.vocab_size, (b, CFG.max_token_len), generator=gen)
    token_masks = torch.arange(CFG.max_token_len)[None, :] < torch.tensor(text_lens)[:, None]
    return ModelInputs(
        images=torch.rand(b, CFG.num_cameras, 3, size, size, generator=gen) * 2 - 1,
        image_masks=torch.tensor(cams),
        tokens=torch.where(token_masks, tokens, 0),
        token_masks=token_masks,
    )


def select(batch: ModelInputs, i: int) -> ModelInputs:
    return ModelInputs(
        *(getattr(batch, f)[i : i + 1] for f in ("images", "image_masks", "tokens", "token_masks"))
    )


def attention_reference(q, k, v, allowed):
    """Plain softmax attention with openpi's large negative fill; q [B,H,T,D], k/v [B,KV,S,D]."""
    repeat = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~allowed[:, None], -2.3819763e38)
    return scores.float().softmax(dim=-1).to(q.dtype) @ v


def prefix_lm_mask(pad, ar):
    """pi0's 2-D mask from padding [B,S] and the cumulative autoregressive marks [S]."""
    cum = ar.long().cumsum(0)
    return (cum[None, :] <= cum[:, None])[None] & pad[:, None, :] & pad[:, :, None]


def reference_velocity(model, batch, x_t, t):
    """Uncached joint forward over [prefix ; actions]: the flow velocity [B, H, A]."""
    horizon = x_t.shape[1]
    prefix, valid = model.embed_prefix(batch)
    suffix = model.action_in_proj(x_t)
    cond = model.time_condition(torch.full((x_t.shape[0],), t))
    pad = torch.cat([valid, torch.ones(x_t.shape[0], horizon, dtype=torch.bool)], dim=1)
    ar = torch.tensor([False] * P + [True] + [False] * (horizon - 1))
    allowed = prefix_lm_mask(pad, ar)
    cos, sin = rope_cos_sin(pad.long().cumsum(1) - 1, CFG.backbone.head_dim, CFG.rope_theta, prefix.dtype)
    for vlm, act in zip(model.backbone.layers, model.expert.layers):
        qp, kp, vp, gp = vlm.project_qkv(prefix, None, cos[:, :, :P], sin[:, :, :P])
        qs, ks, vs, gs = act.project_qkv(suffix, cond, cos[:, :, P:], sin[:, :, P:])
        out = attention_reference(
            torch.cat([qp, qs], 2), torch.cat([kp, ks], 2), torch.cat([vp, vs], 2), allowed
        )
        prefix = vlm.finish(prefix, out[:, :, :P], gp, None)
        suffix = act.finish(suffix, out[:, :, P:], gs, cond)
    suffix, _ = model.expert.norm(suffix, cond)
    return model.action_out_proj(suffix)


def reference_logits(model, batch, generated):
    """Uncached backbone forward over [prefix ; generated tokens], causal on the generated part: [B, S, vocab]."""
    prefix, valid = model.embed_prefix(batch)
    x = torch.cat([prefix, model.backbone.embed(generated)], dim=1)
    g = generated.shape[1]
    pad = torch.cat([valid, torch.ones(len(generated), g, dtype=torch.bool)], dim=1)
    allowed = prefix_lm_mask(pad, torch.tensor([False] * P + [True] * g))
    cos, sin = rope_cos_sin(pad.long().cumsum(1) - 1, CFG.backbone.head_dim, CFG.rope_theta, x.dtype)
    for layer in model.backbone.layers:
        q, k, v, gate = layer.project_qkv(x, None, cos, sin)
        x = layer.finish(x, attention_reference(q, k, v, allowed), gate, None)
    return model.backbone.logits(x)


BATCH = make_inputs(0, text_lens=[5, 32, 17], cams=[[True, True], [True, False], [False, True]])


@torch.inference_mode()
@pytest.mark.parametrize("slots", [[0, 1, 2], [3, 0, 2]], ids=["contiguous", "scattered"])
def test_cached_denoise_matches_uncached_joint_forward(model, slots):
    cache = KVCache(CFG, num_slots=4, max_len=P + 8)
    slots = torch.tensor(slots)
    result = model.prefill(BATCH, cache, slots)
    assert result.num_valid.tolist() == [2 * 16 + 5, 16 + 32, 16 + 17]
    noise = torch.randn(3, CFG.action_horizon, CFG.action_dim, generator=torch.Generator().manual_seed(5))

    one_step = model.sample_actions(cache, slots, noise, num_steps=1)
    torch.testing.assert_close(noise - one_step, reference_velocity(model, BATCH, noise, 1.0), **TOL)

    steps, x = 3, noise.clone()
    for i in range(steps):
        x = x - reference_velocity(model, BATCH, x, 1.0 - i / steps) / steps
    torch.testing.assert_close(model.sample_actions(cache, slots, noise, num_steps=steps), x, **TOL)


@torch.inference_mode()
def test_sample_actions_leaves_cache_bitwise_unchanged(model):
    cache = KVCache(CFG, num_slots=3, max_len=P + 4)
    slots = torch.tensor([2, 0, 1])
    model.prefill(BATCH, cache, slots)
    before = [t.clone() for t in (cache.k, cache.v, cache.valid)]
    model.sample_actions(cache, slots, torch.randn(3, CFG.action_horizon, CFG.action_dim), num_steps=4)
    model.sample_actions(cache, torch.tensor([0, 1, 2]), torch.randn(3, CFG.action_horizon, CFG.action_dim))
    for old, new in zip(before, (cache.k, cache.v, cache.valid)):
        assert torch.equal(old, new)


@torch.inference_mode()
def test_action_expert_reads_the_prefix_in_place(model, monkeypatch):
    """For one slot or a contiguous range the expert attends to views of the shared cache, never to a copy."""
    import oxygen_ros.model.pi05 as pi05

    cache = KVCache(CFG, num_slots=4, max_len=P + 4)
    model.prefill(BATCH, cache, torch.tensor([1, 2, 3]))
    seen = []
    real = pi05.attend_prefix_and_self

    def spy(q, prefix_k, prefix_v, bias, self_k, self_v):
        seen.append((prefix_k.untyped_storage().data_ptr(), prefix_v.untyped_storage().data_ptr()))
        return real(q, prefix_k, prefix_v, bias, self_k, self_v)

    monkeypatch.setattr(pi05, "attend_prefix_and_self", spy)
    noise = torch.randn(1, CFG.action_horizon, CFG.action_dim)
    model.sample_actions(cache, torch.tensor([2]), noise, num_steps=2)
    model.sample_actions(cache, torch.tensor([1, 2, 3]), noise.expand(3, -1, -1), num_steps=2)
    cache_ptrs = (cache.k.untyped_storage().data_ptr(), cache.v.untyped_storage().data_ptr())
    assert len(seen) == 2 * 2 * CFG.expert.depth
    assert all(ptrs == cache_ptrs for ptrs in seen)


@torch.inference_mode()
def test_prefill_touches_only_its_slots_and_clears_old_text(model):
    cache = KVCache(CFG, num_slots=4, max_len=P + 4)
    cache.k.normal_()
    cache.valid[:, P:] = True  # as if earlier frames had generated text in every slot
    untouched = cache.k[:, [0, 3]].clone()
    model.prefill(make_inputs(1, [3, 9], [[True, True], [True, True]]), cache, torch.tensor([2, 1]))
    assert torch.equal(cache.k[:, [0, 3]], untouched)
    assert not cache.valid[[1, 2], P:].any() and cache.valid[[0, 3], P:].all()


@torch.inference_mode()
def test_batched_greedy_decoding_matches_single_and_uncached(model):
    limits = [6, 3, 8]

    def decode_alone(i, eos):
        cache = KVCache(CFG, num_slots=2, max_len=P + 8)
        result = model.prefill(select(BATCH, i), cache, torch.tensor([1]), want_logits=True)
        return greedy_decode(model, cache, torch.tensor([1]), result, [limits[i]], eos_id=eos)[0]

    # Request 1's first token, used as EOS, ends it at once; the others run to their own limits. So the batch
    # shrinks from three contiguous slots to a scattered pair, then to one.
    eos = decode_alone(1, eos=-1)[0]
    alone = [decode_alone(i, eos) for i in range(3)]
    assert [len(a) for a in alone] == [6, 0, 8], alone

    for slots in ([0, 1, 2], [4, 0, 2]):
        cache = KVCache(CFG, num_slots=5, max_len=P + 8)
        result = model.prefill(BATCH, cache, torch.tensor(slots), want_logits=True)
        assert greedy_decode(model, cache, torch.tensor(slots), result, limits, eos_id=eos) == alone

    # Every step's greedy choice must also be the argmax of a full uncached forward.
    for i, tokens in enumerate(alone):
        logits = reference_logits(model, select(BATCH, i), torch.tensor([tokens], dtype=torch.long))[0]
        last_prefix = int(BATCH.token_masks[i].sum()) - 1 + P - CFG.max_token_len
        rows = [last_prefix] + list(range(P, P + len(tokens)))
        choices = logits[rows].argmax(-1).tolist()
        assert choices[:-1] == tokens
        assert choices[-1] == eos or len(tokens) == limits[i]


@torch.inference_mode()
def test_decode_logits_match_uncached_forward(model):
    cache = KVCache(CFG, num_slots=3, max_len=P + 4)
    slots = torch.tensor([2, 0, 1])
    result = model.prefill(BATCH, cache, slots, want_logits=True)
    generated = torch.tensor([[7, 8, 9], [10, 11, 12], [13, 14, 15]])
    steps = [result.logits]
    for n in range(2):
        steps.append(
            model.decode_step(cache, slots, generated[:, n], torch.full((3,), P + n), result.num_valid + n)
        )
    reference = reference_logits(model, BATCH, generated[:, :2])
    last_prefix = BATCH.token_masks.sum(1) - 1 + P - CFG.max_token_len
    torch.testing.assert_close(steps[0], reference[torch.arange(3), last_prefix], **TOL)
    for n in range(2):
        torch.testing.assert_close(steps[n + 1], reference[:, P + n], **TOL)


@torch.inference_mode()
def test_requests_at_different_lengths_in_one_step(model):
    cache = KVCache(CFG, num_slots=2, max_len=P + 4)
    slots = torch.tensor([0, 1])
    two = make_inputs(3, [4, 20], [[True, True], [False, True]])
    result = model.prefill(two, cache, slots, want_logits=True)
    # Request 0 has already generated two tokens, request 1 none: one call feeds both.
    model.decode_step(cache, slots[:1], torch.tensor([21]), torch.tensor([P]), result.num_valid[:1])
    model.decode_step(cache, slots[:1], torch.tensor([22]), torch.tensor([P + 1]), result.num_valid[:1] + 1)
    mixed = model.decode_step(
        cache,
        slots,
        torch.tensor([23, 31]),
        torch.tensor([P + 2, P]),
        result.num_valid + torch.tensor([2, 0]),
    )
    reference0 = reference_logits(model, select(two, 0), torch.tensor([[21, 22, 23]]))
    reference1 = reference_logits(model, select(two, 1), torch.tensor([[31]]))
    torch.testing.assert_close(mixed[0], reference0[0, P + 2], **TOL)
    torch.testing.assert_close(mixed[1], reference1[0, P], **TOL)
    assert cache.valid[0, P : P + 3].all() and cache.valid[1, P] and not cache.valid[1, P + 1 :].any()


def test_bad_calls_are_rejected(model):
    cache = KVCache(CFG, num_slots=2, max_len=P + 2)
    with pytest.raises(ValueError, match="distinct"):
        model.prefill(make_inputs(0, [3, 3], [[True, True]] * 2), cache, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="cache_index"):
        model.decode_step(
            cache, torch.tensor([0]), torch.tensor([5]), torch.tensor([P - 1]), torch.tensor([3])
        )
    with pytest.raises(ValueError, match="noise"):
        model.sample_actions(cache, torch.tensor([0]), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="shorter than the prefix"):
        KVCache(CFG, num_slots=1, max_len=P - 1)


@torch.inference_mode()
def test_rewritten_index_ignores_later_tokens(model):
    """Feeding index i again (a rewind) must not see tokens the slot holds beyond i, even when another request
    in the same call sits further along."""
    cache = KVCache(CFG, num_slots=2, max_len=P + 4)
    slots = torch.tensor([0, 1])
    two = make_inputs(4, [6, 6], [[True, True], [True, True]])
    result = model.prefill(two, cache, slots, want_logits=True)
    for n, token in enumerate([40, 41, 42]):
        model.decode_step(
            cache, slots, torch.tensor([token, token]), torch.full((2,), P + n), result.num_valid + n
        )
    again = model.decode_step(
        cache,
        slots,
        torch.tensor([50, 43]),
        torch.tensor([P + 1, P + 3]),
        result.num_valid + torch.tensor([1, 3]),
    )
    reference = reference_logits(model, select(two, 0), torch.tensor([[40, 50]]))
    torch.testing.assert_close(again[0], reference[0, P + 1], **TOL)


@torch.inference_mode()
def test_bfloat16_model_and_cache_track_float32():
    """The CUDA configuration (bf16 weights and cache) runs through the same code and stays close to fp32."""
    slots = torch.tensor([0, 1, 2])
    noise = torch.randn(3, CFG.action_horizon, CFG.action_dim, generator=torch.Generator().manual_seed(2))
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        model = build_model(CFG, seed=1, dtype=dtype)
        cache = KVCache(CFG, num_slots=3, max_len=P + 1, dtype=dtype)
        prefill = model.prefill(BATCH, cache, slots, want_logits=True)
        actions = model.sample_actions(cache, slots, noise)
        logits = model.decode_step(
            cache, slots, torch.tensor([4, 5, 6]), torch.full((3,), P), prefill.num_valid
        )
        assert cache.k.dtype == dtype and actions.dtype == logits.dtype == torch.float32
        results.append((actions, prefill.logits, logits))
    for fp32, bf16 in zip(*results):
        torch.testing.assert_close(bf16, fp32, atol=0.1, rtol=0.05)


def test_prefill_denoising_and_greedy_step_read_nothing_back_to_the_host():
    """On a GPU a device value read back to the host (`bool(t)`, `.item()`, `.tolist()`) stops the launching
    thread until the device has caught up. The meta device stands in for a GPU here: its tensors have shapes but
    no values, so any such read raises. A prefill, a denoising and a greedy decode step (choosing the prefixes'
    first tokens too) run there to the end; slots and positions come from the host, as the engine passes them."""
    with torch.device("meta"):
        model = Pi05Model(CFG).eval()
    cache = KVCache(CFG, num_slots=3, max_len=P + 4, device="meta")
    slots = torch.tensor([0, 2])
    prefill = model.prefill(zero_inputs(CFG, 2, "meta", torch.float32), cache, slots, want_hidden=True)
    noise = torch.zeros(2, CFG.action_horizon, CFG.action_dim, device="meta")
    assert model.sample_actions(cache, slots, noise, 2).shape == noise.shape
    index = DecodeIndex(cache, slots, torch.tensor([P, P]), torch.tensor([5, 6]))
    tokens = model.decode_tokens(cache, index, torch.zeros(2, dtype=torch.long, device="meta"), first=prefill.hidden)
    assert tokens.shape == (4,) and tokens.dtype == torch.long and prefill.num_valid.device.type == "meta"


@torch.inference_mode()
def test_decode_step_never_returns_memory_a_graph_replay_overwrites(model, monkeypatch):
    """With CUDA graphs a step's logits are the graph's static output, which the next replay overwrites; a caller
    of `decode_step` keeps what it got. A stand-in for the graphs replays into one static buffer as a graph does."""
    static = torch.empty(4, CFG.vocab_size)

    def replay(cache, slots, tokens, cache_index, positions):
        static.fill_(float(tokens[0]))
        return static[: len(slots)]

    monkeypatch.setattr(model, "_graphs", type("Graphs", (), {"decode_logits": staticmethod(replay)})())
    cache = KVCache(CFG, num_slots=2, max_len=P + 4)
    args = torch.tensor([0, 1]), torch.tensor([P, P]), torch.tensor([3, 3])
    first = model.decode_step(cache, args[0], torch.tensor([1, 1]), *args[1:])
    second = model.decode_step(cache, args[0], torch.tensor([2, 2]), *args[1:])
    assert first.untyped_storage().data_ptr() != static.untyped_storage().data_ptr()
    assert bool((first == 1).all()) and bool((second == 2).all())
