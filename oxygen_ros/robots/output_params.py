"""A robot's output groups and their joint limits, read from the output parameters (`robot_description`,
`output.groups`, `output.<group>.*`; their meanings: docs/nodes.md, docs/controllers.md, docs/safety.md).

Every front end that commands a robot through its command path (`robots.command_path`) reads them here: the VLA
node and the fleet node from their ROS parameters, `serve` from a parameter file when it is given them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from oxygen_ros.control.embodiment import Embodiment
from oxygen_ros.control.handover import HANDOVERS
from oxygen_ros.control.joint_groups import INTERFACES, TRAJECTORY, VELOCITY, JointGroup
from oxygen_ros.control.limits import POLICIES as LIMIT_POLICIES
from oxygen_ros.control.limits import JointLimits, urdf_limits
from oxygen_ros.model.rtc import GUIDANCE, PREFIX
from oxygen_ros.rtc_mask import Schedule

from .command_path import HOLD_MODES, HOLD_POSITION, CommandPath
from .engine_params import OPTIONAL, REQUIRED, ParameterError, Reader, Spec
from .rtc_guide import RtcSettings

OUTPUT_SPECS = (
    Spec("robot_description", "", "URDF text (as robot_state_publisher takes it): limits of the output groups' "
                                  "joints not given in output.<group>.*; empty: none from a URDF"),
    Spec("limits.policy", "clamp", "a plan past a position or velocity limit: clamp (positions into the range, "
                                   "a too fast plan slowed by stretching its time grid) or reject (nothing "
                                   "published, a hold); past max_jump it is rejected either way",
         " | ".join(LIMIT_POLICIES)),
    Spec("output.handover", "newest_wins", "what a new chunk does to the plan already published: newest_wins "
                                           "publishes each chunk as computed; temporal_ensemble and rtc publish "
                                           "the blend of the received chunks from the present control step on; "
                                           "rtc_guided publishes each chunk as computed, sampled with real-time "
                                           "chunking's guidance toward the chunk being executed (docs/rtc.md)",
         " | ".join(HANDOVERS)),
    Spec("output.temporal_ensemble_m", 0.01, "with temporal_ensemble: weight exp(-m i) of the i-th oldest "
                                             "prediction for a step", ">= 0"),
    Spec("output.rtc_overlap", 0, "with rtc: blend over at most this many steps after the hand-over; 0: the "
                                  "whole overlap with the published plan", ">= 0"),
    Spec("output.rtc_execution_horizon", 0, "with rtc_guided: the chunk index where guidance toward the executed "
                                            "chunk stops (the paper's H - s); 0: every executed point", ">= 0"),
    Spec("output.rtc_schedule", Schedule.EXP.value, "with rtc_guided: the guidance weights' decay after the delay",
         " | ".join(Schedule)),
    Spec("output.rtc_max_guidance_weight", 5.0, "with rtc_guided: the clip of the guidance weight (beta)", "> 0"),
    Spec("output.rtc_method", GUIDANCE, "with rtc_guided: guidance (inpainting, any checkpoint) or prefix (the "
                                        "committed actions given as known: a checkpoint trained with train-tiny "
                                        "--rtc-max-delay; no backward pass)", f"{GUIDANCE} | {PREFIX}"),
    Spec("output.groups", OPTIONAL, "joint groups, each published as its own JointTrajectory (one per "
                                    "controller); unset: action_chunk only"),
)
OUTPUT = {spec.name: spec for spec in OUTPUT_SPECS}
GROUP_FIELDS = ("joints", "interface", "topic", "scale", "offset", "hold", "lower", "upper", "max_velocity",
                "max_jump")
GROUP_SPECS = {  # output.<group>.<field>: default, description
    "joints": (REQUIRED, "the group's joints, picked by name from joints.action_names, in the controller's order"),
    "interface": (TRAJECTORY, "what the group's controller takes: trajectory (trajectory_msgs/JointTrajectory, "
                              "a joint_trajectory_controller) or velocity (std_msgs/Float64MultiArray, a "
                              "forward_command_controller: each tick the plan's velocity for the step that executes "
                              "now; needs an embodiment with velocities)"),
    "topic": ("", "the group's topic; empty: <group>_controller/joint_trajectory (trajectory) or "
                  "<group>_controller/commands (velocity)"),
    "scale": (None, "robot = offset + scale * model, per joint: a number for every joint or a list, one per "
                    "joint; unset: 1"),
    "offset": (None, "see scale; unset: 0"),
    "hold": ("", "what the group's controller gets when the node stops commanding it: position (one point at the "
                 "measured position, offset + scale * measured; a trajectory group's default) or empty (a trajectory "
                 "without points); zero (every velocity 0: a velocity group's only hold)"),
    "lower": (None, "position lower limit per joint in the controller's units (after scale and offset; a number "
                    "for all or a list); unset: from robot_description, else none"),
    "upper": (None, "position upper limit, as lower"),
    "max_velocity": (None, "velocity limit between plan points per joint (the controller's units/s), as lower"),
    "max_jump": (None, "largest distance from the measured position (offset + scale * measured) to the first point "
                       "that executes, per joint, in the controller's units; unset: none"),
}


def group_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """Each group's parameters that `values` leaves unset, at their defaults (a front end that reads a parameter
    file, not ROS parameters)."""
    return {f"output.{group}.{field}": None if default is REQUIRED else default
            for group in group_names(values.get("output.groups")) for field, (default, _) in GROUP_SPECS.items()
            if f"output.{group}.{field}" not in values}


LIMIT_FIELDS = ("lower", "upper", "max_velocity", "max_jump")
MAX_UNIT_FACTOR = 1e6  # the largest |scale| and |offset| of a group: beyond it, a change of units overflows
GROUP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def group_names(value) -> tuple[str, ...]:
    """The output groups `output.groups` names, checked (none when unset)."""
    if value is None:
        return ()
    names = Reader({"output.groups": value}).names("output.groups")
    reserved = {spec.name.removeprefix("output.") for spec in OUTPUT_SPECS}  # output.* parameters
    bad = [n for n in names if not GROUP_NAME.fullmatch(n) or n in reserved]
    if bad:
        raise ParameterError(f"output.groups: {bad} cannot name a group (a letter, then letters, digits or _; not "
                             f"an output.* parameter)")
    return names


def read_groups(values: dict[str, Any], action_names: tuple[str, ...]) -> tuple[JointGroup, ...]:
    """The output groups, checked: every joint known and in one group only, topics distinct, finite non-zero
    scales."""
    p = Reader(values)
    groups, owner, topics = [], {}, {}
    for name in group_names(values["output.groups"]):
        key = f"output.{name}"
        joints = p.names(f"{key}.joints")
        unknown = [j for j in joints if j not in action_names]
        if unknown:
            raise ParameterError(f"{key}.joints: {unknown} are not in joints.action_names {list(action_names)}")
        shared = [f"{j} (also in {owner[j]})" for j in joints if j in owner]
        if shared:
            raise ParameterError(f"{key}.joints: {', '.join(shared)}: a joint belongs to one group only")
        owner.update(dict.fromkeys(joints, name))
        interface = p.choice(f"{key}.interface", INTERFACES)
        default_topic = "joint_trajectory" if interface == TRAJECTORY else "commands"
        topic = p.text(f"{key}.topic") or f"{name}_controller/{default_topic}"
        if topic in topics:
            raise ParameterError(f"{key}.topic {topic!r} is also group {topics[topic]}'s: one topic per group")
        topics[topic] = name
        scale = p.per_joint(f"{key}.scale", len(joints), 1.0)
        if 0.0 in scale:
            raise ParameterError(f"{key}.scale must not be 0 (a joint that never moves), got {list(scale)}")
        offset = p.per_joint(f"{key}.offset", len(joints), 0.0)
        for field, numbers in (("scale", scale), ("offset", offset)):
            if max(abs(v) for v in numbers) > MAX_UNIT_FACTOR:
                raise ParameterError(f"{key}.{field} must be within +-{MAX_UNIT_FACTOR:g} (a change of units), got "
                                     f"{list(numbers)}")
        groups.append(JointGroup(name, topic, joints, tuple(action_names.index(j) for j in joints), scale, offset,
                                 interface))
    return tuple(groups)


def read_limits(values: dict[str, Any], groups: tuple[JointGroup, ...],
                state_names: tuple[str, ...]) -> tuple[tuple[str, ...], JointLimits | None]:
    """Each group's hold and its joints' limits (parameters first, then `robot_description`), as one JointLimits
    over every group's joints in group order; None when no joint has a limit. The measured position a position
    hold or a jump limit needs is the joint state's, so such joints must be in joints.state_names."""
    p = Reader(values)
    description = p.text("robot_description")
    joints = tuple(j for g in groups for j in g.joints)
    try:
        from_urdf = urdf_limits(description, joints) if description and joints else {}
    except ValueError as err:
        raise ParameterError(str(err)) from None
    holds, columns = [], {field: [] for field in LIMIT_FIELDS}
    for group in groups:
        key = f"output.{group.name}"
        modes = HOLD_MODES[group.interface]
        holds.append(p.text(f"{key}.hold") or modes[0])
        if holds[-1] not in modes:
            raise ParameterError(f"{key}.hold must be one of {' | '.join(modes)} for a {group.interface} group, got "
                                 f"{holds[-1]!r}")
        urdf = [from_urdf.get(j) for j in group.joints]
        defaults = {"lower": [u.lower if u else -math.inf for u in urdf],
                    "upper": [u.upper if u else math.inf for u in urdf],
                    "max_velocity": [u.velocity if u else math.inf for u in urdf],
                    "max_jump": [math.inf] * len(group.joints)}
        for field in LIMIT_FIELDS:
            given = p.per_joint(f"{key}.{field}", len(group.joints), math.nan, finite=False)
            columns[field] += [d if math.isnan(v) else v for v, d in zip(given, defaults[field], strict=True)]
        needs_state = holds[-1] == HOLD_POSITION or np.isfinite(columns["max_jump"][-len(group.joints):]).any()
        unmeasured = [j for j in group.joints if j not in state_names]
        if needs_state and unmeasured:
            raise ParameterError(f"{key}.joints: {unmeasured} are not in joints.state_names, but a position hold "
                                 f"and max_jump need each joint's measured position (or set {key}.hold: empty)")
    try:
        limits = JointLimits(joints, *(np.array(columns[f], dtype=np.float64) for f in LIMIT_FIELDS))
    except ValueError as err:
        raise ParameterError(f"output.*.{{{', '.join(LIMIT_FIELDS)}}}: {err}") from None
    return tuple(holds), limits if limits.any else None


def check_velocity_groups(groups: Sequence[JointGroup], embodiment: Embodiment) -> None:
    """ParameterError if a group commands velocities and the profile makes positions only."""
    velocity = [g.name for g in groups if g.interface == VELOCITY]
    if velocity and not embodiment.has_velocity:
        raise ParameterError(f"output.{velocity[0]}.interface velocity needs velocities, and embodiment "
                             f"{embodiment.name} makes positions only (a velocity profile such as droid has them)")


def command_path(values: dict[str, Any], joint_names: tuple[str, ...], embodiment: Embodiment, time_step_s: float
                 ) -> CommandPath:
    """A robot's command path from the output parameters, its joints (its state and its action joints alike) and
    its profile; ParameterError if they do not fit."""
    groups = read_groups(values, joint_names)
    check_velocity_groups(groups, embodiment)
    holds, limits = read_limits(values, groups, joint_names)
    p = Reader(values)
    return CommandPath(groups, holds, limits, p.choice("limits.policy", LIMIT_POLICIES), joint_names, joint_names,
                       time_step_s, embodiment.has_velocity, p.choice("output.handover", HANDOVERS),
                       p.number("output.temporal_ensemble_m"), p.integer("output.rtc_overlap"))


def read_rtc(p: Reader) -> RtcSettings:
    """The `output.rtc_*` parameters of real-time chunking (`output.handover: rtc_guided`)."""
    return RtcSettings(p.integer("output.rtc_execution_horizon"), p.choice("output.rtc_schedule", tuple(Schedule)),
                       p.number("output.rtc_max_guidance_weight", positive=True),
                       p.choice("output.rtc_method", (GUIDANCE, PREFIX)))
