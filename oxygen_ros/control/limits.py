"""Joint limits on the commands a node sends: position range, velocity, and the jump from the measured state.

They act on the last form of a plan before it is published: every output group's joints in the controller's
units (after the embodiment's transform from the model's action space and the group's offset + scale), so the
numbers are the controller's own (a URDF's `<limit>`, a datasheet). The measured positions they are compared with
are in the same units (the joint state mapped through the group's offset + scale, `JointGroup.measured_to_robot`).
Per joint:

- position range `lower .. upper`: `clamp` moves every point into it, `reject` refuses the plan;
- `max_velocity` between consecutive points: `clamp` slows the whole plan by stretching its time grid (every
  point's time from the start times one factor, so the path is kept and the joints stay in step), `reject`
  refuses it;
- `max_jump` between the measured position and the first point that will execute (the first not yet past when
  the plan goes out): refused under both policies, since no stretching makes a controller's first segment from a
  far-away state safe.

A refused plan names its joints; what the node does then (publish nothing, hold) is the caller's. Unlimited is
infinity (lower -inf, upper +inf), so a robot may limit some joints and not others; a range that admits no finite
position (lower +inf, upper -inf) is refused, as is a lower limit above the upper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CLAMP = "clamp"
REJECT = "reject"
POLICIES = (CLAMP, REJECT)
_SLACK = 1e-9  # relative: a step exactly at the velocity limit passes despite rounding


@dataclass(frozen=True)
class JointLimits:
    """Limits of `joints`, each array one value per joint; +-inf where a joint has no such limit."""

    joints: tuple[str, ...]
    lower: np.ndarray
    upper: np.ndarray
    max_velocity: np.ndarray  # the controller's units per second, > 0
    max_jump: np.ndarray  # the controller's units, > 0

    def __post_init__(self):
        for name in ("lower", "upper", "max_velocity", "max_jump"):
            values = np.asarray(getattr(self, name), dtype=np.float64)
            if values.shape != (len(self.joints),):
                raise ValueError(f"{name} has {values.size} values for {len(self.joints)} joints")
            bad = [j for j, v in zip(self.joints, values, strict=True) if math.isnan(v)]
            if bad:
                raise ValueError(f"{name} is NaN for {bad}")
            object.__setattr__(self, name, values)
        # unlimited is lower -inf / upper +inf; a lower bound of +inf or an upper of -inf admits no position at all
        empty = [f"{j} ({lo:g} .. {hi:g})" for j, lo, hi in zip(self.joints, self.lower, self.upper, strict=True)
                 if lo == math.inf or hi == -math.inf]
        if empty:
            raise ValueError(f"position range admits no finite position for {', '.join(empty)}")
        crossed = [f"{j} ({lo:g} > {hi:g})" for j, lo, hi in zip(self.joints, self.lower, self.upper, strict=True)
                   if lo > hi]
        if crossed:
            raise ValueError(f"lower limit above upper for {', '.join(crossed)}")
        for name in ("max_velocity", "max_jump"):
            nonpositive = [j for j, v in zip(self.joints, getattr(self, name), strict=True) if v <= 0]
            if nonpositive:
                raise ValueError(f"{name} must be > 0, not for {nonpositive}")

    @property
    def any(self) -> bool:
        """Whether any joint has any limit."""
        return bool(np.isfinite(np.concatenate([self.lower, self.upper, self.max_velocity, self.max_jump])).any())


@dataclass(frozen=True)
class Limited:
    """A plan within the limits: its values, the factor its time grid is stretched by (1: as planned), and the
    joints whose positions were moved into range."""

    values: np.ndarray
    time_scale: float
    clamped: tuple[str, ...]


@dataclass(frozen=True)
class Rejected:
    """A plan refused: which limit (`range`, `velocity`, `jump`), the joints past it, and why in words."""

    limit: str
    joints: tuple[str, ...]
    detail: str


def first_ahead(first_ns: int, step_ns: int, now_ns: int, count: int) -> int:
    """Index of a plan's first point not yet past at `now_ns` (point i at `first_ns + i * step_ns`); the last point
    when all have passed (a controller still moves toward it)."""
    if now_ns <= first_ns:
        return 0
    return min(count - 1, -((first_ns - now_ns) // step_ns))


def apply_limits(values: np.ndarray, limits: JointLimits, measured: np.ndarray, step_s: float, first: int,
                 policy: str) -> Limited | Rejected:
    """`values` [n, joints] (a plan, point i at i steps of `step_s`) within `limits` under `policy`; `measured`
    [joints]: the joints' measured positions, in the plan's units; `first`: the index of the first point that will execute."""
    if policy not in POLICIES:
        raise ValueError(f"unknown limit policy {policy!r}; choose from {' | '.join(POLICIES)}")
    values = np.asarray(values, dtype=np.float64)
    names = limits.joints
    outside = (values < limits.lower) | (values > limits.upper)
    clamped: tuple[str, ...] = ()
    if outside.any():
        joints = _named(names, outside.any(axis=0))
        if policy == REJECT:
            worst = [f"{j} {_range_excess(values[:, i], limits.lower[i], limits.upper[i])}"
                     for i, j in enumerate(names) if outside[:, i].any()]
            return Rejected("range", joints, "outside the position range: " + ", ".join(worst))
        values = np.clip(values, limits.lower, limits.upper)
        clamped = joints
    scale = 1.0
    if len(values) > 1:
        speeds = np.abs(np.diff(values, axis=0)).max(axis=0) / step_s  # per joint, the fastest step
        ratios = speeds / limits.max_velocity
        over = ratios > 1.0 + _SLACK
        if over.any():
            if policy == REJECT:
                detail = ", ".join(f"{j} {speeds[i]:.4g}/s over {limits.max_velocity[i]:g}/s"
                                   for i, j in enumerate(names) if over[i])
                return Rejected("velocity", _named(names, over), "faster than the velocity limit: " + detail)
            scale = float(ratios.max())
    jump = np.abs(values[first] - measured)
    far = jump > limits.max_jump
    if far.any():
        detail = ", ".join(f"{j} {jump[i]:.4g} from the measured {measured[i]:.4g} (max_jump {limits.max_jump[i]:g})"
                           for i, j in enumerate(names) if far[i])
        return Rejected("jump", _named(names, far), "first point to execute too far from the measured state: "
                        + detail)
    return Limited(values, scale, clamped)


def _named(names: tuple[str, ...], mask: np.ndarray) -> tuple[str, ...]:
    return tuple(n for n, m in zip(names, mask, strict=True) if m)


def _range_excess(column: np.ndarray, lower: float, upper: float) -> str:
    low, high = float(column.min()), float(column.max())
    return f"{low:.4g} below {lower:g}" if low < lower else f"{high:.4g} above {upper:g}"


@dataclass(frozen=True)
class UrdfLimit:
    lower: float  # -inf for a continuous joint
    upper: float
    velocity: float


def urdf_limits(xml: str, joints: tuple[str, ...]) -> dict[str, UrdfLimit]:
    """Each of `joints`' `<limit>` from a URDF document (the `robot_description` text); raises ValueError naming
    what is wrong: a document that does not parse, a joint it lacks, a joint that cannot move (fixed) or that
    carries no limit (revolute and prismatic joints must), a velocity limit that is not > 0."""
    from urdf_parser_py import urdf
    from urdf_parser_py.xml_reflection import core

    unknown: list[str] = []  # the parser reports tags it does not know (ros2_control, gazebo) on stderr otherwise
    report, core.on_error = core.on_error, unknown.append
    try:
        robot = urdf.URDF.from_xml_string(xml)
    except Exception as err:  # lxml's syntax errors, the parser's ParseError, ValueError on bad numbers
        raise ValueError(f"robot_description is not a URDF that parses: {type(err).__name__}: "
                         f"{str(err).strip()}") from None
    finally:
        core.on_error = report
    found = {joint.name: joint for joint in robot.joints}
    missing = [j for j in joints if j not in found]
    if missing:
        raise ValueError(f"robot_description (robot {robot.name!r}) has no joints {missing}")
    limits = {}
    for name in joints:
        joint = found[name]
        if joint.type not in ("revolute", "prismatic", "continuous"):
            raise ValueError(f"robot_description: joint {name} is {joint.type}, not a joint a controller moves")
        if joint.limit is None:
            if joint.type != "continuous":
                raise ValueError(f"robot_description: {joint.type} joint {name} has no <limit>")
            limits[name] = UrdfLimit(-math.inf, math.inf, math.inf)
            continue
        velocity = float(joint.limit.velocity) if joint.limit.velocity is not None else math.nan
        if not velocity > 0:
            raise ValueError(f"robot_description: joint {name} has velocity limit {joint.limit.velocity}, not > 0")
        if joint.type == "continuous":
            limits[name] = UrdfLimit(-math.inf, math.inf, velocity)
        else:
            lower, upper = float(joint.limit.lower or 0.0), float(joint.limit.upper or 0.0)
            if not (math.isfinite(lower) and math.isfinite(upper) and lower <= upper):
                raise ValueError(f"robot_description: {joint.type} joint {name} has limits {lower:g} .. {upper:g}, "
                                 "not a finite range")
            limits[name] = UrdfLimit(lower, upper, velocity)
    return limits
