"""Record a sim episode (camera frames, qpos, qvel, commanded actions) and write it as an ALOHA HDF5 file.

Rows follow ALOHA's recording convention: row t holds the observation the policy saw at step t and the action
commanded right after it, so `/action[t]` is what moved the robot from observation t to t + 1.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from oxygen_ros.data.aloha import ALOHA_FPS, write_aloha
from oxygen_ros.data.episode import ALOHA_JOINT_NAMES, Episode


class EpisodeRecorder:
    """Accumulates one episode in memory; `write` produces `episode_{i}.hdf5` for the data tools."""

    def __init__(self, cameras: tuple[str, ...] | list[str], task: str = "", fps: float = ALOHA_FPS):
        self.cameras, self.task, self.fps = tuple(cameras), task, fps
        self.clear()

    def clear(self) -> None:
        self._images: dict[str, list[np.ndarray]] = {cam: [] for cam in self.cameras}
        self._qpos: list[np.ndarray] = []
        self._qvel: list[np.ndarray] = []
        self._actions: list[np.ndarray] = []
        self._env_states: list[np.ndarray] = []
        self._rewards: list[float] = []

    def __len__(self) -> int:
        return len(self._actions)

    def add(self, images: dict[str, np.ndarray], qpos: np.ndarray, qvel: np.ndarray, action: np.ndarray,
            env_state: np.ndarray | None = None) -> None:
        """One step; `env_state` (the objects' poses) on every step or on none."""
        missing = [cam for cam in self.cameras if cam not in images]
        if missing:
            raise ValueError(f"frame lacks cameras {missing}")
        for cam in self.cameras:
            self._images[cam].append(np.asarray(images[cam], dtype=np.uint8))
        self._qpos.append(np.asarray(qpos, dtype=np.float32))
        self._qvel.append(np.asarray(qvel, dtype=np.float32))
        self._actions.append(np.asarray(action, dtype=np.float32))
        if env_state is not None:
            self._env_states.append(np.asarray(env_state, dtype=np.float32))

    def add_reward(self, reward: float) -> None:
        """The reward the last added action earned (call once per `add`, after stepping the sim)."""
        if len(self._rewards) != len(self._actions) - 1:
            raise ValueError("add_reward must follow add, once per step")
        self._rewards.append(float(reward))

    def episode(self, max_reward: float | None = None) -> Episode:
        if not self._actions:
            raise ValueError("nothing recorded")
        state = np.stack(self._qpos)
        names = ALOHA_JOINT_NAMES if state.shape[1] == len(ALOHA_JOINT_NAMES) else ()
        return Episode(images={cam: np.stack(frames) for cam, frames in self._images.items()}, state=state,
                       actions=np.stack(self._actions), fps=self.fps, task=self.task, joint_names=names,
                       velocity=np.stack(self._qvel), max_reward=max_reward,
                       environment_state=np.stack(self._env_states) if self._env_states else None,
                       reward=np.array(self._rewards) if len(self._rewards) == len(self._actions) else None)

    def write(self, path: str | os.PathLike, compress: bool = False, max_reward: float | None = None) -> Path:
        """Write the episode (marked `sim`, with the staged reward of every step when each was added, and the
        task's maximum) and return the path; the file appears only once complete."""
        return write_aloha(path, self.episode(max_reward), compress=compress, sim=True)


def next_episode_path(folder: str | os.PathLike) -> Path:
    """`folder/episode_{i}.hdf5` with the first unused i (ALOHA's naming), creating the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    i = 0
    while (folder / f"episode_{i}.hdf5").exists():
        i += 1
    return folder / f"episode_{i}.hdf5"
