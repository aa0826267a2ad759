"""The in-memory form every episode format is read into and written from.

Readers and writers only translate between a file layout and `Episode`; conversion to bags, the synthetic
generator and the report all work on this one type, so a new format needs one reader and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# ALOHA's 14 joints in qpos/action order: per arm 6 joints then the gripper, left arm first.
_ALOHA_ARM_JOINTS = ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate", "gripper")
ALOHA_JOINT_NAMES = tuple(f"{side}_{j}" for side in ("left", "right") for j in _ALOHA_ARM_JOINTS)


class DataError(ValueError):
    """An episode source or bag is unreadable or inconsistent; the message names the file and the problem.

    It prints as one line, whatever a wrapped library error carried (YAML and HDF5 errors span several lines).
    """

    def __str__(self) -> str:
        return " ".join(super().__str__().split())


def default_joint_names(dim: int) -> tuple[str, ...]:
    """ALOHA names for 14-dim state (the common bimanual layout), generic `joint_i` names otherwise."""
    if dim == len(ALOHA_JOINT_NAMES):
        return ALOHA_JOINT_NAMES
    return tuple(f"joint_{i}" for i in range(dim))


@dataclass
class Episode:
    """One recorded episode: synchronized camera frames, robot state and commanded actions.

    images:      camera name -> (T, H, W, 3) uint8 RGB
    state:       (T, D) float32 joint positions (ALOHA qpos)
    actions:     (T, A) float32 commanded joint targets
    fps:         control/camera rate in Hz
    task:        natural-language instruction ("" when the source has none)
    joint_names: D names for `state` (and for `actions` when A == D)
    timestamps:  (T,) float64 seconds from the episode start, or None for the nominal `i / fps`
    velocity, effort: optional (T, D) float32 (ALOHA qvel / effort)
    environment_state: optional (T, E) float32, the scene's objects (a simulator's object poses: LeRobot's
                 `observation.environment_state`; gym-aloha's cube: x, y, z and its quaternion)
    reward:      optional (T,) float32, the reward after each action (a simulator's staged reward)
    max_reward:  the reward that means success, when `reward` is given
    """

    images: dict[str, np.ndarray]
    state: np.ndarray
    actions: np.ndarray
    fps: float
    task: str = ""
    joint_names: tuple[str, ...] = ()
    timestamps: np.ndarray | None = None
    velocity: np.ndarray | None = None
    effort: np.ndarray | None = None
    environment_state: np.ndarray | None = None
    reward: np.ndarray | None = None
    max_reward: float | None = None

    def __post_init__(self) -> None:
        self.state = np.asarray(self.state, dtype=np.float32)
        self.actions = np.asarray(self.actions, dtype=np.float32)
        if not self.joint_names:
            self.joint_names = default_joint_names(self.state.shape[-1])
        self.joint_names = tuple(self.joint_names)
        self.validate()

    @property
    def cameras(self) -> tuple[str, ...]:
        return tuple(self.images)

    @property
    def length(self) -> int:
        return int(self.state.shape[0])

    def times(self) -> np.ndarray:
        """Seconds from the episode start for every frame."""
        if self.timestamps is not None:
            return np.asarray(self.timestamps, dtype=np.float64)
        return np.arange(self.length, dtype=np.float64) / self.fps

    def numeric_problem(self) -> str | None:
        """The first NaN or infinity in state, actions, velocity or effort, or frame times that do not increase,
        as one line; None when the numbers are usable."""
        for name in ("state", "actions", "velocity", "effort", "environment_state"):
            values = getattr(self, name)
            bad = np.argwhere(~np.isfinite(values)) if values is not None else ()
            if len(bad):
                t, j = (int(i) for i in bad[0])
                joint = self.joint_names[j] if values.shape[1] == len(self.joint_names) else f"column {j}"
                return (f"{name} has {len(bad)} non-finite values (first at frame {t}, {joint}: "
                        f"{float(values[t, j])})")
        times = self.times()
        if not np.all(np.isfinite(times)) or np.any(np.diff(times) <= 0):
            return "frame timestamps are not finite and strictly increasing"
        return None

    def validate(self) -> None:
        """Raise DataError if arrays disagree in length, shape or dtype."""
        if self.state.ndim != 2 or self.actions.ndim != 2:
            raise DataError(f"state and actions must be (T, D); got {self.state.shape} and {self.actions.shape}")
        t = self.length
        lengths = {"state": t, "actions": self.actions.shape[0]}
        for name, img in self.images.items():
            if img.dtype != np.uint8 or img.ndim != 4 or img.shape[-1] != 3:
                raise DataError(f"camera {name!r}: expected (T, H, W, 3) uint8, got {img.shape} {img.dtype}")
            lengths[f"camera {name}"] = img.shape[0]
        for name in ("timestamps", "velocity", "effort", "environment_state", "reward"):
            value = getattr(self, name)
            if value is not None:
                lengths[name] = len(value)
        if len(set(lengths.values())) != 1:
            raise DataError(f"episode arrays have mismatched lengths: {lengths}")
        if len(self.joint_names) != self.state.shape[1]:
            raise DataError(f"{len(self.joint_names)} joint names for state of width {self.state.shape[1]}")
        if self.fps <= 0:
            raise DataError(f"fps must be positive, got {self.fps}")
