"""Training-time real-time chunking (arXiv 2512.05964): the loss with simulated delays, the expert's per-token time
condition, the prefix sampler that follows a committed prefix without guidance, and `train-tiny --rtc-max-delay`.

The loss is checked against one written out here on the inference path (the prefix K/V from `prefill`, the expert
inputs the samplers use), so nothing of the training forward is shared but the expert itself.
"""

import json

import numpy as np
import pytest
import torch
from test_model_pi05 import BATCH
from test_train_tiny import ALOHA, TASK, TINY, data, episode  # noqa: F401 (fixtures)

from oxygen_ros.command_line import UsageError
from oxygen_ros.commands.train_tiny import TrainConfig, fit
from oxygen_ros.commands.train_tiny import main as train_main
from oxygen_ros.data.aloha import write_aloha
from oxygen_ros.model.expert_inputs import expert_inputs
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.rtc import PREFIX, Committed, GuidedSampler, RtcConfig
from oxygen_ros.model.train import sample_times, training_losses

H, A = TINY.action_horizon, TINY.action_dim


def prefilled(model, inputs):
    cache = KVCache(TINY, len(inputs.tokens), TINY.prefix_len + 4)
    slots = torch.arange(len(inputs.tokens))
    model.prefill(inputs, cache, slots)
    return cache, slots


def test_a_per_token_time_condition_equal_over_the_tokens_is_the_per_sample_one():
    model = build_model(TINY, seed=2)
    cache, slots = prefilled(model, BATCH)
    inputs = expert_inputs(model, cache, slots, 4)
    x = torch.randn(len(slots), H, A, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        per_sample = model._velocity(x, inputs.conds[1].expand(len(slots), -1), inputs.prefix_k, inputs.prefix_v,
                                     inputs.bias, inputs.cos, inputs.sin)
        per_token = model._velocity(x, inputs.conds[1].expand(len(slots), H, -1), inputs.prefix_k, inputs.prefix_v,
                                    inputs.bias, inputs.cos, inputs.sin)
    torch.testing.assert_close(per_token, per_sample, rtol=0, atol=0)


def test_the_loss_gives_the_first_d_actions_as_known_and_learns_the_rest(data):  # noqa: F811
    model = build_model(TINY, seed=4)
    frames = torch.tensor([3, 60, 120, 149])
    inputs, actions, caption, mask = data.batch(frames)
    got = training_losses(model, inputs, actions, caption, mask, torch.Generator().manual_seed(9), rtc_max_delay=5)
    # the same draws, in the same order, and the definition: x = the clean action and t = 0 for i < d, the flow's
    # x_t = t noise + (1 - t) action and time t elsewhere; the velocity's error on i >= d only
    generator = torch.Generator().manual_seed(9)
    noise = torch.randn(actions.shape, generator=generator)
    t = sample_times(len(frames), generator)
    delays = torch.randint(6, (len(frames),), generator=generator)
    assert delays.min() < delays.max(), "the draw should give different delays"
    cache, slots = prefilled(model, inputs)
    fixed = expert_inputs(model, cache, slots, 1)
    x = torch.empty_like(actions)
    cond = torch.empty(len(frames), H, TINY.expert.width)
    errors = []
    with torch.no_grad():
        for b in range(len(frames)):
            for i in range(H):
                known = i < delays[b]
                time = 0.0 if known else float(t[b])
                x[b, i] = actions[b, i] if known else time * noise[b, i] + (1 - time) * actions[b, i]
                cond[b, i] = model.time_condition(torch.tensor([time], dtype=torch.float64))[0]
        velocity = model._velocity(x, cond, fixed.prefix_k, fixed.prefix_v, fixed.bias, fixed.cos, fixed.sin)
        for b in range(len(frames)):
            errors.append((velocity[b, delays[b]:] - (noise - actions)[b, delays[b]:]) ** 2)
    want = torch.cat([e.reshape(-1) for e in errors]).mean()
    torch.testing.assert_close(got.action, want, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="below the horizon"):
        training_losses(model, inputs, actions, caption, mask, rtc_max_delay=H)


def test_the_prefix_sampler_holds_the_committed_actions_and_leaves_other_rows_plain():
    model = build_model(TINY, seed=5)
    cache, slots = prefilled(model, BATCH)
    generator = torch.Generator().manual_seed(1)
    noise = torch.randn(len(slots), H, A, generator=generator)
    left_over = torch.randn(H - 1, A, generator=generator)
    sampler = GuidedSampler(RtcConfig(execution_horizon=6, method=PREFIX))
    committed = [Committed(left_over, 2), None, Committed(left_over[:5], 4)]
    with torch.inference_mode():  # no backward pass: runs where gradients cannot
        together = sampler.sample(model, cache, slots, noise, committed, 4)
    plain = model.sample_actions(cache, slots, noise, 4)
    torch.testing.assert_close(together[0, :2], left_over[:2], rtol=0, atol=0)
    torch.testing.assert_close(together[2, :4], left_over[:4], rtol=0, atol=0)
    torch.testing.assert_close(together[1], plain[1], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(together[0, 2:], plain[0, 2:], atol=1e-3)  # the rest follows the known prefix
    for row in (0, 2):  # each robot alone
        alone = sampler.sample(model, cache, slots[row:row + 1], noise[row:row + 1], [committed[row]], 4)
        torch.testing.assert_close(together[row], alone[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="method must be"):
        RtcConfig(execution_horizon=6, method="blend")


def test_training_with_simulated_delays_learns_and_train_tiny_records_it(data, episode, tmp_path, capsys):  # noqa: F811
    model = build_model(TINY, seed=0)
    history = fit(model, data, TrainConfig(steps=40, batch_size=8, warmup_steps=5, rtc_max_delay=4),
                  log=lambda line: None)
    first, last = history[:8], history[-8:]
    assert np.mean([h["action"] for h in last]) < 0.7 * np.mean([h["action"] for h in first])
    hdf5 = write_aloha(tmp_path / "episode_0.hdf5", episode)
    assert train_main([str(hdf5), str(tmp_path / "ckpt"), "--task", TASK, "--steps", "2", "--batch-size", "4",
                       "--rtc-max-delay", "3"]) == 0
    written = json.loads((tmp_path / "ckpt" / "training.json").read_text())
    assert written["train_config"]["rtc_max_delay"] == 3
    with pytest.raises(UsageError, match=r"--rtc-max-delay must be in 0\.\.7"):
        train_main([str(hdf5), str(tmp_path / "bad"), "--rtc-max-delay", str(H)])


def test_guidance_keeps_the_committed_actions_on_a_trained_checkpoint(data):  # noqa: F811
    """Consistency on a trained model (the test fixture's weights are random): the tiny preset fitted 150 steps on
    the synthetic episode; each frame's chunk sampled plainly, 2 of its actions executed, the frame 2 steps later
    guided toward the rest with a delay of 3. Its first 3 actions stay nearer the committed ones than the plain
    sampler's from the same noise, by at least half on average (one run's figures: docs/rtc.md)."""
    model = build_model(TINY, seed=0)
    history = fit(model, data, TrainConfig(steps=150, batch_size=8, warmup_steps=5), log=lambda line: None)
    assert history[-1]["action"] < 0.5 * history[0]["action"]  # it learned something
    model.eval()
    frames, executed, d = torch.tensor([20, 40, 60, 80, 100, 120]), 2, 3
    then, _ = prefilled(model, data.batch(frames)[0])
    now, slots = prefilled(model, data.batch(frames + executed)[0])
    generator = torch.Generator().manual_seed(3)
    previous = model.sample_actions(then, slots, torch.randn(len(frames), H, A, generator=generator), 10)
    x = torch.randn(len(frames), H, A, generator=generator)
    sampler = GuidedSampler(RtcConfig(6, max_guidance_weight=5.0))
    guided = sampler.sample(model, now, slots, x, [Committed(p[executed:], d) for p in previous], num_steps=10)
    plain = model.sample_actions(now, slots, x, 10)
    committed = previous[:, executed:executed + d]
    guided_gap = (guided[:, :d] - committed).abs().amax(dim=(1, 2))
    plain_gap = (plain[:, :d] - committed).abs().amax(dim=(1, 2))
    assert not sampler.fallbacks
    assert (guided_gap < plain_gap).all(), (guided_gap, plain_gap)
    assert guided_gap.mean() < 0.5 * plain_gap.mean(), (guided_gap, plain_gap)
