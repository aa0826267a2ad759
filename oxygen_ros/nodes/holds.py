"""The hold: one message to each output group's controller when the node stops commanding it.

A joint_trajectory_controller keeps executing the last trajectory it got to that trajectory's end, so a node that
simply stops publishing (stale camera, stale state, model error, a plan refused by the limits, deactivation,
shutdown) leaves the arm moving on a plan made from a frame it no longer trusts. The command path
(`oxygen_ros.robots.command_path`) remembers which groups the node is commanding and, on each transition to not
commanding, gives the caller exactly one hold per such group (not a stream: a controller that holds needs no
more); this module makes its message. Per group (`output.<group>.hold`):

- `position`: a one-point trajectory at the joints' measured positions (the last plausible joint state) in the
  controller's units (the group's offset + scale * measured, `JointGroup.measured_to_robot`), clamped into the
  joints' position range (a hold that is still not finite is refused and counted), stamped zero (start
  now) and reached one control time step later, from where the controller's command is. This is what
  joint_trajectory_controller does itself to hold (`set_hold_position`), and what stops it on Jazzy and Kilted;
- `empty`: a trajectory without points, for controllers documented to stop on one. joint_trajectory_controller
  on Jazzy and Kilted refuses it ("Empty trajectory received.") and keeps moving: `docs/safety.md`;
- `zero` (a `velocity` group's): every joint's velocity 0. A forward_command_controller keeps applying its last
  command, so a velocity group that is simply no longer sent commands keeps moving at the last velocity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from builtin_interfaces.msg import Duration
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.data.stamps import split_ns
from oxygen_ros.robots.command_path import HOLD_POSITION, HOLD_ZERO


def hold_message(joints: Sequence[str], mode: str, positions: np.ndarray | None,
                 time_step_s: float) -> JointTrajectory | Float64MultiArray:
    """The hold message for `joints`: at `positions` (the controller's units) for `position`, without points for `empty`,
    zero velocities for `zero`."""
    if mode == HOLD_ZERO:
        return Float64MultiArray(data=[0.0] * len(joints))
    msg = JointTrajectory(joint_names=list(joints))  # header.stamp zero: the controller starts it at once
    if mode == HOLD_POSITION:
        sec, nanosec = split_ns(round(time_step_s * 1e9))
        msg.points = [JointTrajectoryPoint(positions=[float(v) for v in positions],
                                           time_from_start=Duration(sec=sec, nanosec=nanosec))]
    return msg
