"""The node-side hand-over (plans on the node clock, no ROS) and joint groups in robot units."""

import math

import numpy as np
import pytest

from oxygen_ros.control.chunk_executor import rtc_prefix_weights
from oxygen_ros.control.handover import Handover
from oxygen_ros.control.joint_groups import JointGroup

STEP_NS = 100_000_000  # 0.1 s
T0 = 1_700_000_000_000_000_000  # a wall-clock epoch: the grid must stay exact at this magnitude
DOF = 3


def chunk(k: int, horizon: int = 6) -> np.ndarray:
    """Chunk k's action i is 100 k + i (+ 0.25 j on joint j)."""
    return 100.0 * k + np.arange(horizon)[:, None] + 0.25 * np.arange(DOF)[None, :]


def points_ns(plan) -> np.ndarray:
    return plan.first_ns + plan.step_ns * np.arange(len(plan.values))


def test_newest_wins_passes_the_chunk_on_as_computed():
    handover = Handover("newest_wins", DOF, 0.1)
    plan = handover.add(chunk(1), T0 + STEP_NS, now_ns=T0 + 3 * STEP_NS)
    assert plan.first_ns == T0 + STEP_NS and plan.step_ns == STEP_NS
    np.testing.assert_array_equal(plan.values, chunk(1))


def test_temporal_ensemble_averages_every_prediction_for_a_step_and_keeps_to_the_future():
    m = 0.5
    handover = Handover("temporal_ensemble", DOF, 0.1, ensemble_m=m)
    first = handover.add(chunk(0), T0 + STEP_NS, now_ns=T0 + STEP_NS // 2)
    np.testing.assert_array_equal(first.values, chunk(0))  # alone: as computed, from its first point on
    # Chunk 1 from the frame one step later, out 2.3 steps after that frame: its points for steps 2 and 3 passed.
    now = T0 + STEP_NS + 23 * STEP_NS // 10
    plan = handover.add(chunk(1), T0 + 2 * STEP_NS, now_ns=now)
    assert plan.first_ns == T0 + 4 * STEP_NS  # the first grid step at or after now
    assert points_ns(plan)[0] >= now
    w_old, w_new = 1.0, math.exp(-m)  # the oldest prediction has index 0
    for i, t in enumerate(range(4, 8)):  # steps 4..6 in both chunks, 7 only in chunk 1
        new = chunk(1)[t - 2]
        if t <= 6:
            expected = (w_old * chunk(0)[t - 1] + w_new * new) / (w_old + w_new)
        else:
            expected = new
        np.testing.assert_allclose(plan.values[i], expected)
    assert len(plan.values) == 4  # ends with chunk 1's last point (step 7)


def test_rtc_blends_the_overlap_with_the_committed_plan_by_its_soft_mask():
    handover = Handover("rtc", DOF, 0.1)
    handover.add(chunk(0, 10), T0 + STEP_NS, now_ns=T0)  # committed: steps 1..10
    plan = handover.add(chunk(1, 10), T0 + 3 * STEP_NS, now_ns=T0 + 5 * STEP_NS)  # sourced at step 3, arrives 5
    assert plan.first_ns == T0 + 5 * STEP_NS
    # Indices from the source step 3: 0, 1 ran while the model worked (weight 1), the overlap with the committed
    # plan runs to step 10, then chunk 1 alone.
    weights = rtc_prefix_weights(2, 8, 10)[2:]
    committed = chunk(0, 10)[4:10]  # steps 5..10
    new = chunk(1, 10)[2:]  # steps 5..12
    expected = new.copy()
    expected[:6] = weights[:6, None] * committed + (1 - weights[:6, None]) * new[:6]
    np.testing.assert_allclose(plan.values, expected)
    assert 0 < weights[0] < 1 and weights[-1] == 0  # a real blend, not either plan alone


def test_no_point_is_stale_or_from_before_the_clock_went_back():
    handover = Handover("temporal_ensemble", DOF, 0.1)
    handover.add(chunk(0), T0 + STEP_NS, now_ns=T0)
    # Computed so long ago that every point passed: refused, nothing to publish.
    assert handover.add(chunk(1), T0 + 2 * STEP_NS, now_ns=T0 + 20 * STEP_NS) == \
        "every action is for a step already executed"
    # The clock jumps back an hour (a bag looping): the grid restarts, old chunks play no part.
    back = T0 - 3600 * 10 * STEP_NS
    plan = handover.add(chunk(5), back + STEP_NS, now_ns=back)
    np.testing.assert_array_equal(plan.values, chunk(5))
    assert plan.first_ns == back + STEP_NS and handover.restarts == 1


def test_bad_chunks_are_refused():
    handover = Handover("rtc", DOF, 0.1)
    bad = chunk(0)
    bad[2, 1] = np.nan
    assert handover.add(bad, T0, T0) == "non-finite actions"
    assert "expected actions" in handover.add(np.zeros((4, DOF + 1)), T0, T0)
    with pytest.raises(ValueError, match="unknown hand-over"):
        Handover("average", DOF, 0.1)


def test_a_group_picks_its_joints_by_column_and_maps_them_to_robot_units():
    gripper = JointGroup("left_gripper", "left_gripper_controller/joint_trajectory", ("left_gripper",), (2,),
                         scale=(2.1123,), offset=(-0.6213,))
    values = np.array([[0.0, 5.0, 0.0], [0.0, 5.0, 1.0], [0.0, 5.0, 0.5]])
    np.testing.assert_allclose(gripper.to_robot(values)[:, 0], [-0.6213, 1.4910, 0.43485])
    arm = JointGroup("arm", "arm/joint_trajectory", ("b", "a"), (1, 0), scale=(1.0, 1.0), offset=(0.0, 0.0))
    np.testing.assert_array_equal(arm.to_robot(values), values[:, [1, 0]])
    # The measured state is in the command's units: mapped the same way, picked by name; NaN where not measured.
    state, names = np.array([0.3, 0.0, 1.0]), ("a", "b", "left_gripper")
    np.testing.assert_allclose(gripper.measured_to_robot(state, names), [1.4910])
    np.testing.assert_array_equal(arm.measured_to_robot(state, names), [0.0, 0.3])
    assert np.isnan(gripper.measured_to_robot(state, ("a", "b"))).all()
