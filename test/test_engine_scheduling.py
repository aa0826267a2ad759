"""OxyGen engine on the real tiny model: sharing and batching change speed, never results."""

import os
import random

import pytest
import torch

from oxygen_ros.engine.frame_scheduler import FrameScheduler, SchedulerConfig
from oxygen_ros.engine.kv_pool import KVPool
from oxygen_ros.engine.settings import RUNNERS, SETTINGS, Workload
from oxygen_ros.engine.workloads import arrivals, synthetic_frames
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.pi05 import build_model

CONFIG = get_preset("tiny")


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, seed=3)


def isolated_tokens(model, inputs, max_new_tokens):
    """Greedy text of one frame decoded alone in a pool of its own (the reference)."""
    pool = KVPool(CONFIG, 2, max_new_tokens)
    scheduler = FrameScheduler(model, pool, SchedulerConfig(num_steps=2, tokens_per_frame=0,
                                                            max_new_tokens=max_new_tokens, ignore_eos=True))
    noise = torch.zeros(1, CONFIG.action_horizon, CONFIG.action_dim)
    scheduler.run_frame(inputs, noise, narrate=True)
    (request,) = scheduler.drain()
    return request.tokens


def test_every_setting_gives_the_same_actions_and_text(model):
    frames, noises = synthetic_frames(CONFIG, 7, seed=11)
    workload = Workload(frames, noises, arrivals("every_frame", 7), decode_len=6, num_steps=3, tokens_per_frame=2)
    runs = {s: (RUNNERS[s](model, workload, drain=True) if s == "continuous_batching" else RUNNERS[s](model, workload))
            for s in SETTINGS}
    reference = runs["action_only"]
    for setting, run in runs.items():
        assert sorted(run.actions) == list(range(7)), setting
        for frame in range(7):
            assert torch.equal(run.actions[frame], reference.actions[frame]), (setting, frame)
    expected = {frame: isolated_tokens(model, frames[frame], 6) for frame in range(7)}
    assert len(set(map(tuple, expected.values()))) > 1, "frames should produce different text"
    for setting in ("baseline", "shared_kv", "continuous_batching"):
        assert {f: r.tokens for f, r in runs[setting].requests.items()} == expected, setting
    assert runs["parallel"].requests, "the parallel language worker finished no request"
    for frame, request in runs["parallel"].requests.items():
        assert request.tokens == expected[frame]


def test_continuous_batching_decodes_requests_from_many_frames_together(model):
    frames, noises = synthetic_frames(CONFIG, 6, seed=5)
    pool = KVPool(CONFIG, 8, 10)
    scheduler = FrameScheduler(model, pool, SchedulerConfig(num_steps=2, tokens_per_frame=2, max_new_tokens=10,
                                                            ignore_eos=True))
    batch_sizes = []
    for frame in range(6):
        result = scheduler.run_frame(frames[frame], noises[frame], narrate=True)
        batch_sizes.append(len(scheduler.active))
        assert result.decode_steps == 2
    # one token from the prefill, then 2 per frame: a request lives through 4 more frames, so from frame 3 on
    # requests of 4 different frames are decoded in the same batch
    assert batch_sizes == [1, 2, 3, 4, 4, 4]
    finished = scheduler.drain()
    assert all(len(r.tokens) == 10 for r in finished)
    assert pool.slots_used == 0


def test_pool_never_leaks_over_many_frames_with_random_lengths(model):
    rng = random.Random(0)
    frames, noises = synthetic_frames(CONFIG, 4, seed=2)
    pool = KVPool(CONFIG, 5, 12)
    buffers = (pool.cache.k.data_ptr(), pool.cache.v.data_ptr(), pool.cache.valid.data_ptr())
    config = SchedulerConfig(num_steps=1, tokens_per_frame=1, max_new_tokens=12, admission="drop_oldest")
    scheduler = FrameScheduler(model, pool, config)
    started = finished = dropped = 0
    rss = []
    for frame in range(1000):
        narrate = rng.random() < 0.7
        result = scheduler.run_frame(frames[frame % 4], noises[frame % 4], narrate,
                                     max_new_tokens=rng.randint(0, 12))
        started += result.request is not None
        finished += len(result.finished)
        dropped += len(result.dropped)
        # every slot is owned by exactly one live request (the frame's own slot is back or handed over)
        owners = pool.owners()
        assert sorted(owners) == sorted(r.slot for r in scheduler.active)
        assert pool.slots_used == len(scheduler.active) <= scheduler.max_active
        if frame in (200, 999):
            rss.append(_rss_bytes())
    finished += len(scheduler.drain())
    assert pool.slots_used == 0 and pool.slots_free == pool.slots_total
    assert started == finished + dropped and dropped == scheduler.requests_dropped > 0
    assert (pool.cache.k.data_ptr(), pool.cache.v.data_ptr(), pool.cache.valid.data_ptr()) == buffers
    assert rss[1] - rss[0] < 32 * 2**20, f"memory grew by {(rss[1] - rss[0]) / 2**20:.1f} MiB"


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("policy", ["drop_new", "drop_oldest", "preempt"])
def test_full_pool_follows_the_admission_policy(model, policy):
    frames, noises = synthetic_frames(CONFIG, 5, seed=9)
    pool = KVPool(CONFIG, 3, 8)  # two language requests at most, one slot kept for the action
    scheduler = FrameScheduler(model, pool, SchedulerConfig(num_steps=1, tokens_per_frame=0, max_new_tokens=8,
                                                            admission=policy, ignore_eos=True))
    results = [scheduler.run_frame(frames[i], noises[i], narrate=True) for i in range(4)]
    if policy == "drop_new":
        assert [r.request is not None for r in results] == [True, True, False, False]
        assert scheduler.requests_dropped == 2 and [r.frame_id for r in scheduler.active] == [0, 1]
    elif policy == "drop_oldest":
        assert [r.frame_id for r in scheduler.active] == [2, 3]
        assert scheduler.requests_dropped == 2
        assert [d.frame_id for r in results for d in r.dropped] == [0, 1]
        assert all(d.finish_reason == "evicted" for r in results for d in r.dropped)
    else:
        assert scheduler.requests_dropped == 0 and len(scheduler.preempted) == 2
        finished = {r.frame_id: r.tokens for r in scheduler.drain()}
        # preempted requests resume by recomputation and still produce exactly the isolated text
        assert finished == {i: isolated_tokens(model, frames[i], 8) for i in range(4)}
    assert pool.slots_used == len(scheduler.active)


def test_adaptive_k_decodes_only_in_the_slack_of_the_control_period(model):
    frames, noises = synthetic_frames(CONFIG, 6, seed=1)

    def steps_per_frame(period):
        pool = KVPool(CONFIG, 6, 16)
        config = SchedulerConfig(num_steps=1, tokens_per_frame=6, adaptive_k=True, control_period_s=period,
                                 max_new_tokens=16, ignore_eos=True)
        scheduler = FrameScheduler(model, pool, config)
        return [scheduler.run_frame(f, n, narrate=True).decode_steps for f, n in zip(frames, noises)]

    assert steps_per_frame(10.0)[1:] == [6] * 5  # ample slack: the cap
    assert steps_per_frame(1e-6) == [0] * 6  # the action alone overruns the period: no text this frame


def test_step_cost_model_fits_fixed_and_per_request_cost():
    from oxygen_ros.engine.step_cost import StepCostModel

    cost = StepCostModel()
    assert cost.predict(4) == 0.0 and cost.largest_batch_within(0.01, 7) == 7
    assert cost.largest_batch_within(-0.001, 7) == 0
    cost.observe(4, 0.003)
    assert cost.predict(16) == 0.003  # one batch size seen: the fixed part is assumed to dominate
    for batch in (1, 2, 8, 16):
        cost.observe(batch, 0.002 + 0.0005 * batch)
    assert abs(cost.predict(10) - 0.007) < 1e-3
    assert cost.largest_batch_within(0.005, 30) in (5, 6)  # (0.005 - 0.002) / 0.0005
    assert cost.largest_batch_within(0.001, 30) == 0  # not even the fixed part fits
    assert cost.largest_batch_within(1.0, 30) == 30


def test_a_partial_decode_step_advances_the_oldest_requests_only(model):
    frames, noises = synthetic_frames(CONFIG, 4, seed=4)
    pool = KVPool(CONFIG, 6, 8)
    scheduler = FrameScheduler(model, pool, SchedulerConfig(num_steps=1, tokens_per_frame=0, max_new_tokens=8,
                                                            ignore_eos=True))
    for frame in range(4):
        scheduler.run_frame(frames[frame], noises[frame], narrate=True)
    before = [len(r.tokens) for r in scheduler.active]
    result = scheduler.run_frame(frames[0], noises[0], narrate=False)
    assert scheduler.decode_step(result, max_batch=2)
    assert [len(r.tokens) for r in scheduler.active] == [before[0] + 1, before[1] + 1, before[2], before[3]]
    finished = {r.frame_id: r.tokens for r in scheduler.drain()}
    assert finished == {i: isolated_tokens(model, frames[i], 8) for i in range(4)}  # partial steps change nothing


def test_sampled_narration_does_not_depend_on_batching(model):
    """With a temperature each request samples from its own stream: decoded in batches of any size, or one at a
    time, the same request ids give the same text; and the text differs from greedy."""
    frames, noises = synthetic_frames(CONFIG, 4, seed=12)

    def narrations(tokens_per_frame, temperature, seed=5):
        pool = KVPool(CONFIG, 6, 10)
        config = SchedulerConfig(num_steps=1, tokens_per_frame=tokens_per_frame, max_new_tokens=10, ignore_eos=True,
                                 temperature=temperature, seed=seed)
        scheduler = FrameScheduler(model, pool, config)
        finished = []
        for frame in range(4):
            finished += scheduler.run_frame(frames[frame], noises[frame], narrate=True).finished
        return {r.request_id: r.tokens for r in finished + scheduler.drain()}

    sampled = narrations(2, temperature=30.0)
    assert narrations(0, temperature=30.0) == sampled  # everything decoded together at the end instead
    assert narrations(2, temperature=30.0, seed=6) != sampled
    assert narrations(2, temperature=0.0) != sampled
    assert all(len(tokens) == 10 for tokens in sampled.values())
