"""The joint_trajectory_controller rules (Jazzy, Kilted defaults; docs/controllers.md cites the source lines): each
rule refuses what the controller refuses, and every plan shape the node builds in-process passes them. The node's
published messages are checked over DDS in test_vla_node_embodiment.py and test_vla_node_controllers.py."""

import numpy as np
import pytest

from oxygen_ros.control.trajectory_rules import ControllerSettings, TrajectoryPoint, refusal
from oxygen_ros.nodes.conversions import chunk_to_trajectory, trajectory_refusal
from oxygen_ros.nodes.holds import hold_message
from oxygen_ros.robots.command_path import HOLD_EMPTY, HOLD_POSITION

JOINTS = ("a", "b")
SETTINGS = ControllerSettings(JOINTS)
STEP = 100_000_000


def point(i: int, **fields) -> TrajectoryPoint:
    return TrajectoryPoint((i + 1) * STEP, **{"positions": [0.0, 0.0], **fields})


@pytest.mark.parametrize("names, points, stamp, message", [
    (["a"], [point(0, positions=[0.0])], 0, "Joints on incoming trajectory don't match"),
    (["a", "c"], [point(0)], 0, "Incoming joint c doesn't match"),
    (["a", "b"], [], 0, "Empty trajectory received."),
    (["a", "b"], [point(0, velocities=[0.0, 0.0]), point(1, velocities=[0.0, 1e-3])], 0,
     "Velocity of last trajectory point of joint b is not zero"),
    (["a", "b"], [point(0), point(1)], 1_000_000_000, "ends in the past"),
    (["a", "b"], [point(1), point(0)], 0, "not strictly increasing"),
    (["a", "b"], [point(0), point(0)], 0, "not strictly increasing"),
    (["a", "b"], [point(0, positions=[0.0])], 0, "joint_names size (2) and positions (1) at point #0"),
    (["a", "b"], [point(0, velocities=[0.0])], 0, "joint_names size (2) and velocities (1)"),
    (["a", "b"], [point(0, positions=[])], 0, "positions (0)"),
    (["a", "b"], [point(0, effort=[1.0, 1.0])], 0, "effort fields"),
])
def test_each_documented_rule_refuses(names, points, stamp, message):
    reason = refusal(SETTINGS, names, points, stamp, now_ns=2_000_000_000)
    assert reason is not None and message in reason, reason


def test_what_the_rules_take():
    assert refusal(SETTINGS, ["b", "a"], [point(0, velocities=[1.0, 0.0]), point(1, velocities=[0.0, 0.0])],
                   0, 5_000_000_000) is None  # any joint order; velocity in the middle; stamp 0 never in the past
    assert refusal(SETTINGS, JOINTS, [point(0)], 1_950_000_000, 2_000_000_000) is None  # ends 50 ms ahead
    assert refusal(SETTINGS, JOINTS, [point(0, velocities=[1e-8, 0.0])], 0, 0) is None  # below float epsilon
    ending = [point(0, velocities=[1.0, 1.0])]
    assert refusal(ControllerSettings(JOINTS, allow_nonzero_velocity_at_trajectory_end=True), JOINTS, ending, 0, 0) \
        is None
    assert refusal(ControllerSettings(("a", "b", "c"), allow_partial_joints_goal=True), JOINTS, [point(0)], 0, 0) \
        is None
    assert refusal(ControllerSettings(JOINTS, allow_integration_in_goal_trajectories=True), JOINTS,
                   [point(0, positions=[], velocities=[0.0, 0.0])], 0, 0) is None


def test_every_chunk_trajectory_the_nodes_build_ends_at_rest_and_passes():
    """Velocity chunks (DROID's, a stretched grid, a blended hand-over) end with velocity 0 on every joint: the
    controller refused the whole plan before; the other points keep theirs."""
    rng = np.random.default_rng(3)
    positions, velocities = rng.normal(size=(15, 2)), rng.normal(size=(15, 2))
    stamp = 10_000_000_000
    for step_s, horizon in ((1 / 15, 8), (1 / 15 * 2.5, 15), (0.02, 1)):  # the profile's grid, stretched, one point
        msg = chunk_to_trajectory(positions, JOINTS, stamp, step_s, horizon, velocities)
        assert trajectory_refusal(msg, SETTINGS, now_ns=stamp) is None
        assert list(msg.points[-1].velocities) == [0.0, 0.0]
        for i, p in enumerate(msg.points[:-1]):
            np.testing.assert_array_equal(p.velocities, velocities[i])
        np.testing.assert_array_equal(msg.points[-1].positions, positions[horizon - 1])
    assert trajectory_refusal(chunk_to_trajectory(positions, JOINTS, stamp, 0.02, 8), SETTINGS, stamp) is None


def test_holds_pass_except_the_empty_one_which_the_docs_say_is_refused():
    position = hold_message(JOINTS, HOLD_POSITION, np.array([0.1, 0.2]), 0.02)
    assert trajectory_refusal(position, SETTINGS, now_ns=10**18) is None  # stamped 0: starts now, never late
    empty = hold_message(JOINTS, HOLD_EMPTY, None, 0.02)
    assert trajectory_refusal(empty, SETTINGS, now_ns=0) == "Empty trajectory received."
