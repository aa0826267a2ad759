"""The chunk executor: time alignment under model delay, holding, rejection, and the three hand-over modes."""

import math

import numpy as np
import pytest

from oxygen_ros.control.chunk_executor import BLENDING_MODES, ChunkExecutor, rtc_prefix_weights

DT = 0.02
DOF = 14


def tagged_chunk(k: int, horizon: int) -> np.ndarray:
    """Chunk k whose action i is 1000 k + i on every joint (+ 0.5 j on joint j): each command names its source."""
    return 1000.0 * k + np.arange(horizon)[:, None] + 0.5 * np.arange(DOF)[None, :]


def run_delayed(delay: int, mode: str = "newest_wins", period: int = 5, horizon: int = 20, steps: int = 60):
    """Chunk k is sourced at step period*k and handed in `delay` steps later; returns commands per step."""
    ex = ChunkExecutor(DOF, DT, mode=mode, initial_command=np.full(DOF, -1.0))
    commands = []
    for t in range(steps):
        k, rem = divmod(t - delay, period)
        if t >= delay and rem == 0:
            arrival = ex.add_chunk(tagged_chunk(k, horizon), stamp=k * period * DT, time_step=DT)
            assert arrival.accepted and arrival.latency_steps == pytest.approx(delay)
        commands.append(ex.next_command())
    return np.array(commands), ex


@pytest.mark.parametrize("delay", [0, 1, 3, 7])
def test_a_delay_of_d_steps_skips_exactly_d_actions(delay):
    commands, ex = run_delayed(delay)
    for t in range(60):
        if t < delay:
            assert np.all(commands[t] == -1.0)  # nothing arrived yet: hold the initial command
            continue
        k = (t - delay) // 5        # newest chunk received by step t
        source = 5 * k
        np.testing.assert_array_equal(commands[t], tagged_chunk(k, 20)[t - source])  # chunk[t - stamp_step]
    assert ex.stats.latencies == [delay] * len(ex.stats.latencies)


def test_delay_shifts_execution_by_exactly_d_steps():
    # One chunk, handed in at different delays: the commands it produces are the same function of time, so
    # a delay of d only drops its first d actions (and holds the previous command meanwhile).
    chunk = tagged_chunk(3, 30)
    runs = {}
    for delay in (0, 4):
        ex = ChunkExecutor(DOF, DT, mode="newest_wins", initial_command=np.zeros(DOF), start_step=10)
        out = []
        for t in range(10, 45):
            if t == 10 + delay:
                ex.add_chunk(chunk, stamp=10 * DT, time_step=DT)
            out.append(ex.next_command())
        runs[delay] = np.array(out)
    np.testing.assert_array_equal(runs[4][4:30], runs[0][4:30])
    np.testing.assert_array_equal(runs[4][:4], np.zeros((4, DOF)))
    np.testing.assert_array_equal(runs[0][:30], chunk)


def test_latency_counts_from_the_camera_frame_when_the_first_action_is_for_the_next_step():
    """The VLA node's chunks start one step after their frame (time_from_start = dt): arriving within the frame's
    own step is latency 0 (not -1), two steps later is 2; execution still follows the first action's time."""
    for delay in (0, 2):
        ex = ChunkExecutor(DOF, DT, mode="newest_wins", initial_command=np.zeros(DOF), start_step=10)
        for _ in range(delay):
            ex.next_command()
        arrival = ex.add_chunk(tagged_chunk(1, 8), stamp=11 * DT, time_step=DT, frame_stamp=10 * DT)
        assert arrival.accepted and arrival.latency_steps == pytest.approx(delay)
        assert arrival.source_step == pytest.approx(11) and arrival.arrival_step == 10 + delay
        command = ex.next_command()  # step 10 + delay
        expected = np.zeros(DOF) if delay == 0 else tagged_chunk(1, 8)[10 + delay - 11]
        np.testing.assert_array_equal(command, expected)  # step 10 precedes the chunk's first action: held
        assert ex.stats.latencies == [delay]


def test_latency_from_nanosecond_stamps_is_a_whole_step_count():
    """Stamps come as integer nanoseconds (sec, nanosec): step 249 at 50 Hz is 4.98 s, which divides back to
    248.99999999999997 steps; the report says 3, not 2.9999999999999716. A frame half a step off stays 2.5."""
    ex = ChunkExecutor(DOF, DT, mode="newest_wins", initial_command=np.zeros(DOF), start_step=249)
    for _ in range(3):
        ex.next_command()
    frame = (249 * 20_000_000) / 1e9
    assert 252 - frame / DT != 3  # the float error this guards against
    arrival = ex.add_chunk(tagged_chunk(1, 8), stamp=frame + DT, time_step=DT, frame_stamp=frame)
    assert arrival.latency_steps == 3 and ex.stats.summary()["latency_steps"]["median"] == 3
    arrival = ex.add_chunk(tagged_chunk(2, 8), stamp=frame + 1.5 * DT, time_step=DT, frame_stamp=frame + 0.5 * DT)
    assert arrival.accepted and abs(arrival.latency_steps - 2.5) < 1e-9  # not snapped to a whole step


def test_holds_last_command_when_no_chunk_covers_the_step():
    ex = ChunkExecutor(DOF, DT, mode="rtc", initial_command=np.full(DOF, 7.0))
    assert np.all(ex.next_command() == 7.0)
    ex.add_chunk(tagged_chunk(1, 3), stamp=1 * DT, time_step=DT)
    got = [ex.next_command() for _ in range(6)]
    np.testing.assert_array_equal(got[:3], tagged_chunk(1, 3))
    for command in got[3:]:
        np.testing.assert_array_equal(command, tagged_chunk(1, 3)[-1])
    assert ex.stats.held_steps == 1 + 3
    with pytest.raises(RuntimeError):
        ChunkExecutor(DOF, DT).next_command()  # nothing to hold at all


def test_rejects_stale_out_of_order_malformed_and_previous_episode_chunks():
    ex = ChunkExecutor(DOF, DT, mode="newest_wins", initial_command=np.zeros(DOF), start_step=40)
    for _ in range(10):
        ex.next_command()
    assert ex.add_chunk(tagged_chunk(0, 10), stamp=40 * DT, time_step=DT).reason.startswith("every action")
    assert ex.add_chunk(np.zeros((5, 7)), stamp=50 * DT, time_step=DT).reason.startswith("expected actions")
    assert not ex.add_chunk(np.full((5, DOF), np.nan), stamp=50 * DT, time_step=DT).accepted
    assert ex.add_chunk(tagged_chunk(1, 10), stamp=49 * DT, time_step=DT).accepted
    assert ex.add_chunk(tagged_chunk(2, 10), stamp=48 * DT, time_step=DT).reason.startswith("older")
    ex.next_command()
    ex.reset(np.ones(DOF))
    assert ex.add_chunk(tagged_chunk(3, 10), stamp=50 * DT, time_step=DT).reason.startswith("sourced before")
    assert np.all(ex.next_command() == 1.0)
    assert ex.stats.chunks_rejected == 5 and ex.stats.chunks_accepted == 1


def test_coarser_chunks_are_interpolated_onto_control_steps():
    ex = ChunkExecutor(DOF, DT, mode="newest_wins", initial_command=np.zeros(DOF))
    chunk = np.repeat(np.array([[0.0], [1.0], [4.0]]), DOF, axis=1)
    ex.add_chunk(chunk, stamp=0.0, time_step=2 * DT)  # a 25 Hz chunk on the 50 Hz loop
    got = [ex.next_command()[0] for _ in range(6)]
    assert got == pytest.approx([0.0, 0.5, 1.0, 2.5, 4.0, 4.0])


def test_temporal_ensemble_weights_older_predictions_exp_minus_m_i():
    m = 0.5
    ex = ChunkExecutor(DOF, DT, mode="temporal_ensemble", ensemble_m=m, initial_command=np.zeros(DOF))
    ex.add_chunk(np.full((10, DOF), 1.0), stamp=0.0, time_step=DT)
    assert ex.next_command()[0] == 1.0
    ex.add_chunk(np.full((10, DOF), 3.0), stamp=1 * DT, time_step=DT)
    ex.add_chunk(np.full((3, DOF), 9.0), stamp=1 * DT, time_step=DT)
    w = np.exp(-m * np.arange(3))
    assert ex.next_command()[0] == pytest.approx((w @ [1.0, 3.0, 9.0]) / w.sum())
    ex.next_command(), ex.next_command()
    assert ex.next_command()[0] == pytest.approx((w[:2] @ [1.0, 3.0]) / w[:2].sum())  # the short chunk ended


def test_rtc_prefix_weights_follow_the_papers_soft_mask():
    ramp = np.array([0.8, 0.6, 0.4, 0.2])
    expected = np.concatenate([[1.0, 1.0], ramp * np.expm1(ramp) / (math.e - 1), np.zeros(4)])
    np.testing.assert_allclose(rtc_prefix_weights(delay=2, end=6, total=10), expected)


def test_rtc_blends_the_new_chunk_into_the_committed_plan_then_follows_it():
    ex = ChunkExecutor(DOF, DT, mode="rtc", initial_command=np.zeros(DOF))
    ex.add_chunk(np.zeros((30, DOF)), stamp=0.0, time_step=DT)
    for _ in range(12):
        ex.next_command()
    # Sourced at step 10, arrives at 12 (delay 2); the committed plan runs to step 29: overlap indices 2..19.
    ex.add_chunk(np.ones((30, DOF)), stamp=10 * DT, time_step=DT)
    got = np.array([ex.next_command()[0] for _ in range(30)])
    weights = rtc_prefix_weights(delay=2, end=20, total=30)
    np.testing.assert_allclose(got[:18], 1.0 - weights[2:20])  # w * committed(0) + (1 - w) * new(1)
    np.testing.assert_array_equal(got[18:28], 1.0)               # past the overlap: the new chunk itself
    assert np.all(np.diff(got) >= 0) and got[0] < 0.2            # a ramp, not a jump

    limited = ChunkExecutor(DOF, DT, mode="rtc", rtc_overlap=4, initial_command=np.zeros(DOF))
    limited.add_chunk(np.zeros((30, DOF)), stamp=0.0, time_step=DT)
    limited.add_chunk(np.ones((30, DOF)), stamp=0.0, time_step=DT)
    got = np.array([limited.next_command()[0] for _ in range(6)])
    np.testing.assert_allclose(got[:4], 1.0 - rtc_prefix_weights(0, 4, 30)[:4])
    assert got[4] == 1.0


def realistic_chunks(seed: int, n: int = 16, period: int = 8, horizon: int = 50, delay: int = 4):
    """Chunks that each track a smooth reference with their own error: a per-chunk offset plus a drift that grows
    along the horizon (what a stochastic policy's successive predictions look like), sourced every `period`."""
    rng = np.random.default_rng(seed)
    t = np.arange(n * period + horizon)[:, None] * DT
    freq, phase = rng.uniform(0.1, 0.4, DOF), rng.uniform(0, 2 * np.pi, DOF)
    reference = 0.3 * np.sin(2 * np.pi * freq * t + phase)  # joints at up to ~0.75 rad/s
    chunks = []
    for k in range(n):
        s = k * period
        offset = rng.normal(0, 0.03, DOF)
        drift = rng.normal(0, 0.002, DOF)
        chunk = reference[s:s + horizon] + offset + np.arange(horizon)[:, None] * drift
        chunks.append((s, s + delay, chunk))
    return chunks, n * period + delay  # steady state: stop before the last chunks run out one by one


def run_mode(mode: str, chunks, steps: int) -> ChunkExecutor:
    source, arrival, first = chunks[0]
    ex = ChunkExecutor(DOF, DT, mode=mode, initial_command=first[arrival - source - 1])
    pending = list(chunks)
    for t in range(steps):
        while pending and pending[0][1] == t:
            source, _, chunk = pending.pop(0)
            assert ex.add_chunk(chunk, stamp=source * DT, time_step=DT).accepted
        ex.next_command()
    return ex


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ensemble_and_rtc_reduce_switch_discontinuity_and_jerk_vs_newest_wins(seed):
    chunks, steps = realistic_chunks(seed)
    results = {mode: run_mode(mode, chunks, steps).stats.summary() for mode in BLENDING_MODES}
    baseline = results["newest_wins"]
    assert baseline["switch_discontinuity"]["count"] == len(chunks)  # hold -> first chunk counts too
    for mode in ("temporal_ensemble", "rtc"):
        assert results[mode]["switch_discontinuity"]["mean"] < 0.5 * baseline["switch_discontinuity"]["mean"], results
        assert results[mode]["jerk_rms"] < 0.5 * baseline["jerk_rms"], results


@pytest.mark.parametrize("mode", BLENDING_MODES)
def test_advance_to_and_plan_read_what_next_command_would_take(mode):
    stepped = ChunkExecutor(DOF, DT, mode=mode, initial_command=np.zeros(DOF))
    jumped = ChunkExecutor(DOF, DT, mode=mode)  # a node's: nothing to hold
    for ex in (stepped, jumped):
        ex.add_chunk(tagged_chunk(0, 20), stamp=0.0, time_step=DT)
    for _ in range(5):
        stepped.next_command()
    jumped.advance_to(5)
    for ex in (stepped, jumped):
        ex.add_chunk(tagged_chunk(1, 20), stamp=3 * DT, time_step=DT)
    first, plan = jumped.plan()
    assert first == 5 and len(plan) == 18  # steps 5..22: chunk 1 ends there
    np.testing.assert_array_equal(jumped.plan()[1], plan)  # reading does not advance
    np.testing.assert_array_equal(plan, [stepped.next_command() for _ in range(18)])
    jumped.advance_to(10**9)  # a long pause: counted as held in one go, nothing left to plan
    assert jumped.step == 10**9 and jumped.stats.steps == 10**9 and jumped.plan()[1].shape == (0, DOF)
    assert jumped.stats.held_steps == 10**9 - 23
