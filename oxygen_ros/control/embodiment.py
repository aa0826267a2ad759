"""Embodiment profiles: what a checkpoint's state and action dims mean on one robot, applied both ways.

A pi0.5 checkpoint acts in the action space it was trained in, which is not always absolute joint positions:
openpi's `pi05_droid` emits joint velocities, openpi's ALOHA checkpoints joint deltas from the state of the frame
the model saw, in pi's own sign convention and gripper units. A profile (YAML, shipped ones in `embodiments/`,
facts and sources in docs/embodiments.md) says per dim what the model's numbers are, and this module is the one
place that applies it:

- robot -> model state (`state_to_model`): the robot state's dims picked in the model's order, signs flipped, units
  converted (the node then normalizes and pads it to the model's width);
- model -> robot command (`actions_to_robot`): per action dim, `position` and `gripper` are absolute, `delta` is
  added to the state of the frame the model saw, `velocity` is integrated from that state on the chunk's time
  grid (point i at (i + 1) time steps, each velocity held for one step), then signs and units; the result is
  absolute positions in the robot's units, plus the velocities when the profile has velocity dims;
- robot -> model actions (`actions_to_model`): the exact inverse, for training on recorded absolute actions;
- model -> what openpi's policy server returns for this robot (`openpi_actions`): the same command with velocity
  dims left as velocities (openpi integrates nothing; the robot's own controller does), for the openpi-protocol
  front end (`oxygen_ros/serving`), which also reads the observation keys of `openpi_keys`.

The order of the steps is openpi's (`AbsoluteActions` before the robot's output transform, `DeltaActions` after
its input transform): deltas are taken and added in the model's space, signs and unit conversions sit between that
space and the robot's. A profile without a `state` or `action` section is the identity on any width (`absolute`,
LeRobot's fine-tunes). `mismatch` compares a profile with what a checkpoint says it was trained on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

SHIPPED_DIR = Path(__file__).resolve().parent / "embodiments"
POSITION, DELTA, VELOCITY, GRIPPER = "position", "delta", "velocity", "gripper"
KINDS = (POSITION, DELTA, VELOCITY, GRIPPER)
RELATIVE_KINDS = (DELTA, VELOCITY)  # read the frame's state
# Action spaces a joint trajectory cannot carry, and why (a profile naming one is refused with that reason).
REFUSED_KINDS = {
    "end_effector": "end-effector actions (a pose change of the gripper, as LIBERO's) cannot be expressed as a "
                    "joint trajectory without the robot's inverse kinematics",
}
_TOP_KEYS = ("name", "about", "rate_hz", "horizon", "openpi_asset_ids", "state", "action", "conversions",
             "openpi_keys")
_STATE_KEYS = ("dims", "pick", "sign", "convert")
_ACTION_KEYS = ("dims", "kinds", "sign", "convert")


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
_CONVERSIONS = {"linear": (Linear, ("scale", "offset")), "range": (Range, ("add", "low", "high")),
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


@dataclass(frozen=True)
class Embodiment:
    name: str
    source: str  # the file it was read from
    rate_hz: float | None = None  # the checkpoint's control rate (its time step = 1 / rate_hz)
    horizon: int | None = None  # the checkpoint's action horizon
    openpi_asset_ids: tuple[str, ...] = ()  # openpi norm-stats folders (assets/<id>) that mean this profile
    state_dims: int | None = None  # robot state width; None: any (identity)
    state_pick: tuple[int, ...] | None = None  # robot state index of each model state dim; None: all, in order
    state_map: DimMap | None = None
    kinds: tuple[str, ...] | None = None  # per action dim; None: every dim `position`, any width
    action_map: DimMap | None = None
    openpi_keys: OpenpiKeys | None = None

    @property
    def time_step(self) -> float | None:
        return None if self.rate_hz is None else 1.0 / self.rate_hz

    @property
    def has_velocity(self) -> bool:
        return self.kinds is not None and VELOCITY in self.kinds

    def model_state_dims(self, robot_dims: int) -> int:
        return len(self.state_pick) if self.state_pick is not None else robot_dims

    def check_joints(self, state_names: tuple[str, ...], action_names: tuple[str, ...]) -> None:
        """Raise EmbodimentError unless the robot's state and action joints have the profile's widths and every
        delta or velocity dim has a state dim to start from."""
        if self.state_dims is not None and len(state_names) != self.state_dims:
            raise EmbodimentError(f"embodiment {self.name} reads {self.state_dims} state dims, joints.state_names "
                                  f"has {len(state_names)}")
        if self.kinds is not None and len(action_names) != len(self.kinds):
            raise EmbodimentError(f"embodiment {self.name} has {len(self.kinds)} action dims, joints.action_names "
                                  f"has {len(action_names)}")
        state = self.model_state_dims(len(state_names))
        relative = [d for d, kind in enumerate(self.kinds or ()) if kind in RELATIVE_KINDS and d >= state]
        if relative:
            raise EmbodimentError(f"embodiment {self.name}: action dims {relative} are relative to the state, which "
                                  f"has only {state} model dims")

    def state_to_model(self, state: np.ndarray) -> np.ndarray:
        """Robot state [..., S] (robot units, joints.state_names order) -> the model's unnormalized state."""
        state = np.asarray(state, dtype=np.float64)
        if self.state_pick is not None:
            state = state[..., list(self.state_pick)]
        return state.copy() if self.state_map is None else self.state_map.to_model_state(state)

    def actions_to_robot(self, actions: np.ndarray, state: np.ndarray) -> RobotChunk:
        """Unnormalized model actions [..., H, >= A] and the robot state [..., S] of the frame the model saw ->
        the robot's absolute command [..., H, A] (A: the profile's action dims, else the actions' own width)."""
        actions = np.asarray(actions, dtype=np.float64)
        width = len(self.kinds) if self.kinds is not None else actions.shape[-1]
        model = actions[..., :width].copy()
        if self.kinds is None:
            return RobotChunk(model, None)
        frame = self.state_to_model(state)[..., None, :]  # [..., 1, S]: the same for every point
        for dim, kind in enumerate(self.kinds):
            if kind == DELTA:
                model[..., dim] += frame[..., dim]
            elif kind == VELOCITY:
                model[..., dim] = frame[..., dim] + self.time_step * np.cumsum(actions[..., dim], axis=-1)
        positions = model if self.action_map is None else self.action_map.to_robot_action(model)
        if not self.has_velocity:
            return RobotChunk(positions, None)
        velocities = _differences(positions, self.time_step)
        for dim, kind in enumerate(self.kinds):
            if kind == VELOCITY:
                sign = 1.0 if self.action_map is None else self.action_map.sign[dim]
                velocities[..., dim] = sign * actions[..., dim]
        return RobotChunk(positions, velocities)

    def openpi_actions(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Unnormalized model actions [..., H, >= A] and the robot state [..., S] of the frame the model saw -> what
        openpi's policy returns for this robot [..., H, A]: `actions_to_robot`'s command, except that velocity
        dims stay the model's velocities (signed), as openpi's output transforms leave them (DROID's
        `DroidOutputs` cuts the width and converts nothing)."""
        chunk = self.actions_to_robot(actions, state)
        if not self.has_velocity:
            return chunk.positions
        velocity = [dim for dim, kind in enumerate(self.kinds) if kind == VELOCITY]
        out = chunk.positions.copy()
        out[..., velocity] = chunk.velocities[..., velocity]
        return out

    def actions_to_model(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Recorded absolute robot actions [..., H, A] from the frame whose robot state is [..., S] -> the model's
        unnormalized actions [..., H, A] (what training fits): the inverse of `actions_to_robot`'s positions."""
        actions = np.asarray(actions, dtype=np.float64)
        if self.kinds is None:
            return actions.copy()
        model = actions.copy() if self.action_map is None else self.action_map.to_model_action(actions)
        frame = self.state_to_model(state)[..., None, :]
        out = model.copy()
        for dim, kind in enumerate(self.kinds):
            if kind == DELTA:
                out[..., dim] -= frame[..., dim]
            elif kind == VELOCITY:
                previous = np.concatenate([frame[..., dim], model[..., :-1, dim]], axis=-1)
                out[..., dim] = (model[..., dim] - previous) / self.time_step
        return out

    def mismatch(self, trained_on, action_names: tuple[str, ...]) -> str | None:
        """Why this profile does not fit what a checkpoint says it was trained on (`model.checkpoint.TrainedOn`),
        or None when it fits or the checkpoint says nothing."""
        if trained_on is None:
            return None
        if trained_on.embodiment is not None:
            if trained_on.embodiment != self.name:
                return f"the checkpoint was trained in embodiment {trained_on.embodiment}"
            return None
        asset = trained_on.openpi_asset_id
        if asset is not None:
            if "libero" in asset.lower():
                return (f"the checkpoint's norm stats are LIBERO's (assets/{asset}): {REFUSED_KINDS['end_effector']}; "
                        "no profile can drive it")
            owner = next((p for p in shipped_embodiments() if asset in p.openpi_asset_ids), None)
            if owner is not None and owner.name != self.name and asset not in self.openpi_asset_ids:
                return f"its openpi norm stats are assets/{asset}, which embodiment {owner.name} is for"
            return None
        if trained_on.lerobot_relative is None:
            return None
        return self._lerobot_mismatch(trained_on, action_names)

    def _lerobot_mismatch(self, trained_on, action_names: tuple[str, ...]) -> str | None:
        """LeRobot's pi05 processors know absolute actions, or relative ones (the state added back on the masked
        dims): no velocities, no sign flips, no unit conversions."""
        kinds = self.kinds or (POSITION,) * len(action_names)
        maps = [m for m in (self.state_map, self.action_map) if m is not None]
        if self.state_pick is not None or any(m.convert or m.flips for m in maps):
            return "it is a LeRobot checkpoint, whose processors apply no sign flips or unit conversions"
        if VELOCITY in kinds:
            return "it is a LeRobot checkpoint, trained on positions, not velocities"
        wanted = lerobot_relative_mask(trained_on, len(kinds))
        have = [kind == DELTA for kind in kinds]
        if have != wanted:
            what = ("relative actions on dims " + _dims(wanted)) if any(wanted) else "absolute actions"
            return (f"it is a LeRobot checkpoint trained on {what} (use_relative_actions "
                    f"{str(trained_on.lerobot_relative).lower()}), the profile has deltas on "
                    f"{_dims(have) if any(have) else 'no dim'}")
        return None


def lerobot_relative_mask(trained_on, width: int) -> list[bool]:
    """Which of `width` action dims LeRobot's relative-actions step treats as relative: none without
    `use_relative_actions`; else every dim whose feature name contains no excluded token (every dim when the
    checkpoint names no features or excludes nothing)."""
    if not trained_on.lerobot_relative:
        return [False] * width
    names = trained_on.lerobot_action_names
    tokens = [t.lower() for t in trained_on.lerobot_exclude if t]
    if names is None or not tokens:
        return [True] * width
    mask = [not any(t in str(n).lower() for t in tokens) for n in names[:width]]
    return mask + [True] * (width - len(mask))


def _dims(mask: list[bool]) -> str:
    return "[" + ", ".join(str(d) for d, on in enumerate(mask) if on) + "]"


def _differences(positions: np.ndarray, time_step: float) -> np.ndarray:
    """Velocities of positions [..., H, A] on a grid of `time_step` (central inside, one-sided at the ends)."""
    if positions.shape[-2] < 2:
        return np.zeros_like(positions)
    return np.gradient(positions, time_step, axis=-2)


# ---- loading ------------------------------------------------------------------------------------------------------

def shipped_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml")))


def shipped_embodiments() -> tuple[Embodiment, ...]:
    return tuple(load_embodiment(name) for name in shipped_names())


def load_embodiment(spec: str) -> Embodiment:
    """A shipped profile by name (`absolute`, `aloha`, `droid`) or a YAML file by path; EmbodimentError naming
    the problem otherwise."""
    spec = spec.strip()
    path = SHIPPED_DIR / f"{spec}.yaml" if spec in shipped_names() else Path(spec).expanduser()
    if not path.is_file():
        raise EmbodimentError(f"embodiment {spec!r} is neither a shipped profile ({' | '.join(shipped_names())}) "
                              "nor a YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise EmbodimentError(f"embodiment file {path} cannot be read: {' '.join(str(err).split())}") from None
    try:
        return _parse(data, str(path))
    except EmbodimentError as err:
        raise EmbodimentError(f"embodiment file {path}: {err}") from None


def _parse(data: Any, source: str) -> Embodiment:
    table = _table(data, "the file", _TOP_KEYS)
    name = table.get("name")
    if not isinstance(name, str) or not name.strip():
        raise EmbodimentError("name must be a non-empty string")
    rate = table.get("rate_hz")
    if rate is not None and not (_number(rate) and rate > 0):
        raise EmbodimentError(f"rate_hz must be a positive number, got {rate!r}")
    horizon = table.get("horizon")
    if horizon is not None and not (isinstance(horizon, int) and not isinstance(horizon, bool) and horizon > 0):
        raise EmbodimentError(f"horizon must be a positive integer, got {horizon!r}")
    assets = table.get("openpi_asset_ids", [])
    if not isinstance(assets, list) or not all(isinstance(a, str) and a for a in assets):
        raise EmbodimentError(f"openpi_asset_ids must be a list of names, got {assets!r}")
    conversions = {key: _conversion(key, spec) for key, spec in _table(table.get("conversions", {}), "conversions",
                                                                        None).items()}
    used: set[str] = set()
    profile = dict(name=name.strip(), source=source, rate_hz=None if rate is None else float(rate), horizon=horizon,
                   openpi_asset_ids=tuple(assets))
    if "state" in table:
        state = _table(table["state"], "state", _STATE_KEYS)
        dims = _count(state, "state.dims")
        pick = state.get("pick")
        if pick is not None:
            if not isinstance(pick, list) or not pick or not all(_index(p, dims) for p in pick):
                raise EmbodimentError(f"state.pick must list robot state indices in [0, {dims}), got {pick!r}")
            pick = tuple(pick)
        width = len(pick) if pick is not None else dims
        profile.update(state_dims=dims, state_pick=pick,
                       state_map=_dim_map(state, "state", width, conversions, used))
    if "action" in table:
        action = _table(table["action"], "action", _ACTION_KEYS)
        dims = _count(action, "action.dims")
        kinds = action.get("kinds")
        if kinds is None:
            raise EmbodimentError(f"action.kinds is missing: give each of the {dims} action dims its kind "
                                  f"({' | '.join(KINDS)}); the delta and velocity dims are the mask of what is "
                                  "relative to the state")
        if not isinstance(kinds, list) or len(kinds) != dims:
            raise EmbodimentError(f"action.kinds must list one kind for each of the {dims} action dims, got {kinds!r}")
        for kind in kinds:
            if kind in REFUSED_KINDS:
                raise EmbodimentError(f"action kind {kind!r}: {REFUSED_KINDS[kind]}")
            if kind not in KINDS:
                raise EmbodimentError(f"unknown action kind {kind!r}; known: {' | '.join(KINDS)}")
        if VELOCITY in kinds and rate is None:
            raise EmbodimentError("velocity actions need rate_hz (the checkpoint's control rate) to be integrated")
        action_map = _dim_map(action, "action", dims, conversions, used)
        converted = [d for d in action_map.convert if kinds[d] == VELOCITY]
        if converted:
            raise EmbodimentError(f"action dims {converted} are velocities: a unit conversion applies to positions")
        profile.update(kinds=tuple(kinds), action_map=action_map)
    unused = sorted(set(conversions) - used)
    if unused:
        raise EmbodimentError(f"conversions {unused} are defined but no dim uses them")
    if "openpi_keys" in table:
        profile["openpi_keys"] = _openpi_keys(table["openpi_keys"], profile.get("state_dims"))
    return Embodiment(**profile)


def _table(value: Any, what: str, keys: tuple[str, ...] | None) -> dict:
    if not isinstance(value, dict):
        raise EmbodimentError(f"{what} must be a mapping, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if keys is not None and k not in keys)
    if unknown:
        raise EmbodimentError(f"{what} has unknown keys {unknown}; known: {', '.join(keys)}")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _index(value: Any, dims: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < dims


def _count(table: dict, name: str) -> int:
    dims = table.get(name.split(".")[1])
    if not (isinstance(dims, int) and not isinstance(dims, bool) and dims > 0):
        raise EmbodimentError(f"{name} must be a positive integer, got {dims!r}")
    return dims


def _dim_map(table: dict, side: str, width: int, conversions: dict, used: set[str]) -> DimMap:
    sign = table.get("sign", [1] * width)
    if not isinstance(sign, list) or len(sign) != width or not all(s in (1, -1) for s in sign):
        raise EmbodimentError(f"{side}.sign must list +1 or -1 for each of its {width} model dims, got {sign!r}")
    convert = {}
    for dim, key in _table(table.get("convert", {}), f"{side}.convert", None).items():
        if not _index(dim, width):
            raise EmbodimentError(f"{side}.convert: {dim!r} is not a model dim in [0, {width})")
        if key not in conversions:
            raise EmbodimentError(f"{side}.convert: dim {dim} names conversion {key!r}, which conversions does "
                                  f"not define (defined: {sorted(conversions)})")
        convert[dim] = conversions[key]
        used.add(key)
    return DimMap(tuple(float(s) for s in sign), convert)


def _conversion(name: str, spec: Any) -> Conversion:
    spec = _table(spec, f"conversions.{name}", None)
    kind = spec.get("type")
    if kind not in _CONVERSIONS:
        raise EmbodimentError(f"conversions.{name}: type must be one of {' | '.join(_CONVERSIONS)}, got {kind!r}")
    cls, fields = _CONVERSIONS[kind]
    extra = sorted(set(spec) - {"type", *fields})
    missing = [f for f in fields if f not in spec]
    bad = [f for f in fields if f in spec and not _number(spec[f])]
    if extra or missing or bad:
        raise EmbodimentError(f"conversions.{name} ({kind}) takes the numbers {', '.join(fields)}"
                              + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else "")
                              + (f"; not finite numbers {bad}" if bad else ""))
    conversion = cls(**{f: float(spec[f]) for f in fields})
    degenerate = {Linear: lambda c: c.scale == 0, Range: lambda c: c.high == c.low,
                  Linkage: lambda c: c.high == c.low or c.open == c.closed or not c.arm_length > c.horn_radius > 0}
    if degenerate[cls](conversion):
        raise EmbodimentError(f"conversions.{name} ({kind}) cannot be inverted with these numbers")
    return conversion


def _openpi_keys(value: Any, state_dims: int | None) -> OpenpiKeys:
    table = _table(value, "openpi_keys", ("state", "images", "optional_images", "image_layout", "metadata"))
    state = table.get("state", [])
    pairs = [(e, None) if isinstance(e, str) else tuple(e) if isinstance(e, list) and len(e) == 2 else None
             for e in state] if isinstance(state, list) else [None]
    if not all(p is not None and isinstance(p[0], str) and p[0]
               and (p[1] is None or isinstance(p[1], int) and not isinstance(p[1], bool) and p[1] > 0)
               for p in pairs):
        raise EmbodimentError(f"openpi_keys.state must list [key, width] pairs (or one key alone: any width), got "
                              f"{state!r}")
    if any(w is None for _, w in pairs) and len(pairs) > 1:
        raise EmbodimentError("openpi_keys.state: a key without a width (any width) must be the only state key")
    width = sum(w or 0 for _, w in pairs)
    if state_dims is not None and pairs and width != state_dims:
        raise EmbodimentError(f"openpi_keys.state adds up to {width} dims, state.dims is {state_dims}")
    images = _table(table.get("images", {}), "openpi_keys.images", None)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in images.items()):
        raise EmbodimentError("openpi_keys.images must map openpi image keys to model image keys")
    optional = table.get("optional_images", [])
    if not isinstance(optional, list) or not all(k in images for k in optional):
        raise EmbodimentError(f"openpi_keys.optional_images must list keys of openpi_keys.images, got {optional!r}")
    layout = table.get("image_layout", "hwc")
    if layout not in IMAGE_LAYOUTS:
        raise EmbodimentError(f"openpi_keys.image_layout must be one of {' | '.join(IMAGE_LAYOUTS)}, got {layout!r}")
    metadata = _table(table.get("metadata", {}), "openpi_keys.metadata", None)
    return OpenpiKeys(tuple(pairs), tuple(images.items()), tuple(optional), layout, dict(metadata))
