"""`Pi05Model.compile_steps`: the torch.compile'd denoise and decode steps give the eager model's actions (to
floating-point rounding) and its greedy tokens, in float32 and bfloat16. Compiling takes tens of seconds."""

import pytest
import torch

from oxygen_ros.evaluation.bench.model_bench import random_inputs
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model

CFG = get_preset("tiny")
ACTION_TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 0.05, "rtol": 0.05}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_compiled_steps_match_the_eager_model(dtype):
    eager = build_model(CFG, dtype=dtype, seed=2)
    compiled = build_model(CFG, dtype=dtype, seed=2).compile_steps()
    batch, slots = 3, torch.tensor([2, 0, 1])
    inputs = random_inputs(CFG, batch, seed=3)
    noise = torch.randn(batch, CFG.action_horizon, CFG.action_dim, generator=torch.Generator().manual_seed(4))
    caches = [KVCache(CFG, num_slots=batch, max_len=CFG.prefix_len + 6, dtype=dtype) for _ in range(2)]
    prefills = [model.prefill(inputs, cache, slots, want_logits=True) for model, cache in zip((eager, compiled), caches)]
    actions = [model.sample_actions(cache, slots, noise) for model, cache in zip((eager, compiled), caches)]
    torch.testing.assert_close(actions[1], actions[0], **ACTION_TOL[dtype])

    tokens, num_valid = prefills[0].logits.argmax(dim=-1), prefills[0].num_valid
    for step in range(5):  # the span grows every step: the compiled step must follow it
        index, positions = torch.full((batch,), CFG.prefix_len + step), num_valid + step
        expected = eager.decode_next(caches[0], slots, tokens, index, positions)
        assert torch.equal(compiled.decode_next(caches[1], slots, tokens, index, positions), expected)
        tokens = expected
    torch.testing.assert_close(caches[1].k, caches[0].k, **ACTION_TOL[dtype])
