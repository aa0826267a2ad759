"""The threaded runtime: control path on the caller's thread, batched language on a worker, never overlapping."""

import threading
import time

import numpy as np
import pytest

from oxygen_ros.engine.frame_scheduler import SchedulerConfig
from oxygen_ros.engine.runtime import OxygenRuntime, RuntimeConfig
from oxygen_ros.model.pi05 import build_model

from engine_fixtures import TINY as CONFIG
from engine_fixtures import observation


def test_language_never_runs_inside_the_control_critical_section(tokenizer):
    model = build_model(CONFIG, seed=1)
    period = 0.04
    updates = []
    lock = threading.Lock()

    def on_text(update):
        with lock:
            updates.append(update)

    scheduler = SchedulerConfig(num_steps=2, max_new_tokens=12, control_period_s=period, ignore_eos=True)
    # Room for all 15 requests: however far a busy machine lets the worker fall behind, none is evicted, so
    # every one must finish with its 12 tokens (eviction itself is test_engine_scheduling's subject).
    runtime = OxygenRuntime(model, tokenizer, RuntimeConfig(scheduler=scheduler, pool_slots=15, stream_every=4),
                            robot_action_dim=3, on_text=on_text, trace=True).start()
    chunks = []
    try:
        next_tick = time.perf_counter()
        for i in range(30):
            next_tick += period
            chunks.append(runtime.act(observation(i), stamp_ns=1000 + i, narrate=i % 2 == 0))
            time.sleep(max(0.0, next_tick - time.perf_counter()))
        deadline = time.perf_counter() + 60  # returns as soon as every request has its final text
        while time.perf_counter() < deadline:
            with lock:
                if sum(u.final for u in updates) == 15:
                    break
            time.sleep(0.02)
    finally:
        runtime.close()
    assert runtime.worker_error is None

    assert all(c.actions.shape == (CONFIG.action_horizon, 3) and np.isfinite(c.actions).all() for c in chunks)
    assert [c.request_id is not None for c in chunks] == [i % 2 == 0 for i in range(30)]
    finals = {u.request_id: u for u in updates if u.final}
    assert sorted(finals) == sorted(c.request_id for c in chunks if c.request_id is not None)
    for chunk in chunks:
        if chunk.request_id is not None:
            final = finals[chunk.request_id]
            assert final.stamp_ns == chunk.stamp_ns and final.num_tokens == 12 and final.finish_reason == "length"
    assert any(not u.final for u in updates), "partial text should stream every 4 tokens"

    control = [(s, e) for kind, s, e in runtime.gate.trace if kind == "control"]
    decode = [(s, e) for kind, s, e in runtime.gate.trace if kind == "decode"]
    # Every request needs 11 decode steps after its prefill token; and the worker decoded while the control loop
    # ran (between its first and last act), so the overlap check below is not vacuous.
    assert len(control) == 30 and len(decode) >= 11
    assert any(control[0][1] <= d_start and d_end <= control[-1][0] for d_start, d_end in decode)
    for c_start, c_end in control:
        for d_start, d_end in decode:
            assert d_end <= c_start or d_start >= c_end, "a decode step overlapped the control path"

    stats = runtime.stats(window_s=60)
    assert stats.actions == 30 and stats.active_requests == 0 and stats.slots_used == 0
    assert stats.slots_total == 15 and stats.bytes_total == runtime.pool.bytes_total
    assert 0 < stats.action_latency_p50_ms <= stats.action_latency_p99_ms


def test_bad_observation_raises_and_leaves_the_runtime_usable(tokenizer):
    model = build_model(CONFIG, seed=1)
    runtime = OxygenRuntime(model, tokenizer, RuntimeConfig(SchedulerConfig(num_steps=1, max_new_tokens=4)),
                            robot_action_dim=3).start()
    try:
        bad = observation(0)
        bad.state = np.array([0.1, np.nan, 0.2])
        with pytest.raises(ValueError, match="NaN"):
            runtime.act(bad, 0, narrate=True)
        assert runtime.pool.slots_used == 0
        chunk = runtime.act(observation(1), 1, narrate=False)
        assert chunk.actions.shape == (CONFIG.action_horizon, 3)
    finally:
        runtime.close()
