"""Whether a joint state is physically plausible: no joint moved further than its velocity limit allows.

A joint with a velocity limit (`output.<group>.max_velocity` or the URDF's, in the controller's units per second)
cannot move more than `max_velocity * dt` between two states `dt` apart. A state that did (a sensor glitch, a
hostile publisher) is dropped and counted by the caller; the jump limit, the holds and the model keep using the
last plausible state. `dt` is the difference of the two states' header stamps, or of their arrival times when
either is unstamped (zero). The allowance grows with the time since the last plausible state, so a robot that
really is elsewhere (a simulator reset) is accepted again once the limit could have carried it there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oxygen_ros.control.joint_groups import JointGroup
from oxygen_ros.control.limits import JointLimits

_SLACK = 1e-6  # relative, for rounding


class StateCheck:
    """`check(state, stamp_ns, now_ns)`: None (and the state becomes the last plausible one) or why it is not."""

    def __init__(self, groups: Sequence[JointGroup], limits: JointLimits | None, state_names: Sequence[str]):
        self.state_names = tuple(state_names)
        # each state joint's velocity limit in the state's own units (controller units / |scale|); inf: no limit
        speed = np.full(len(self.state_names), np.inf)
        if limits is not None:
            for group in groups:
                for joint, scale in zip(group.joints, group.scale, strict=True):
                    if joint in self.state_names:
                        index = self.state_names.index(joint)
                        limit = limits.max_velocity[limits.joints.index(joint)] / abs(scale)
                        speed[index] = min(speed[index], limit)
        self.max_speed = speed
        self.limited = bool(np.isfinite(speed).any())
        self.last: np.ndarray | None = None
        self.last_stamp_ns = 0
        self.last_arrival_ns = 0

    def check(self, state: np.ndarray, stamp_ns: int, now_ns: int) -> str | None:
        state = np.asarray(state, dtype=np.float64)
        if self.limited and self.last is not None:
            stamped = stamp_ns and self.last_stamp_ns
            dt = max(0, (stamp_ns - self.last_stamp_ns) if stamped else (now_ns - self.last_arrival_ns)) / 1e9
            moved = np.abs(state - self.last)
            over = moved > self.max_speed * dt * (1 + _SLACK)
            if over.any():
                detail = ", ".join(f"{j} {moved[i]:.4g} in {dt:.3g} s (limit {self.max_speed[i]:g}/s)"
                                   for i, j in enumerate(self.state_names) if over[i])
                return f"moved faster than its velocity limit since the last plausible state: {detail}"
        self.last, self.last_stamp_ns, self.last_arrival_ns = state, stamp_ns, now_ns
        return None
