"""What a ros2_controllers joint_trajectory_controller (Jazzy, Kilted) refuses: its documented validation rules of an
incoming trajectory (`JointTrajectoryController::validate_trajectory_msg` and `validate_trajectory_point_field`,
`joint_trajectory_controller.cpp`; the parameter defaults in `joint_trajectory_controller_parameters.yaml`; file and
lines in docs/controllers.md), written out so that every plan shape the nodes can publish is checked against them.
The two branches hold the same rules. This is a reading of the source, not a controller: no real controller runs.

A refused message is dropped whole (the topic callback returns before it reaches the controller), with one error
line in the controller's log and nothing on a topic the node could read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FLOAT_EPSILON = 2.0 ** -23  # std::numeric_limits<float>::epsilon(), the controller's "not zero" at the end


@dataclass(frozen=True)
class ControllerSettings:
    """The controller's joints and the parameters its checks read (defaults: Jazzy's and Kilted's)."""

    joints: tuple[str, ...]
    allow_partial_joints_goal: bool = False
    allow_nonzero_velocity_at_trajectory_end: bool = False
    allow_integration_in_goal_trajectories: bool = False
    effort_interface: bool = False  # an `effort` command interface: only then may points carry efforts


@dataclass(frozen=True)
class TrajectoryPoint:
    time_from_start_ns: int
    positions: Sequence[float] = ()
    velocities: Sequence[float] = ()
    accelerations: Sequence[float] = ()
    effort: Sequence[float] = ()


def refusal(settings: ControllerSettings, joint_names: Sequence[str], points: Sequence[TrajectoryPoint],
            stamp_ns: int, now_ns: int) -> str | None:
    """Why the controller refuses this trajectory, in the order it checks (the first failing check's log line),
    or None when it takes it. `stamp_ns`: header.stamp (0: start now); `now_ns`: the controller's clock when the
    message arrives."""
    names = list(joint_names)
    if not settings.allow_partial_joints_goal and len(names) != len(settings.joints):
        return "Joints on incoming trajectory don't match the controller joints."
    if not names:
        return "Empty joint names on incoming trajectory."
    if not points:
        return "Empty trajectory received."
    for name in names:
        if name not in settings.joints:
            return f"Incoming joint {name} doesn't match the controller's joints."
    if not settings.allow_nonzero_velocity_at_trajectory_end:
        for name, velocity in zip(names, points[-1].velocities, strict=False):
            if abs(velocity) > FLOAT_EPSILON:
                return f"Velocity of last trajectory point of joint {name} is not zero: {velocity:.15f}"
    if stamp_ns != 0 and stamp_ns + points[-1].time_from_start_ns < now_ns:
        return "Received trajectory with non-zero start time that ends in the past"
    previous = 0
    for i, point in enumerate(points):
        if i > 0 and point.time_from_start_ns <= previous:
            return f"Time between points {i - 1} and {i} is not strictly increasing"
        previous = point.time_from_start_ns
        reason = _fields(settings, len(names), point, i)
        if reason is not None:
            return reason
        if not settings.effort_interface and len(point.effort):
            return ("Trajectories with effort fields are only supported for controllers using the 'effort' command "
                    "interface.")
    return None


def _fields(settings: ControllerSettings, count: int, point: TrajectoryPoint, i: int) -> str | None:
    """Positions must have one value per joint name; velocities and accelerations one each or none (with
    integration allowed: any of the three may be empty, not all)."""
    fields = (("positions", point.positions), ("velocities", point.velocities),
              ("accelerations", point.accelerations))
    if settings.allow_integration_in_goal_trajectories:
        if not any(len(values) for _, values in fields):
            return "The given trajectory has no position, velocity, or acceleration points."
        may_be_empty = ("positions", "velocities", "accelerations")
    else:
        may_be_empty = ("velocities", "accelerations")
    for name, values in fields:
        if name in may_be_empty and not len(values):
            continue
        if len(values) != count:
            return f"Mismatch between joint_names size ({count}) and {name} ({len(values)}) at point #{i}."
    return None
