"""The gym-aloha bimanual ViperX tasks (transfer cube, insertion), stepped fast enough for a 50 Hz closed loop.

gym-aloha's `AlohaEnv` renders three 480x640 views (top, angle, front_close) inside every step, with 4x
multisampling and 4096^2 shadow maps: ~180 ms/step on a CPU renderer. This wrapper uses the same MJCF scenes and
the same task classes (so reward and success are gym-aloha's own), but its task observation carries only qpos/qvel;
it then renders just the requested cameras, at the requested size, with persistent `dm_control` cameras and
multisampling and shadows off (set before the first render, when the offscreen buffer is created).

Conventions are gym-aloha's: 50 Hz (DT = 0.02 s), action = 14 absolute joint targets (per arm 6 joints then the
gripper, normalized 0 = closed .. 1 = open), qpos in the same layout, success = reward 4 (the task's max), and the
object pose sampled from the reset seed with gym-aloha's own samplers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

DT = 0.02
MAX_EPISODE_STEPS = 300  # gym-aloha's registered time limit
SIM_CAMERAS = ("top", "angle", "left_wrist", "right_wrist", "front_close", "left_pillar", "right_pillar")

# task -> (MJCF file in gym-aloha's assets, task class name in gym_aloha.tasks.sim, default instruction).
# The instructions are the ones LeRobot's aloha_sim datasets carry for these tasks.
TASKS = {
    "transfer_cube": ("bimanual_viperx_transfer_cube.xml", "TransferCubeTask",
                      "Pick up the cube with the right arm and transfer it to the left arm."),
    "insertion": ("bimanual_viperx_insertion.xml", "InsertionTask", "Insert the peg into the socket."),
}


# gym-aloha's staged reward: what each level means (the last is the task's maximum, success).
REWARD_STAGES = {
    "transfer_cube": ("nothing", "right gripper touches the cube", "cube lifted", "left gripper touches the cube",
                      "cube transferred"),
    "insertion": ("nothing", "both grippers touch", "peg and socket grasped", "peg touches the socket",
                  "peg inserted"),
}


class SimulationDiverged(RuntimeError):
    """MuJoCo flagged the physics state invalid (e.g. mjWARN_BADQACC after violent joint targets).

    The episode cannot go on from that state: `reset` starts a fresh one. A policy with random weights can command
    this; so can a real one gone wrong, which is why the sim node ends the episode and carries on.
    """


@dataclass
class Observation:
    """One sim frame: rendered cameras (H, W, 3) uint8, 14-dim joint positions / velocities, and the objects'
    poses (gym-aloha's `get_env_state`: the cube's x, y, z and quaternion; the peg's and the socket's)."""

    images: dict[str, np.ndarray]
    qpos: np.ndarray
    qvel: np.ndarray
    env_state: np.ndarray | None = None


@dataclass
class StepResult:
    observation: Observation
    reward: float
    success: bool      # the task's max reward was reached on this step
    truncated: bool    # the episode hit max_steps


class AlohaSimEnv:
    """One gym-aloha task with fast rendering of the chosen cameras; `reset(seed)` then `step(action)`."""

    def __init__(self, task: str = "transfer_cube", cameras: tuple[str, ...] | list[str] = ("top",),
                 height: int = 240, width: int = 320, max_steps: int = MAX_EPISODE_STEPS):
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
        unknown = [c for c in cameras if c not in SIM_CAMERAS]
        if unknown or not cameras:
            raise ValueError(f"unknown or no cameras {list(cameras)}; the scenes have {list(SIM_CAMERAS)}")
        if height <= 0 or width <= 0 or max_steps <= 0:
            raise ValueError("height, width and max_steps must be positive")
        # dm_control picks its GL backend when first imported; headless machines need EGL (or osmesa).
        os.environ.setdefault("MUJOCO_GL", "egl")
        from dm_control import mujoco
        from dm_control.rl import control
        from gym_aloha import constants
        from gym_aloha.tasks import sim as aloha_tasks

        xml, task_class, instruction = TASKS[task]
        self.task, self.instruction = task, instruction
        self.cameras, self.height, self.width, self.max_steps = tuple(cameras), height, width, max_steps
        self.physics = mujoco.Physics.from_xml_path(str(constants.ASSETS_DIR / xml))
        apply_fast_render_settings(self.physics, height, width)
        self._aloha_tasks = aloha_tasks
        self._physics_error = control.PhysicsError
        self._env = control.Environment(self.physics, _state_only(getattr(aloha_tasks, task_class))(),
                                        time_limit=float("inf"), control_timestep=DT, flat_observation=False)
        self._cameras = {name: mujoco.Camera(self.physics, height, width, name) for name in self.cameras}
        self.max_reward = float(self._env.task.max_reward)
        self.steps = 0
        self.success = False
        self.diverged = False
        self.episode_max_reward = 0.0  # the highest stage this episode reached

    def _sample_object_pose(self, seed: int | None) -> np.ndarray:
        from gym_aloha.utils import sample_box_pose, sample_insertion_pose

        if self.task == "transfer_cube":
            return sample_box_pose(seed)
        return np.concatenate(sample_insertion_pose(seed))

    def reset(self, seed: int | None = None) -> Observation:
        """Arms at gym-aloha's start pose, object pose drawn from `seed` (same poses as gym-aloha's reset)."""
        # gym-aloha's tasks read the object pose from this module-level slot during initialize_episode.
        self._aloha_tasks.BOX_POSE[0] = self._sample_object_pose(seed)
        timestep = self._env.reset()
        self.steps, self.success, self.diverged, self.episode_max_reward = 0, False, False, 0.0
        return self._observation(timestep.observation)

    def step(self, action: np.ndarray, render: bool = True) -> StepResult:
        """One 50 Hz control step; `render=False` leaves the observation's images empty (physics only)."""
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (14,) or not np.all(np.isfinite(action)):
            raise ValueError(f"action must be 14 finite joint targets, got shape {action.shape}")
        if self.diverged:
            raise SimulationDiverged("the physics diverged earlier in this episode: reset first")
        try:
            timestep = self._env.step(action)
        except self._physics_error as err:
            self.diverged = True
            raise SimulationDiverged(f"physics diverged at episode step {self.steps + 1} ({err})") from err
        self.steps += 1
        reward = float(timestep.reward or 0.0)
        self.episode_max_reward = max(self.episode_max_reward, reward)
        self.success = self.success or reward >= self.max_reward
        return StepResult(self._observation(timestep.observation, render), reward, reward >= self.max_reward,
                          self.steps >= self.max_steps)

    def render(self) -> dict[str, np.ndarray]:
        return {name: np.ascontiguousarray(cam.render()) for name, cam in self._cameras.items()}

    def _observation(self, raw: dict, render: bool = True) -> Observation:
        return Observation(self.render() if render else {}, np.asarray(raw["qpos"], dtype=np.float64).copy(),
                           np.asarray(raw["qvel"], dtype=np.float64).copy(),
                           np.asarray(self._env.task.get_env_state(self.physics), dtype=np.float64).copy())

    def close(self) -> None:
        self._cameras.clear()
        self.physics.free()


def apply_fast_render_settings(physics, height: int, width: int) -> None:
    """No multisampling, no shadow map, and an offscreen buffer big enough for the requested size.

    Must run before anything renders: MuJoCo sizes the offscreen buffers when the GL context is made.
    """
    quality = physics.model.vis.quality
    quality.offsamples = 0
    quality.shadowsize = 0
    offscreen = physics.model.vis.global_
    offscreen.offwidth = max(offscreen.offwidth, width)
    offscreen.offheight = max(offscreen.offheight, height)


def _state_only(task_class):
    """gym-aloha's task with an observation of qpos/qvel only (its own renders three 480x640 views per step)."""

    class StateOnlyTask(task_class):
        def get_observation(self, physics):
            return {"qpos": self.get_qpos(physics), "qvel": self.get_qvel(physics)}

    StateOnlyTask.__name__ = f"StateOnly{task_class.__name__}"
    return StateOnlyTask
