"""Real-time chunking's guided sampler (`model/rtc.py`) against the paper's algorithm written out here.

The reference follows arXiv 2506.07339 literally, in the paper's own time (tau = 0 noise, 1 actions; velocity from
noise to actions): the prefix mask of eq. 5, the guided velocity of eqs. 2-4 with its clip, Euler steps of 1/n, one
robot, float64 weights and autograd for the vector-Jacobian product. Its velocity is the uncached joint forward of
`test_model_pi05.py` (the prefix recomputed every step), so nothing of the sampler's cache handling is shared.
"""

import logging
import math

import numpy as np
import pytest
import torch
from test_model_pi05 import BATCH, CFG, P, reference_velocity, select

from oxygen_ros.model.inputs import ModelInputs
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.rtc import Committed, GuidedSampler, RtcConfig
from oxygen_ros.rtc_mask import Schedule, prefix_weights

H, A = CFG.action_horizon, CFG.action_dim
EXECUTION_HORIZON = 6  # the paper's H - s: s = 2 actions executed between chunks
BETA = 5.0
TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, seed=1)


@pytest.fixture(scope="module")
def model64():
    return build_model(CFG, seed=1, dtype=torch.float64)


@pytest.fixture(scope="module")
def cache(model):
    cache = KVCache(CFG, num_slots=3, max_len=P + 4)
    model.prefill(BATCH, cache, torch.arange(3))
    return cache


def paper_mask(schedule: Schedule, d: int, s: int) -> torch.Tensor:
    """Eq. 5 (and its ZEROS / ONES / LINEAR variants), one action at a time."""
    weights = []
    for i in range(H):
        c = (H - s - i) / (H - s - d + 1)
        if i < d:
            w = 1.0
        elif i >= H - s:
            w = 0.0
        elif schedule is Schedule.ZEROS:
            w = 0.0
        elif schedule is Schedule.ONES:
            w = 1.0
        elif schedule is Schedule.LINEAR:
            w = c
        else:
            w = c * (math.exp(c) - 1) / (math.e - 1)
        weights.append(w)
    return torch.tensor(weights, dtype=torch.float64)


def paper_rtc(model64, row: int, noise: torch.Tensor, previous: torch.Tensor, d: int, schedule: Schedule,
              steps: int) -> torch.Tensor:
    """Guided inpainting for robot `row` of BATCH: noise [1, H, A] at tau = 0 to actions at tau = 1."""
    inputs = select(BATCH, row)
    s = H - EXECUTION_HORIZON
    mask = paper_mask(schedule, d, s)[None, :, None]
    target = torch.zeros(1, H, A, dtype=torch.float64)  # Y past the left-over has weight 0
    target[0, : len(previous)] = previous.double()
    chunk = noise.double()
    for k in range(steps):
        tau = k / steps
        with torch.enable_grad():
            a_tau = chunk.detach().requires_grad_(True)
            # our model's velocity points from actions to noise at time t = 1 - tau: the paper's is its negative
            v = -reference_velocity(model64, inputs, a_tau, 1.0 - tau).double()
            a_one = a_tau + (1 - tau) * v
            (g,) = torch.autograd.grad(a_one, a_tau, ((target - a_one) * mask).detach())
        r2 = (1 - tau) ** 2 / (tau**2 + (1 - tau) ** 2)
        weight = min(BETA, (1 - tau) / (tau * r2)) if tau > 0 else BETA
        chunk = chunk + (v.detach() + weight * g) / steps
    return chunk[0]


def noise(seed: int, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, H, A, generator=torch.Generator().manual_seed(seed))


def previous_chunk(model, cache, row: int) -> torch.Tensor:
    """A previous chunk for robot `row`: the plain sampler's chunk from another noise, its first 2 actions
    executed (the left-over starts at the step the new frame was taken on)."""
    chunk = model.sample_actions(cache, torch.tensor([row]), noise(100 + row))[0]
    return chunk[2:]


@pytest.mark.parametrize("schedule", list(Schedule), ids=[s.value for s in Schedule])
def test_one_robot_matches_the_paper(model, model64, cache, schedule):
    sampler = GuidedSampler(RtcConfig(EXECUTION_HORIZON, schedule, BETA))
    left_over, d = previous_chunk(model, cache, 0), 2
    # 10 steps: at t = 0.9 and 0.1 the weight (9.1) is clipped to beta, as it is at t = 1 (infinite)
    got = sampler.sample(model, cache, torch.tensor([0]), noise(1), [Committed(left_over, d)], num_steps=10)[0]
    want = paper_rtc(model64, 0, noise(1), left_over, d, schedule, 10)
    torch.testing.assert_close(got.double(), want, **TOL)
    assert not torch.allclose(got, model.sample_actions(cache, torch.tensor([0]), noise(1), 10)[0], atol=1e-3)
    assert not sampler.fallbacks


def test_a_batch_with_different_delays_equals_each_robot_alone(model, model64, cache):
    sampler = GuidedSampler(RtcConfig(EXECUTION_HORIZON, Schedule.EXP, BETA))
    # the last delay a NumPy integer, as a node may compute it
    committed = [Committed(previous_chunk(model, cache, 0), 1), None,
                 Committed(previous_chunk(model, cache, 2), np.int64(4))]
    x = noise(7, rows=3)
    batch = sampler.sample(model, cache, torch.arange(3), x, committed, num_steps=5)
    for row, request in enumerate(committed):
        alone = sampler.sample(model, cache, torch.tensor([row]), x[row:row + 1], [request], num_steps=5)[0]
        torch.testing.assert_close(batch[row], alone, **TOL)
        if request is None:  # the plain sampler's chunk, untouched by its neighbours' guidance
            plain = model.sample_actions(cache, torch.tensor([row]), x[row:row + 1], num_steps=5)[0]
            torch.testing.assert_close(batch[row], plain, **TOL)
        else:
            want = paper_rtc(model64, row, x[row:row + 1], request.left_over, request.delay, Schedule.EXP, 5)
            torch.testing.assert_close(batch[row].double(), want, **TOL)


def test_guided_chunk_continues_the_committed_actions(model, cache):
    """The first d actions of the new chunk are the committed ones far more closely than plain sampling's."""
    sampler = GuidedSampler(RtcConfig(EXECUTION_HORIZON, Schedule.EXP, BETA))
    for row in range(3):
        left_over, d = previous_chunk(model, cache, row), 3
        x = noise(20 + row)
        guided = sampler.sample(model, cache, torch.tensor([row]), x, [Committed(left_over, d)], num_steps=10)[0]
        plain = model.sample_actions(cache, torch.tensor([row]), x, num_steps=10)[0]
        guided_gap = (guided[:d] - left_over[:d]).abs().max()
        plain_gap = (plain[:d] - left_over[:d]).abs().max()
        assert guided_gap < 0.1 * plain_gap, (row, guided_gap, plain_gap)


def test_prefix_weights_follow_eq_5():
    for schedule in Schedule:
        for d in range(EXECUTION_HORIZON):
            torch.testing.assert_close(torch.from_numpy(prefix_weights(schedule, d, EXECUTION_HORIZON, H)),
                                       paper_mask(schedule, d, H - EXECUTION_HORIZON))


def test_requests_that_cannot_be_guided_are_sampled_plainly_counted_and_logged(model, cache, caplog):
    sampler = GuidedSampler(RtcConfig(EXECUTION_HORIZON, Schedule.LINEAR, BETA))
    good = previous_chunk(model, cache, 0)
    nan, inf = good.clone(), good.clone()
    nan[1, 3], inf[4, 0] = float("nan"), float("inf")
    bad = [Committed(good, EXECUTION_HORIZON), Committed(good, H + 3), Committed(good, -1),
           Committed(good[:, : A - 2], 1), Committed(good[0], 1), Committed(nan, 1), Committed(inf, 2),
           Committed(good[:1], 2)]
    x = noise(3, rows=len(bad) + 1)
    slots = torch.arange(len(bad) + 1)
    cache = KVCache(CFG, num_slots=len(bad) + 1, max_len=P)  # BATCH's three robots three times over
    model.prefill(ModelInputs(*(torch.cat([getattr(BATCH, f)] * 3) for f in ModelInputs.__dataclass_fields__)),
                  cache, slots)
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.model.rtc"):
        got = sampler.sample(model, cache, slots, x, bad + [Committed(good, 1)])
    plain = model.sample_actions(cache, slots, x)
    torch.testing.assert_close(got[: len(bad)], plain[: len(bad)], **TOL)
    assert not torch.allclose(got[-1], plain[-1], atol=1e-3)  # the good row beside them is still guided
    assert sampler.fallbacks == {"delay": 4, "width": 2, "nonfinite": 2}
    lines = [r.getMessage() for r in caplog.records if r.name == "oxygen_ros.model.rtc"]
    assert len(lines) == len(bad) and all("without guidance" in line for line in lines)
    # a batch where every request is refused is the plain sampler's
    torch.testing.assert_close(sampler.sample(model, cache, slots[:2], x[:2], bad[:2]), plain[:2], **TOL)


def test_guidance_runs_the_same_from_inference_mode(model, cache):
    """Callers sample in inference mode (the model's own calls do); the guided sampler steps out of it for its
    backward pass, also for a cache allocated in inference mode."""
    sampler = GuidedSampler(RtcConfig(EXECUTION_HORIZON))
    committed = [Committed(previous_chunk(model, cache, 1), 2)]
    want = sampler.sample(model, cache, torch.tensor([1]), noise(4), committed)
    with torch.inference_mode():
        inference_cache = KVCache(CFG, num_slots=3, max_len=P)
        model.prefill(BATCH, inference_cache, torch.arange(3))
        for kv in (cache, inference_cache):
            got = sampler.sample(model, kv, torch.tensor([1]), noise(4), committed)
            torch.testing.assert_close(got, want, **TOL)
    with torch.no_grad():
        torch.testing.assert_close(sampler.sample(model, cache, torch.tensor([1]), noise(4), committed), want, **TOL)
