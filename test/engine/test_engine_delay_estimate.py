"""The delay real-time chunking guides with (`engine/delay_estimate.py`): a high quantile of the recent measured
delays, warm-up set aside, following the load, bad measurements dropped."""

import pytest

from oxygen_ros.engine.delay_estimate import DelayEstimate


def test_no_estimate_until_a_measurement_past_the_warm_up():
    estimate = DelayEstimate(warmup=2)
    assert estimate.next_delay() is None
    estimate.add(30)
    estimate.add(12)
    assert estimate.next_delay() is None  # both were warm-up calls
    estimate.add(3)
    assert estimate.next_delay() == 3


def test_slow_warm_up_calls_do_not_inflate_the_estimate():
    """A model's first calls (here 40 and 25 steps) against a steady 3-4: the estimate is the steady delay, where
    the maximum over every call (what LeRobot's LatencyTracker gives) would stay at 40."""
    estimate = DelayEstimate(window=32, quantile=0.9, warmup=2)
    measured = [40, 25] + [3, 4, 3, 3, 4, 3, 3, 3, 4, 3] * 3
    for steps in measured:
        estimate.add(steps)
    assert estimate.next_delay() == 4
    assert max(measured) == 40


def test_one_stall_does_not_hold_the_estimate_up_but_a_slower_load_raises_it():
    estimate = DelayEstimate(window=32, quantile=0.9, warmup=0)
    for steps in [3] * 20 + [15] + [3] * 11:
        estimate.add(steps)
    assert estimate.next_delay() == 3
    for _ in range(8):  # other robots join: a quarter of the window now takes 6 steps
        estimate.add(6)
    assert estimate.next_delay() == 6
    for _ in range(32):  # and once the window holds only the new load, the old one is forgotten
        estimate.add(5.2)
    assert estimate.next_delay() == 6  # whole steps, rounded up


def test_bad_measurements_are_dropped_and_counted():
    estimate = DelayEstimate(warmup=0)
    estimate.add(4)
    for bad in (float("nan"), float("inf"), -1, "3", None, True):
        assert estimate.add(bad) is False
    assert estimate.dropped == 6 and estimate.measured == 1
    assert estimate.next_delay() == 4


def test_settings_are_checked():
    for kwargs in ({"window": 0}, {"warmup": -1}, {"quantile": 1.5}):
        with pytest.raises(ValueError):
            DelayEstimate(**kwargs)
