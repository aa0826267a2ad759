"""Preempted narrations are bounded: past `max_preempted` the oldest waiting one is dropped like drop_oldest."""

import pytest

from oxygen_ros.engine.frame_scheduler import FrameScheduler, SchedulerConfig
from oxygen_ros.engine.kv_pool import KVPool
from oxygen_ros.engine.workloads import synthetic_frames
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.pi05 import build_model

CONFIG = get_preset("tiny")


def test_a_preempt_soak_keeps_waiting_requests_and_their_inputs_bounded():
    model = build_model(CONFIG, seed=3)
    frames, noises = synthetic_frames(CONFIG, 4, seed=9)
    pool = KVPool(CONFIG, 3, 8)  # two language requests at most, one slot kept for the action
    scheduler = FrameScheduler(model, pool, SchedulerConfig(num_steps=1, tokens_per_frame=0, max_new_tokens=8,
                                                            admission="preempt", max_preempted=3, ignore_eos=True))
    dropped = []
    for i in range(40):  # every frame narrates and nothing decodes: each new request preempts an older one
        result = scheduler.run_frame(frames[i % 4], noises[i % 4], narrate=True)
        dropped += result.dropped
        assert len(scheduler.active) == min(i + 1, 2) and len(scheduler.preempted) <= 3
        assert len(scheduler._inputs) == len(scheduler.active)  # a preempted request's inputs live in its entry
    assert scheduler.requests_dropped == len(dropped) == 40 - 2 - 3
    assert [d.frame_id for d in dropped] == list(range(35))  # the oldest go first
    assert all(d.finish_reason == "evicted" for d in dropped)
    assert [p.request.frame_id for p in scheduler.preempted] == [35, 36, 37]
    finished = scheduler.drain()  # the survivors still finish
    assert sorted(r.frame_id for r in finished) == [35, 36, 37, 38, 39]
    assert not scheduler._inputs and pool.slots_used == 0


def test_max_preempted_is_validated():
    with pytest.raises(ValueError, match="max_preempted"):
        SchedulerConfig(max_preempted=-1)
