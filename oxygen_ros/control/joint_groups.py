"""One controller's share of the command: its joints picked by name, mapped linearly to the controller's units.

A bimanual robot runs one trajectory controller per arm (grippers often apart), and each refuses a trajectory
that names joints it does not own. A group selects its joints' columns from the robot's absolute command (what
the embodiment profile made of the model's chunk, as `action_chunk` carries it), in the group's order, and maps
each to the controller's units:

    controller = offset + scale * command        (velocities: scale * command velocity)

applied only to what the group publishes. For an ALOHA gripper the command is normalized (0 = closed .. 1 = open,
ALOHA's convention), so offset = the controller's closed position and scale = open - closed. The measured joint
state is in the command's units (it is what the embodiment reads as the robot's state; a node brings a
broadcaster's names and units to them first, `oxygen_ros.robots.state_units`), so a
measured position compared with or held at in the controller's units is mapped the same way
(`measured_to_robot`): the limits' jump check and the position hold.

A group's `interface` says what its controller takes: `trajectory` (a joint_trajectory_controller: the plan as a
JointTrajectory) or `velocity` (a forward_command_controller such as a joint group velocity controller: one
velocity per joint, the plan's velocity for the step that executes now, sent each control tick).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TRAJECTORY, VELOCITY = "trajectory", "velocity"
INTERFACES = (TRAJECTORY, VELOCITY)


@dataclass(frozen=True)
class JointGroup:
    name: str
    topic: str
    joints: tuple[str, ...]
    columns: tuple[int, ...]  # each joint's index in the action vector
    scale: tuple[float, ...]  # one per joint
    offset: tuple[float, ...]  # one per joint
    interface: str = TRAJECTORY  # TRAJECTORY or VELOCITY

    def to_robot(self, values: np.ndarray) -> np.ndarray:
        """[n, action dims] positions of the command -> [n, len(joints)] in the controller's units."""
        return np.asarray(self.offset) + np.asarray(self.scale) * np.asarray(values)[:, list(self.columns)]

    def velocities_to_robot(self, values: np.ndarray) -> np.ndarray:
        """[n, action dims] velocities of the command -> [n, len(joints)] in the controller's units per second."""
        return np.asarray(self.scale) * np.asarray(values)[:, list(self.columns)]

    def measured_to_robot(self, state: np.ndarray, state_names: Sequence[str]) -> np.ndarray:
        """The measured positions of the group's joints in the controller's units, offset + scale * measured:
        `state` is the joint state in `state_names` order, in the command's units; NaN for a joint not in
        `state_names`."""
        state = np.asarray(state, dtype=np.float64)
        measured = np.array([state[state_names.index(j)] if j in state_names else np.nan for j in self.joints])
        return np.asarray(self.offset) + np.asarray(self.scale) * measured
