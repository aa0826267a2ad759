"""The messages of a checked plan (`oxygen_ros.robots.command_path.Command`), as every node publishes them.

`action_chunk`: every action joint, the robot's absolute command; then one message per output group in its
controller's units: a JointTrajectory (trajectory group), or the velocities of the step that executes now
(velocity group, a Float64MultiArray). header.stamp is one step before the first point, point i at (i + 1) steps
(times the limits' stretch for the groups), as `chunk_to_trajectory` lays them out; velocities where the
embodiment has them.
"""

from __future__ import annotations

from collections.abc import Sequence

from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.control.joint_groups import TRAJECTORY, JointGroup
from oxygen_ros.robots.command_path import Command

from .conversions import chunk_to_trajectory


def plan_stamp_ns(command: Command) -> int:
    """The plan's header stamp: one step before its first point."""
    return command.plan.first_ns - command.plan.step_ns


def plan_messages(command: Command, action_names: Sequence[str], groups: Sequence[JointGroup],
                  time_step_s: float) -> tuple[JointTrajectory, list[JointTrajectory | Float64MultiArray]]:
    """`action_chunk`'s message, and one per group (in `groups` order)."""
    stamp_ns, count = plan_stamp_ns(command), len(command.plan.values)
    chunk = chunk_to_trajectory(command.positions, action_names, stamp_ns, time_step_s, count, command.velocities)
    outputs = []
    for group, out in zip(groups, command.groups, strict=True):
        if group.interface == TRAJECTORY:
            outputs.append(chunk_to_trajectory(out.positions, group.joints, stamp_ns, out.step_s, count,
                                               out.velocities))
        else:  # a velocity controller: the velocities of the step that executes now, until the next command
            outputs.append(Float64MultiArray(data=[float(v) for v in out.velocities[command.first]]))
    return chunk, outputs
