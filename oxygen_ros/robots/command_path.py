"""One robot's command path: the robot's absolute command -> what each of its output groups' controllers gets.

The input is an acted chunk already made the robot's absolute command by the embodiment profile
(`oxygen_ros.control.embodiment`: positions, then velocities where the profile has them). Every front end that
commands a robot passes it through here, in this order, and publishes only what comes out:

1. a chunk with a non-finite value is refused (`nonfinite`);
2. the hand-over (`oxygen_ros.control.handover`) makes it the plan to execute, or refuses it (`unused`: every point
   already past); a plan whose last point is already past when it goes out (its frame waited too long under load)
   is refused (`past`, counted in `plans_past`): a joint_trajectory_controller refuses a trajectory that ends in
   the past, and the robot gets a hold instead;
3. each output group takes its joints in its controller's units (`oxygen_ros.control.joint_groups`); a value
   that overflows there is refused (`overflow`);
4. the joint limits (`oxygen_ros.control.limits`) clamp or refuse the groups' plan (`limits`), `max_jump` measured
   from the last plausible joint state (`robots.state_check`).

When the robot is no longer commanded (inputs stale, a model error, a refused plan, deactivation, shutdown) `stop`
gives one hold per group being commanded (`docs/safety.md`). A position hold is the measured position in the
controller's units, clamped into the joint's position range (counted in `holds_clamped`); a hold that is still not
finite (a joint without a range whose state overflows in the controller's units) is refused: nothing goes to that
controller, and it is counted in `holds_refused` and named in the hold's `refused` text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from oxygen_ros.control.handover import Handover, Plan
from oxygen_ros.control.joint_groups import TRAJECTORY, VELOCITY, JointGroup
from oxygen_ros.control.limits import JointLimits, Limited, apply_limits, first_ahead

HOLD_POSITION = "position"  # a one-point trajectory at the measured position
HOLD_EMPTY = "empty"  # a trajectory without points
HOLD_ZERO = "zero"  # a velocity group's: every joint's velocity 0
HOLD_MODES = {TRAJECTORY: (HOLD_POSITION, HOLD_EMPTY), VELOCITY: (HOLD_ZERO,)}  # by the group's interface

NONFINITE, UNUSED, OVERFLOW, LIMITS, PAST = "nonfinite", "unused", "overflow", "limits", "past"  # why refused
LIMIT_REJECTED = "limit_rejected"  # a front end's state (engine_status.state): its last plan was refused by the limits


@dataclass(frozen=True)
class GroupCommand:
    """One group's share of a plan, in its controller's units: positions [n, joints], velocities (None without)
    and the time between points (the limits may have stretched it)."""

    positions: np.ndarray
    velocities: np.ndarray | None
    step_s: float


@dataclass(frozen=True)
class Command:
    """A checked plan: `positions` / `velocities` the robot's absolute command (every action joint), `groups` one
    per output group, `first` the index of the first point not yet past when it goes out."""

    plan: Plan
    positions: np.ndarray
    velocities: np.ndarray | None
    groups: tuple[GroupCommand, ...]
    first: int


@dataclass(frozen=True)
class Refusal:
    """A chunk not published: `kind` (NONFINITE, UNUSED, OVERFLOW, LIMITS, PAST), why in words, and for LIMITS
    which limit refused it."""

    kind: str
    detail: str
    limit: str = ""


@dataclass(frozen=True)
class Hold:
    """Group `group`'s hold: its mode and, for a position hold, the positions in the controller's units; `refused`
    says why no hold can be sent to it (then `positions` is None)."""

    group: int
    mode: str
    positions: np.ndarray | None = None
    refused: str = ""


class CommandPath:
    """`start()` on activation, `command(...)` per acted chunk, `stop(...)` when the robot is no longer commanded."""

    def __init__(self, groups: Sequence[JointGroup], hold_modes: Sequence[str], limits: JointLimits | None,
                 policy: str, state_names: Sequence[str], action_names: Sequence[str], time_step_s: float,
                 has_velocity: bool, handover: str, ensemble_m: float = 0.01, rtc_overlap: int = 0):
        self.groups, self.hold_modes = tuple(groups), tuple(hold_modes)
        self.limits, self.policy = limits, policy
        self.state_names, self.action_names = tuple(state_names), tuple(action_names)
        self.time_step_s = time_step_s
        self.columns = len(self.action_names) * (2 if has_velocity else 1)
        self._handover_args = (handover, self.columns, time_step_s, ensemble_m, rtc_overlap)
        self.handover = Handover(*self._handover_args)
        self.commanding = [False] * len(self.groups)
        self.nonfinite_chunks = 0
        self.overflows = 0  # plans that overflow in a controller's units
        self.chunks_unused = 0  # chunks the hand-over could not use
        self.plans_past = 0  # plans whose last point had passed when they would have gone out
        self.limits_clamped = 0  # published plans with positions moved into range
        self.limits_slowed = 0  # published plans whose time grid was stretched
        self.limits_rejected: dict[str, int] = {}  # joint -> plans refused for it
        self.holds_sent = 0
        self.holds_clamped = 0  # position holds moved into the position range
        self.holds_refused = 0  # holds not sent: not finite in the controller's units
        self.last_hold_reason = "none"

    def counts(self) -> dict[str, int | str]:
        """The holds' and the limits' counters, as engine_status and /diagnostics report them."""
        return {
            "holds_sent": self.holds_sent,
            "holds_clamped": self.holds_clamped,
            "holds_refused": self.holds_refused,
            "last_hold_reason": self.last_hold_reason,
            "plans_past": self.plans_past,
            "limits": "none" if self.limits is None else self.policy,
            "limits_clamped": self.limits_clamped,
            "limits_slowed": self.limits_slowed,
            "limits_rejected": sum(self.limits_rejected.values()),
            "limits_rejected_joints": ", ".join(f"{j}: {n}" for j, n in self.limits_rejected.items()) or "none",
        }

    @property
    def step_ns(self) -> int:
        return self.handover.step_ns

    def start(self) -> None:
        """A fresh hand-over: nothing planned before this activation is blended into what comes after."""
        self.handover = Handover(*self._handover_args)

    def command(self, actions: np.ndarray, first_ns: int, now_ns: int, measured: np.ndarray) -> Command | Refusal:
        """`actions` [H, columns] the robot's absolute command, point i for `first_ns + i * time_step` (node clock);
        `now_ns` the time it goes out; `measured` the last plausible joint state (`state_names` order)."""
        actions = np.asarray(actions, dtype=np.float64)
        finite = np.isfinite(actions)
        if not finite.all():  # never sent to a robot
            self.nonfinite_chunks += 1
            per_joint = finite.reshape(len(finite), -1, len(self.action_names)).all(axis=(0, 1))
            bad = [name for name, ok in zip(self.action_names, per_joint, strict=True) if not ok]
            return Refusal(NONFINITE, f"action chunk has {finite.size - finite.sum()} non-finite values of "
                                      f"{finite.size} (joints {', '.join(bad)}); not published")
        plan = self.handover.add(actions, first_ns, now_ns)
        if isinstance(plan, str):
            self.chunks_unused += 1
            return Refusal(UNUSED, plan)
        end_ns = plan.first_ns + (len(plan.values) - 1) * plan.step_ns
        if end_ns < now_ns:  # never sent: a controller refuses a trajectory that ends in the past
            self.plans_past += 1
            return Refusal(PAST, f"the plan ended {(now_ns - end_ns) / 1e6:.0f} ms before it could go out (its frame "
                                 f"was {(now_ns - first_ns) / 1e6 + self.time_step_s * 1e3:.0f} ms old); not "
                                 "published")
        joints = len(self.action_names)
        positions = plan.values[:, :joints]
        velocities = plan.values[:, joints:] if plan.values.shape[1] > joints else None
        with np.errstate(over="ignore"):  # an overflow is refused just below
            groups = [GroupCommand(g.to_robot(positions),
                                   None if velocities is None else g.velocities_to_robot(velocities),
                                   self.time_step_s) for g in self.groups]
        if not all(np.isfinite(c.positions).all() and (c.velocities is None or np.isfinite(c.velocities).all())
                   for c in groups):
            self.overflows += 1
            return Refusal(OVERFLOW, "a plan overflows in robot units (output.*.scale / offset); not published")
        first = first_ahead(plan.first_ns, plan.step_ns, now_ns, len(plan.values))
        if self.limits is not None:
            limited = self._limited(groups, first, measured)
            if isinstance(limited, Refusal):
                return limited
            groups = limited
        self.commanding = [True] * len(self.groups)
        return Command(plan, positions, velocities, tuple(groups), first)

    def _limited(self, groups: list[GroupCommand], first: int, measured: np.ndarray) -> list[GroupCommand] | Refusal:
        planned = np.concatenate([c.positions for c in groups], axis=1)
        # in the controller's units, as the plan; a joint without a measured position has no jump limit
        # (`parameters.read_limits`): its NaN never exceeds one
        with np.errstate(over="ignore", invalid="ignore"):  # a state that overflows there is never within a jump
            at = np.concatenate([g.measured_to_robot(measured, self.state_names) for g in self.groups])
        result = apply_limits(planned, self.limits, at, self.time_step_s, first, self.policy)
        if not isinstance(result, Limited):
            for joint in result.joints:
                self.limits_rejected[joint] = self.limits_rejected.get(joint, 0) + 1
            return Refusal(LIMITS, f"plan refused ({result.limit} limit, {self.policy}): {result.detail}",
                           result.limit)
        self.limits_clamped += bool(result.clamped)
        self.limits_slowed += result.time_scale > 1.0
        ends = np.cumsum([len(g.joints) for g in self.groups])[:-1]
        moved = np.split(result.values != planned, ends, axis=1)  # clamped into range: no velocity there
        return [GroupCommand(values, None if c.velocities is None
                             else np.where(held, 0.0, c.velocities / result.time_scale),
                             self.time_step_s * result.time_scale)
                for c, values, held in zip(groups, np.split(result.values, ends, axis=1), moved, strict=True)]

    def robot_positions(self, command: Command) -> np.ndarray:
        """A checked plan's positions [n, action joints] in the robot's action units: each group's, limits applied,
        taken back out of its controller's units; a joint in no group as computed."""
        positions = np.array(command.positions, dtype=np.float64)
        for group, part in zip(self.groups, command.groups, strict=True):
            positions[:, list(group.columns)] = (part.positions - np.asarray(group.offset)) / np.asarray(group.scale)
        return positions

    def stop(self, reason: str, measured: np.ndarray | None) -> list[Hold]:
        """One hold per group being commanded, which is then no longer; `measured`: the last plausible joint state
        (`state_names` order; a group is commanded only once one has arrived)."""
        due = []
        for index, (group, mode) in enumerate(zip(self.groups, self.hold_modes, strict=True)):
            if not self.commanding[index]:
                continue
            self.commanding[index] = False
            due.append(self._hold(index, group, mode, measured) if mode == HOLD_POSITION else Hold(index, mode))
        if due:
            self.holds_sent += sum(not h.refused for h in due)
            self.last_hold_reason = reason
        return due

    def _hold(self, index: int, group: JointGroup, mode: str, measured: np.ndarray) -> Hold:
        with np.errstate(over="ignore"):  # clamped or refused just below
            positions = group.measured_to_robot(measured, self.state_names)
        if self.limits is not None:
            columns = [self.limits.joints.index(j) for j in group.joints]
            clamped = np.clip(positions, self.limits.lower[columns], self.limits.upper[columns])
            if not np.array_equal(clamped, positions, equal_nan=True):
                self.holds_clamped += 1
            positions = clamped
        if not np.isfinite(positions).all():
            self.holds_refused += 1
            bad = [j for j, v in zip(group.joints, positions, strict=True) if not np.isfinite(v)]
            return Hold(index, mode, refused=f"the measured position of {', '.join(bad)} is not finite in the "
                                             f"controller's units (output.{group.name}.scale / offset)")
        return Hold(index, mode, positions)
