"""A robot's side of a fleet run without ROS: send times with phase and jitter, chunks matched to frames by stamp,
latency from the frame's stamp (not its send time), late chunks and frames with no chunk both missed."""

import argparse

import pytest

from oxygen_ros.commands.fleet_dds_bench import parse_run, robots_at_target
from oxygen_ros.evaluation.fleet.robot_load import FrameLedger, FrameSchedule, frames_from_rows, pool, score

MS = 1_000_000


def test_schedule_keeps_the_period_from_its_phase_with_bounded_jitter():
    schedule = FrameSchedule(10.0, start_ns=0, phase_s=0.03, jitter=0.2, seed=1)
    times = [schedule.next_ns() for _ in range(200)]
    offsets = [t - (30 * MS + k * 100 * MS) for k, t in enumerate(times)]
    assert min(offsets) >= 0 and max(offsets) <= 20 * MS
    assert len(set(offsets)) > 100  # jittered, not phase-locked
    assert times == sorted(times)
    steady = FrameSchedule(10.0, start_ns=5, jitter=0.0)
    assert [steady.next_ns() for _ in range(3)] == [5, 5 + 100 * MS, 5 + 200 * MS]
    with pytest.raises(ValueError):
        FrameSchedule(10.0, 0, jitter=1.0)


def test_latency_runs_from_the_stamp_and_misses_count_late_and_absent_chunks():
    ledger = FrameLedger()
    ledger.sent(0, 0)  # on time: 40 ms
    ledger.sent(100 * MS, 100 * MS)  # late: 150 ms
    ledger.sent(200 * MS, 200 * MS - 500 * MS)  # stamped 500 ms in the past, chunk 10 ms after sending: late
    ledger.sent(300 * MS, 300 * MS)  # never answered
    assert ledger.received(40 * MS, 40 * MS) is False  # no frame has that stamp
    assert ledger.received(0, 40 * MS)
    assert ledger.received(100 * MS, 250 * MS)
    assert ledger.received(-300 * MS, 210 * MS)
    assert ledger.received(0, 60 * MS) is False  # a second chunk for one frame
    assert (ledger.unknown_chunks, ledger.duplicate_chunks) == (1, 1)
    frames = frames_from_rows(ledger.rows())
    result = score(frames, slo_s=0.1)
    assert (result.frames, result.on_time, result.late, result.missed) == (4, 1, 2, 1)
    assert result.latencies_ms == [40.0, 150.0, 510.0]
    assert result.attainment == 0.25
    window = score(frames, slo_s=0.1, start_ns=100 * MS, end_ns=300 * MS)  # by send time
    assert (window.frames, window.on_time, window.late, window.missed) == (2, 0, 2, 0)


def test_pool_weighs_frames_and_reports_the_worst_robot():
    ledger = FrameLedger()
    for k in range(4):
        ledger.sent(k, k)
        ledger.received(k, k + 10 * MS)
    good = score(ledger.frames, 0.1)
    bad = score([*frames_from_rows([[0, 0, None]])], 0.1)
    pooled = pool([good, bad])
    assert (pooled.robots, pooled.frames, pooled.on_time, pooled.missed) == (2, 5, 4, 1)
    assert pooled.attainment == 0.8 and pooled.worst_robot == 0.0
    assert pooled.latency_ms_p50 == 10.0


def test_runs_are_node_parameters_and_robots_at_target_needs_every_smaller_count():
    assert parse_run("design=robion,queue=esf") == {"design": "robion", "queue": "esf"}
    for bad in ("queue", "=esf", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_run(bad)
    points = {2: {"attainment": 1.0}, 4: {"attainment": 0.97}, 8: {"attainment": 0.99}}
    assert robots_at_target(points) == 2
    assert robots_at_target({2: {"attainment": 0.5}}) == 0
