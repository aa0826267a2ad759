"""The measured joint state in the robot's own names and units -> the state the node works in (the profile's).

A ros2_control `joint_state_broadcaster` publishes each joint under its URDF name and in its hardware unit; the
embodiment profile, the holds and `max_jump` expect `joints.state_names` in the command's units (`docs/safety.md`).
Two optional maps close the gap, applied to every joint state as it arrives:

- `rename`: `topic_name=state_name`, the name a joint has on `joint_states` for a name of `joints.state_names`;
- `convert`: `state_name=conversion`, the measured value -> the state's unit, each a linear map
  `state = offset + scale * measured` that must be invertible (scale finite and not 0):
  - `aloha_gripper`: an ALOHA puppet gripper joint in rad -> ALOHA's normalized gripper position (0 closed ..
    1 open), `(x - PUPPET_GRIPPER_JOINT_CLOSE) / (PUPPET_GRIPPER_JOINT_OPEN - PUPPET_GRIPPER_JOINT_CLOSE)` with
    -0.6213 / 1.4910 rad. ALOHA turns the joint into the finger position linearly (`PUPPET_JOINT2POS`), so this is
    also the normalized finger position the `aloha` profile's state expects (openpi `examples/aloha_real/
    constants.py` lines 20-21, 28-30, 42-44, 67-69 at 15a9616);
  - `range:LOW:HIGH`: `(x - LOW) / (HIGH - LOW)`;
  - `linear:OFFSET:SCALE`: `OFFSET + SCALE * x`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALOHA_GRIPPER_JOINT = (-0.6213, 1.4910)  # PUPPET_GRIPPER_JOINT_CLOSE, PUPPET_GRIPPER_JOINT_OPEN (rad)
CONVERSIONS = ("aloha_gripper", "range:LOW:HIGH", "linear:OFFSET:SCALE")


class StateUnitsError(ValueError):
    """A rename or conversion that cannot be used; one line naming the entry."""


@dataclass(frozen=True)
class StateUnits:
    """Per joint of `joints.state_names`: its name on `joint_states` and `state = offset + scale * measured`."""

    topic_names: tuple[str, ...]
    offset: tuple[float, ...]
    scale: tuple[float, ...]

    def to_state(self, measured: np.ndarray) -> np.ndarray:
        """Measured values (`topic_names` order) -> the state in the command's units."""
        return np.asarray(self.offset) + np.asarray(self.scale) * np.asarray(measured, dtype=np.float64)

    def to_measured(self, state: np.ndarray) -> np.ndarray:
        """The inverse: the state -> the measured units."""
        return (np.asarray(state, dtype=np.float64) - np.asarray(self.offset)) / np.asarray(self.scale)


def identity(state_names: Sequence[str]) -> StateUnits:
    return StateUnits(tuple(state_names), (0.0,) * len(state_names), (1.0,) * len(state_names))


def read_state_units(state_names: Sequence[str], rename: Sequence[str] | None,
                     convert: Sequence[str] | None) -> StateUnits:
    """The maps from `name=value` entries (`rename`: topic name = state name; `convert`: state name = conversion);
    StateUnitsError for an unknown name, a name given twice or a conversion that is not invertible."""
    state_names = tuple(state_names)
    topic = list(state_names)
    for entry, (source, target) in _pairs(rename, "joints.state_rename"):
        if target not in state_names:
            raise StateUnitsError(f"joints.state_rename {entry!r}: {target!r} is not in joints.state_names")
        topic[state_names.index(target)] = source
    if len(set(topic)) != len(topic):
        twice = sorted({n for n in topic if topic.count(n) > 1})
        raise StateUnitsError(f"joints.state_rename: {twice} would be read for two state joints")
    offset, scale = [0.0] * len(state_names), [1.0] * len(state_names)
    for entry, (name, spec) in _pairs(convert, "joints.state_convert"):
        if name not in state_names:
            raise StateUnitsError(f"joints.state_convert {entry!r}: {name!r} is not in joints.state_names")
        index = state_names.index(name)
        offset[index], scale[index] = _conversion(entry, spec)
    return StateUnits(tuple(topic), tuple(offset), tuple(scale))


def _pairs(entries: Sequence[str] | None, parameter: str) -> list[tuple[str, tuple[str, str]]]:
    pairs, seen = [], set()
    for entry in entries or ():
        left, sep, right = (part.strip() for part in str(entry).partition("="))
        if not sep or not left or not right:
            raise StateUnitsError(f"{parameter} {entry!r}: expected name=value")
        if left in seen:
            raise StateUnitsError(f"{parameter}: {left!r} is given twice")
        seen.add(left)
        pairs.append((entry, (left, right)))
    return pairs


def _conversion(entry: str, spec: str) -> tuple[float, float]:
    kind, *args = spec.split(":")
    try:
        numbers = [float(a) for a in args]
    except ValueError:
        numbers = None
    if kind == "aloha_gripper" and not args:
        low, high = ALOHA_GRIPPER_JOINT
        kind, numbers = "range", [low, high]
    if kind not in ("range", "linear") or numbers is None or len(numbers) != 2:
        raise StateUnitsError(f"joints.state_convert {entry!r}: expected one of {' | '.join(CONVERSIONS)}")
    if kind == "range":
        low, high = numbers
        offset, scale = (-low / (high - low), 1.0 / (high - low)) if high != low else (math.nan, math.inf)
    else:
        offset, scale = numbers
    if not (math.isfinite(offset) and math.isfinite(scale) and scale != 0.0):
        raise StateUnitsError(f"joints.state_convert {entry!r} is not invertible (state = {offset:g} + {scale:g} x "
                              f"measured): the measured value could not be recovered for a hold")
    return offset, scale
