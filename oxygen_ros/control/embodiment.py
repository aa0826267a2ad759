"""Embodiment profiles: what a checkpoint's state and action dims mean on one robot, applied both ways.

A pi0.5 checkpoint acts in the action space it was trained in, which is not always absolute joint positions:
openpi's `pi05_droid` emits joint velocities, openpi's ALOHA checkpoints joint deltas from the state of the frame
the model saw, in pi's own sign convention and gripper units. A profile (YAML, shipped ones in `embodiments/`,
facts and sources in docs/embodiments.md) says per dim what the model's numbers are, and this module is the one
place that applies it:

- robot -> model state (`state_to_model`): the robot state's dims picked in the model's order, signs flipped, units
  converted (the node then normalizes and pads it to the model's width);
- model -> robot command (`actions_to_robot`): per action dim, `position` and `gripper` are absolute, `delta` is
  added to the state of the frame the model saw, `velocity` is summed from that state in steps on the chunk's
  time grid (point i at (i + 1) time steps; a step is the profile's `velocity.step` x v, DROID's normalized
  velocities, or time step x v), then signs and units; the result is
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

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from .embodiment_math import (
    DELTA,
    GRIPPER,
    POSITION,
    REFUSED_KINDS,
    RELATIVE_KINDS,
    VELOCITY,
    ActionFilter,
    DimMap,
    EmbodimentError,
    OpenpiKeys,
    RobotChunk,
    VelocityScale,
    differences,
)
from .embodiment_yaml import parse_profile
from .openpi_configs import OPENPI_CONFIGS

SHIPPED_DIR = Path(__file__).resolve().parent / "embodiments"
# A LeRobot checkpoint's action feature whose name contains this is a velocity (this package's rule: LeRobot's own
# DROID port names its features action.joint_velocity / action.joint_position, examples/port_datasets/port_droid.py).
VELOCITY_NAME = "velocity"


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
    velocity: VelocityScale | None = None  # what a velocity dim's number means (DROID's normalized velocities)
    action_filter: ActionFilter | None = None  # clip / binarize the model's actions first (openpi's DROID example)

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
        the robot's absolute command [..., H, A] (A: the profile's action dims, else the actions' own width):
        the profile's action filter first (clip, binarized grippers), then `_command`."""
        actions = self._model_actions(actions)
        if self.action_filter is not None and self.kinds is not None:
            gripper = [dim for dim, kind in enumerate(self.kinds) if kind == GRIPPER]
            actions = self.action_filter.apply(actions, gripper)
        return self._command(actions, state)

    def _model_actions(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions, dtype=np.float64)
        width = len(self.kinds) if self.kinds is not None else actions.shape[-1]
        return actions[..., :width].copy()

    def _command(self, model: np.ndarray, state: np.ndarray) -> RobotChunk:
        """Model actions [..., H, A] -> the robot's command: deltas added to the frame's state, velocity dims
        turned into steps (`velocity_scale`) summed from it, then signs and units; the velocity dims' velocities
        are their steps per time step, the other dims' finite differences."""
        if self.kinds is None:
            return RobotChunk(model, None)
        frame = self.state_to_model(state)[..., None, :]  # [..., 1, S]: the same for every point
        positions = model.copy()
        velocity = [dim for dim, kind in enumerate(self.kinds) if kind == VELOCITY]
        steps = self.velocity_scale.steps(model[..., velocity])
        for dim, kind in enumerate(self.kinds):
            if kind == DELTA:
                positions[..., dim] += frame[..., dim]
        positions[..., velocity] = frame[..., velocity] + np.cumsum(steps, axis=-2)
        if self.action_map is not None:
            positions = self.action_map.to_robot_action(positions)
        if not velocity:
            return RobotChunk(positions, None)
        velocities = differences(positions, self.time_step)
        sign = np.ones(len(velocity)) if self.action_map is None else np.asarray(self.action_map.sign)[velocity]
        velocities[..., velocity] = sign * steps / self.time_step
        return RobotChunk(positions, velocities)

    @property
    def velocity_scale(self) -> VelocityScale:
        """How a velocity dim's number becomes one step's change: the profile's `velocity` section, else robot
        units per second over the time step."""
        if self.velocity is not None:
            return self.velocity
        return VelocityScale(self.time_step if self.time_step is not None else 0.0)

    def openpi_actions(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Unnormalized model actions [..., H, >= A] and the robot state [..., S] of the frame the model saw -> what
        openpi's policy returns for this robot [..., H, A]: the command without the action filter (the client
        applies that), except that velocity dims stay the model's numbers (signed), as openpi's output transforms
        leave them (DROID's `DroidOutputs` cuts the width and converts nothing)."""
        model = self._model_actions(actions)
        positions = self._command(model, state).positions
        if not self.has_velocity:
            return positions
        velocity = [dim for dim, kind in enumerate(self.kinds) if kind == VELOCITY]
        sign = np.ones(len(velocity)) if self.action_map is None else np.asarray(self.action_map.sign)[velocity]
        positions[..., velocity] = sign * model[..., velocity]
        return positions

    def openpi_to_model(self, reply: np.ndarray, state: np.ndarray) -> np.ndarray:
        """What openpi's policy returned for this robot [..., H, A] (`openpi_actions`) and the robot state [..., S]
        of the frame it was computed from -> the model's unnormalized actions [..., H, A], so that
        `actions_to_robot` makes of a remote engine's reply the command the local engine makes of its chunk (the
        action filter is the robot side's, as openpi's clients apply it). Velocity dims came as the model's
        numbers with the profile's signs; the other dims as absolute positions in robot units."""
        reply = np.asarray(reply, dtype=np.float64)
        if self.kinds is None:
            return reply.copy()
        velocity = [dim for dim, kind in enumerate(self.kinds) if kind == VELOCITY]
        model = self.actions_to_model(reply, state)  # positions and deltas back in the model's space
        sign = np.ones(len(velocity)) if self.action_map is None else np.asarray(self.action_map.sign)[velocity]
        model[..., velocity] = sign * reply[..., velocity]
        return model

    def actions_to_model(self, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Recorded absolute robot actions [..., H, A] from the frame whose robot state is [..., S] -> the model's
        unnormalized actions [..., H, A] (what training fits): the inverse of `actions_to_robot`'s positions where
        no velocity vector was scaled down and no filter changed a value."""
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
                out[..., dim] = (model[..., dim] - previous) / self.velocity_scale.step
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
        name = trained_on.openpi_config or next((n for n in trained_on.openpi_folders if n in OPENPI_CONFIGS), None)
        if name in OPENPI_CONFIGS:  # the train config says more than its asset id
            return self._openpi_config_mismatch(name, OPENPI_CONFIGS[name])
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

    def _openpi_config_mismatch(self, name: str, config) -> str | None:
        if config.refused:
            return f"openpi's {name} trains {config.actions}: {REFUSED_KINDS[config.refused]}; no profile can drive it"
        if config.profile is not None and config.profile != self.name:
            return f"openpi's {name} trains {config.actions}, which embodiment {config.profile} is for"
        if config.kinds is not None and tuple(self.kinds or ()) != config.kinds:
            return (f"openpi's {name} trains {config.actions}: a profile with action kinds {list(config.kinds)}, "
                    f"not {list(self.kinds) if self.kinds else 'positions'}")
        return None

    def _lerobot_mismatch(self, trained_on, action_names: tuple[str, ...]) -> str | None:
        """LeRobot's pi05 processors know absolute actions, or relative ones (the state added back on the masked
        dims): no velocities, no sign flips, no unit conversions."""
        kinds = self.kinds or (POSITION,) * len(action_names)
        maps = [m for m in (self.state_map, self.action_map) if m is not None]
        if self.state_pick is not None or any(m.convert or m.flips for m in maps):
            return "it is a LeRobot checkpoint, whose processors apply no sign flips or unit conversions"
        names = trained_on.lerobot_action_names
        velocities = [VELOCITY_NAME in n.lower() for n in names] if names and len(names) == len(kinds) else None
        if velocities is not None and [k == VELOCITY for k in kinds] != velocities:
            return (f"it is a LeRobot checkpoint whose action features {list(names)} are velocities on dims "
                    f"{_dims(velocities) if any(velocities) else 'none'}; the profile has them on "
                    f"{_dims(have) if any(have := [k == VELOCITY for k in kinds]) else 'none'}")
        if velocities is None and VELOCITY in kinds:
            return "it is a LeRobot checkpoint, trained on positions, not velocities (its action_feature_names " \
                   "name no velocity)"
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
        return Embodiment(**parse_profile(data, str(path)))
    except EmbodimentError as err:
        raise EmbodimentError(f"embodiment file {path}: {err}") from None


