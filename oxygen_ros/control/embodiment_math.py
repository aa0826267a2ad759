"""The math of an embodiment profile (docs/embodiments.md): unit conversions of one dim, the signs and conversions
of one side, the chunk in the robot's space, the keys openpi's policy reads, how a velocity dim becomes a step.

`embodiment.py` applies these per profile; `embodiment_yaml.py` reads a profile's YAML into them. Nothing here reads
a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

POSITION, DELTA, VELOCITY, GRIPPER = "position", "delta", "velocity", "gripper"
KINDS = (POSITION, DELTA, VELOCITY, GRIPPER)
RELATIVE_KINDS = (DELTA, VELOCITY)  # read the frame's state
# Action spaces a joint trajectory cannot carry, and why (a profile naming one is refused with that reason).
REFUSED_KINDS = {
    "end_effector": "end-effector actions (a pose change of the gripper, as LIBERO's) cannot be expressed as a "
                    "joint trajectory without the robot's inverse kinematics",
}


class EmbodimentError(ValueError):
    """A profile that cannot be loaded or does not fit the robot or the checkpoint; the message says why."""


# ---- unit conversions: one dim's values between the robot's units and the model's --------------------------------

@dataclass(frozen=True)
class Linear:
    """robot = offset + scale * model."""

    scale: float
    offset: float

    def to_robot(self, model: np.ndarray) -> np.ndarray:
        return self.offset + self.scale * model

    def to_model(self, robot: np.ndarray) -> np.ndarray:
        return (robot - self.offset) / self.scale


@dataclass(frozen=True)
class Range:
    """robot = (model + add - low) / (high - low): the model's value shifted by `add`, normalized over
    [low, high] (openpi's ALOHA gripper out: pi's angle + 0.5476 normalized over the puppet gripper joint's range)."""

    add: float
    low: float
    high: float

    def to_robot(self, model: np.ndarray) -> np.ndarray:
        return (model + self.add - self.low) / (self.high - self.low)

    def to_model(self, robot: np.ndarray) -> np.ndarray:
        return robot * (self.high - self.low) + self.low - self.add


@dataclass(frozen=True)
class Linkage:
    """A gripper's normalized linear finger position (robot) <-> its normalized horn angle (model), through the
    horn-and-arm linkage of an Interbotix gripper (openpi's ALOHA gripper in):

        x = closed + robot * (open - closed)                          finger position, m
        angle = asin((horn^2 + x^2 - arm^2) / (2 horn x))             clipped to [-1, 1] inside the asin
        model = (angle - low) / (high - low)

    and back: x = horn sin(angle) + sqrt(horn^2 sin(angle)^2 + arm^2 - horn^2), the positive root (arm > horn)."""

    closed: float
    open: float
    arm_length: float
    horn_radius: float
    low: float
    high: float

    def to_model(self, robot: np.ndarray) -> np.ndarray:
        x = self.closed + robot * (self.open - self.closed)
        h, a = self.horn_radius, self.arm_length
        angle = np.arcsin(np.clip((h * h + x * x - a * a) / (2.0 * h * x), -1.0, 1.0))
        return (angle - self.low) / (self.high - self.low)

    def to_robot(self, model: np.ndarray) -> np.ndarray:
        sine = np.sin(self.low + model * (self.high - self.low))
        h, a = self.horn_radius, self.arm_length
        x = h * sine + np.sqrt(h * h * sine * sine + a * a - h * h)
        return (x - self.closed) / (self.open - self.closed)


Conversion = Linear | Range | Linkage
CONVERSIONS = {"linear": (Linear, ("scale", "offset")), "range": (Range, ("add", "low", "high")),
                "linkage": (Linkage, ("closed", "open", "arm_length", "horn_radius", "low", "high"))}


# ---- the profile --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DimMap:
    """Signs and unit conversions of one side (state in, or actions out), per model dim."""

    sign: tuple[float, ...]  # +1 or -1 per model dim
    convert: dict[int, Conversion] = field(default_factory=dict)

    @property
    def flips(self) -> bool:
        return -1.0 in self.sign

    def to_model_state(self, robot: np.ndarray) -> np.ndarray:
        """State: sign first, then the conversion (openpi's `_decode_state`)."""
        out = robot * np.asarray(self.sign)
        for dim, conversion in self.convert.items():
            out[..., dim] = conversion.to_model(out[..., dim])
        return out

    def to_robot_action(self, model: np.ndarray) -> np.ndarray:
        """Actions: sign first, then the conversion (openpi's `_encode_actions`)."""
        out = model * np.asarray(self.sign)
        for dim, conversion in self.convert.items():
            out[..., dim] = conversion.to_robot(out[..., dim])
        return out

    def to_model_action(self, robot: np.ndarray) -> np.ndarray:
        """The inverse of `to_robot_action` (openpi's `_encode_actions_inv`)."""
        out = np.array(robot, dtype=np.float64, copy=True)
        for dim, conversion in self.convert.items():
            out[..., dim] = conversion.to_model(out[..., dim])
        return out * np.asarray(self.sign)


@dataclass(frozen=True)
class RobotChunk:
    """A chunk in the robot's absolute space: positions [..., H, A]; velocities of the same shape when the profile
    has velocity dims (theirs from the model, the other dims' by finite differences on the time grid), else None."""

    positions: np.ndarray
    velocities: np.ndarray | None

    def stacked(self) -> np.ndarray:
        """[..., H, A] positions, or [..., H, 2A] positions then velocities: one array a hand-over blends whole."""
        if self.velocities is None:
            return self.positions
        return np.concatenate([self.positions, self.velocities], axis=-1)


IMAGE_LAYOUTS = ("hwc", "chw")


@dataclass(frozen=True)
class OpenpiKeys:
    """The observation keys openpi's policy for this robot reads, as its input transform reads them: the state as
    keys concatenated in order (key, width; width None: any, for a profile of any width), each image key's model
    image key, the image keys whose absence the policy masks instead of refusing, how the policy lays out image
    arrays (`hwc`: height, width, channel, or channel first when the first dim is 3, openpi's `_parse_image`;
    `chw`: always channel first, openpi's ALOHA), and the metadata its server sends on connect."""

    state: tuple[tuple[str, int | None], ...]
    images: tuple[tuple[str, str], ...]
    optional_images: tuple[str, ...] = ()
    image_layout: str = "hwc"
    metadata: dict = field(default_factory=dict, compare=False, hash=False)


def differences(positions: np.ndarray, time_step: float) -> np.ndarray:
    """Velocities of positions [..., H, A] on a grid of `time_step` (central inside, one-sided at the ends)."""
    if positions.shape[-2] < 2:
        return np.zeros_like(positions)
    return np.gradient(positions, time_step, axis=-2)



@dataclass(frozen=True)
class VelocityScale:
    """What a velocity dim's number moves the joint by in one control step (DROID's `joint_velocity_to_delta`):
    step = `step` x v, the whole vector of velocity dims divided by max |v| / `limit` first when that exceeds 1.
    Without a profile's `velocity` section the numbers are in robot units per second: step = time step x v."""

    step: float
    limit: float | None = None

    def steps(self, velocity: np.ndarray) -> np.ndarray:
        """Velocity dims [..., H, V] -> the joint change of each step [..., H, V], each point's vector scaled as
        a whole."""
        if self.limit is not None and velocity.shape[-1]:
            ratio = np.max(np.abs(velocity), axis=-1, keepdims=True) / self.limit
            velocity = velocity / np.maximum(ratio, 1.0)
        return self.step * velocity


@dataclass(frozen=True)
class ActionFilter:
    """What openpi's DROID example does to a returned chunk before the robot takes it, optional per profile: every
    dim clipped to [low, high], and the gripper dims binarized (1 above the threshold, else 0)."""

    clip: tuple[float, float] | None = None
    binarize: float | None = None

    def apply(self, actions: np.ndarray, gripper: list[int]) -> np.ndarray:
        out = actions.copy()
        if self.binarize is not None and gripper:
            out[..., gripper] = (out[..., gripper] > self.binarize).astype(out.dtype)
        if self.clip is not None:
            out = np.clip(out, *self.clip)
        return out
