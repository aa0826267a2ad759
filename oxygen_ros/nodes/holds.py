"""The hold: one message to each output group's controller when the node stops commanding it.

A joint_trajectory_controller keeps executing the last trajectory it got to that trajectory's end, so a node that
simply stops publishing (stale camera, stale state, model error, a plan refused by the limits, deactivation,
shutdown) leaves the arm moving on a plan made from a frame it no longer trusts. `Holds` remembers which groups
the node is commanding and, on each transition to not commanding, gives the caller exactly one hold per such
group (not a stream: a controller that holds needs no more). Per group (`output.<group>.hold`):

- `position`: a one-point trajectory at the joints' measured positions (the newest good joint state) in the
  controller's units (the group's offset + scale * measured, `JointGroup.measured_to_robot`), stamped zero (start
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

from oxygen_ros.control.joint_groups import JointGroup
from oxygen_ros.data.stamps import split_ns

from .parameters import HOLD_POSITION, HOLD_ZERO


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


class Holds:
    """Which groups the node commands; `stop` returns the holds due (one per commanded group) and forgets them."""

    def __init__(self, groups: Sequence[tuple[JointGroup, str]], state_names: Sequence[str], time_step_s: float):
        """`groups`: per output group (the group, its hold mode; a position hold's joints are all in
        `state_names`, `parameters.read_limits`); `state_names`: the measured state's joints, in its order."""
        self.groups = [(group, mode) for group, mode in groups]
        self.state_names = tuple(state_names)
        self.time_step_s = time_step_s
        self.commanding = [False] * len(self.groups)
        self.sent = 0  # holds sent, all groups together
        self.last_reason = "none"  # why the node last stopped commanding

    def commanded(self) -> None:
        """A plan went out to every group."""
        self.commanding = [True] * len(self.groups)

    def stop(self, reason: str, measured: np.ndarray | None) -> list[tuple[int, JointTrajectory | Float64MultiArray]]:
        """(group index, hold) for every group being commanded; `measured`: the newest good joint state (the
        command's units, `state_names` order), held at in each controller's units."""
        due = []
        for index, (group, mode) in enumerate(self.groups):
            if not self.commanding[index]:
                continue
            self.commanding[index] = False
            # a group is commanded only once a joint state has arrived, so a position hold always has one
            positions = group.measured_to_robot(measured, self.state_names) if mode == HOLD_POSITION else None
            due.append((index, hold_message(group.joints, mode, positions, self.time_step_s)))
        if due:
            self.sent += len(due)
            self.last_reason = reason
        return due
