"""One controller's share of the action vector: its joints picked by name, mapped linearly to robot units.

A bimanual robot runs one trajectory controller per arm (grippers often apart), and each refuses a trajectory
that names joints it does not own. A group selects its joints' columns from the model's actions, in the group's
order, and maps each to the robot's units:

    robot = offset + scale * model

applied only to what is published (the model's own action space is untouched). For a gripper the model gives
normalized (0 = closed .. 1 = open, ALOHA's convention), offset = the robot's closed position and
scale = open - closed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class JointGroup:
    name: str
    topic: str
    joints: tuple[str, ...]
    columns: tuple[int, ...]  # each joint's index in the action vector
    scale: tuple[float, ...]  # one per joint
    offset: tuple[float, ...]  # one per joint

    def to_robot(self, values: np.ndarray) -> np.ndarray:
        """[n, action dims] in model units -> [n, len(joints)] in robot units."""
        return np.asarray(self.offset) + np.asarray(self.scale) * np.asarray(values)[:, list(self.columns)]
