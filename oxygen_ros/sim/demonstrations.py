"""Scripted transfer_cube demonstrations that succeed, made the way ACT made its simulated data.

1. The plan is written in the end effectors' space: timed waypoints (grasp point position, orientation as a
   quaternion, normalized gripper command) for each arm, interpolated linearly at the sim's 50 Hz (orientations
   normalized after blending). The right gripper goes above the cube, down, closes, carries the cube to a meeting
   point in the air and holds it still; the left gripper, turned to face it, waits short of it, moves in to where
   the cube is then held, closes, and only then the right one opens; the left arm carries the cube back and holds
   it to the episode's end (ACT's scripted transfer meets the grippers the same way: a fixed meeting point, the
   left closes there, then the right opens).
2. It is rolled out in gym-aloha's end-effector task (`TransferCubeEndEffectorTask`: mocap bodies pull each
   gripper to the commanded pose), and each step's joint positions are recorded as joint targets, the gripper
   columns replaced by the gripper command (the fingers lag their command; a replay must command, not follow).
3. Those targets are replayed in the joint-space task (`AlohaSimEnv`, the task every policy here is evaluated in)
   and recorded there, images included. A demonstration is kept only when the replay reaches gym-aloha's top
   reward stage (4: the left gripper holds the cube off the table).

Episode `seed` places the cube with gym-aloha's own sampler, in both tasks, so demonstration i is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oxygen_ros.data.episode import Episode
from oxygen_ros.sim.aloha_env import DT, MAX_EPISODE_STEPS, SimulationDiverged
from oxygen_ros.sim.recording import EpisodeRecorder
from oxygen_ros.sim.scripted import CLOSED, GRASP_POINT, OPEN

END_EFFECTOR_XML = "bimanual_viperx_end_effector_transfer_cube.xml"
EPISODE_STEPS = MAX_EPISODE_STEPS  # gym-aloha's time limit; the left arm holds the cube up to its last step
MEET = np.array([0.0, 0.5, 0.25])  # where the cube changes hands, in the world frame (m)
ARMS = ("left", "right")  # the order of gym-aloha's action halves
# The hand-over starts 35 steps after the right arm reaches the meeting point (step 165). Starting it 30 steps
# sooner, so that no policy sees arms stand still that long, cost scripted successes (48 of 50 held-out seeds
# against 50) and gave two trained policies no hand-over (`docs/results/2026-12-05-sim-eval-r5.md`).
REPLAN_STEP = 200  # the right arm holds the cube still at the meeting point: the left arm's grasp is aimed there
LEFT_GRASP_STEP = 230  # the left grasp point reaches the held cube; its gripper closes until LEFT_CLOSED_STEP
LEFT_CLOSED_STEP = 255
RIGHT_OPEN_STEPS = (258, 270)  # the right gripper opens once the left one has closed
LEFT_AWAY_STEP = 275  # then the left arm carries the cube back to its waiting distance
LEFT_WAIT = 0.15  # the left grasp point waits this far short of the cube (m), its open jaw clear of it
LEFT_REACH = np.array([0.015, 0.0, 0.01])  # where the left grasp point closes, from the held cube's centre (m)
GRASP_BELOW = np.array([0.0, 0.0, -0.02])  # aim under the cube's centre: the weld lets the gripper ride high
PITCH_DEGREES = 50.0  # the right gripper's tilt below the horizontal when it picks
RIGHT_SHOULDER = np.array([0.469, 0.5])  # the right arm's waist axis (x, y) in the world: it picks facing away from it


def _rotation_about(axis: str, degrees: float) -> np.ndarray:
    """A 3x3 rotation about a world axis."""
    c, s = np.cos(np.radians(degrees)), np.sin(np.radians(degrees))
    i, j = {"x": (1, 2), "y": (2, 0), "z": (0, 1)}[axis]
    rotation = np.eye(3)
    rotation[i, i], rotation[i, j], rotation[j, i], rotation[j, j] = c, -s, s, c
    return rotation


# Gripper orientations (columns: the gripper link's axes in the world; x points along the fingers, the fingers
# close along y). The right gripper carries the cube pointing towards -x and down; the left one meets it pointing
# towards +x, turned a quarter about its pointing axis so that its fingers close across the right gripper's.
PICK = _rotation_about("y", -PITCH_DEGREES) @ np.diag([-1.0, -1.0, 1.0])
FACE = _rotation_about("x", 90.0)


def pick_rotation(cube: np.ndarray) -> np.ndarray:
    """The right gripper's orientation over the cube: PICK turned about the vertical to point along the line from
    the right arm's waist to the cube. Pointing along -x wherever the cube lies, the arm could not reach the
    table's near and far corners: 19 of 50 held-out seeds failed, 5 of them without touching the cube."""
    dx, dy = cube[:2] - RIGHT_SHOULDER
    return _rotation_about("z", np.degrees(np.arctan2(-dy, -dx))) @ PICK


@dataclass(frozen=True)
class Waypoint:
    step: int
    point: np.ndarray  # the grasp point (between the fingertips) in the world, m
    rotation: np.ndarray  # the gripper link's orientation, 3x3
    gripper: float  # normalized command, 0 closed .. 1 open


def transfer_plan(cube: np.ndarray, start: dict[str, tuple[np.ndarray, np.ndarray]],
                  held: np.ndarray | None = None) -> dict[str, list[Waypoint]]:
    """The two arms' waypoints for a cube centred at `cube`, from each gripper's start (grasp point, rotation).

    The left gripper waits short of the meeting point, then closes where the cube is held (`held`, its centre
    once the right arm has brought it there; until then the meeting point itself): the grasp in the right gripper
    is never quite centred. Only the left grasp depends on `held`, so a new `held` moves no waypoint already passed.
    """
    held = MEET if held is None else held
    grasp = held + LEFT_REACH
    away = held + np.array([-LEFT_WAIT, 0.0, LEFT_REACH[2]])
    right_point, right_rotation = start["right"]
    left_point, left_rotation = start["left"]
    pick = pick_rotation(cube)
    last = EPISODE_STEPS - 1
    return {
        "left": [
            Waypoint(0, left_point, left_rotation, CLOSED),
            Waypoint(80, MEET - np.array([LEFT_WAIT, 0.0, 0.0]), FACE, OPEN),
            Waypoint(REPLAN_STEP, MEET - np.array([LEFT_WAIT, 0.0, 0.0]), FACE, OPEN),
            Waypoint(LEFT_GRASP_STEP, grasp, FACE, OPEN),
            Waypoint(LEFT_CLOSED_STEP, grasp, FACE, CLOSED),
            Waypoint(LEFT_AWAY_STEP, grasp, FACE, CLOSED),
            Waypoint(last, away, FACE, CLOSED),
        ],
        "right": [
            Waypoint(0, right_point, right_rotation, CLOSED),
            Waypoint(70, cube + np.array([0.0, 0.0, 0.08]), pick, OPEN),
            Waypoint(100, cube + GRASP_BELOW, pick, OPEN),
            Waypoint(125, cube + GRASP_BELOW, pick, CLOSED),
            Waypoint(150, MEET + np.array([0.05, 0.0, 0.0]), PICK, CLOSED),
            Waypoint(165, MEET, PICK, CLOSED),
            Waypoint(RIGHT_OPEN_STEPS[0], MEET, PICK, CLOSED),
            Waypoint(RIGHT_OPEN_STEPS[1], MEET, PICK, OPEN),
            Waypoint(last, MEET + np.array([0.1, 0.0, 0.0]), PICK, OPEN),
        ],
    }


def pose_at(waypoints: list[Waypoint], step: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(grasp point, rotation, gripper) at `step`, linear between the waypoints around it (the rotation
    re-orthonormalized), the last waypoint held after the plan ends."""
    later = next((i for i, w in enumerate(waypoints) if w.step > step), len(waypoints) - 1)
    before, after = waypoints[max(later - 1, 0)], waypoints[later]
    span = after.step - before.step
    f = float(np.clip((step - before.step) / span, 0.0, 1.0)) if span > 0 else 1.0
    u, _, vt = np.linalg.svd((1 - f) * before.rotation + f * after.rotation)
    return (1 - f) * before.point + f * after.point, u @ vt, (1 - f) * before.gripper + f * after.gripper


class MocapWeld:
    """Where to put a mocap body so that the gripper link welded to it sits at a pose: gym-aloha's welds hold the
    link at a fixed pose relative to the mocap body (MuJoCo's `relpose`), which is undone here."""

    def __init__(self, model, index: int):
        import mujoco

        self._mujoco = mujoco
        self.offset = model.eq_data[index][3:6].copy()
        self.turn = model.eq_data[index][6:10].copy()

    def mocap(self, point: np.ndarray, rotation: np.ndarray) -> np.ndarray:
        """[x, y, z, qw, qx, qy, qz] of the mocap body for the link at `rotation` with its grasp point at `point`."""
        mj = self._mujoco
        link, inverse_turn, quat = np.zeros(4), np.zeros(4), np.zeros(4)
        mj.mju_mat2Quat(link, np.ascontiguousarray(rotation).reshape(-1))
        mj.mju_negQuat(inverse_turn, self.turn)
        mj.mju_mulQuat(quat, link, inverse_turn)
        origin = point - rotation @ GRASP_POINT
        matrix = np.zeros(9)
        mj.mju_quat2Mat(matrix, quat)
        return np.concatenate([origin - matrix.reshape(3, 3) @ self.offset, quat])


def end_effector_rollout(seed: int, steps: int = EPISODE_STEPS, held: np.ndarray | None = None) -> np.ndarray:
    """Roll the plan out in gym-aloha's end-effector task; returns [steps, 14] joint targets (ALOHA layout).

    The left grasp is aimed at `held`, where the cube is at REPLAN_STEP (default: where it is in this task then).
    """
    import os

    os.environ.setdefault("MUJOCO_GL", "egl")
    from dm_control import mujoco
    from dm_control.rl import control
    from gym_aloha import constants
    from gym_aloha.tasks.sim_end_effector import TransferCubeEndEffectorTask
    from gym_aloha.utils import sample_box_pose

    class SeededTask(TransferCubeEndEffectorTask):
        """gym-aloha's task with the cube placed from the episode seed and no rendering in its observation."""

        def initialize_episode(self, physics):
            self.initialize_robots(physics)
            address = physics.model.jnt_qposadr[physics.model.name2id("red_box_joint", "joint")]
            physics.data.qpos[address: address + 7] = sample_box_pose(seed)

        def get_observation(self, physics):
            return {"qpos": self.get_qpos(physics)}

    physics = mujoco.Physics.from_xml_path(str(constants.ASSETS_DIR / END_EFFECTOR_XML))
    env = control.Environment(physics, SeededTask(), time_limit=float("inf"), control_timestep=DT,
                              flat_observation=False)
    try:
        env.reset()
        model, data = physics.model.ptr, physics.data.ptr
        welds, start = {}, {}
        for side in ARMS:
            body = model.body(f"vx300s_{side}/gripper_link").id
            rotation = data.xmat[body].reshape(3, 3).copy()
            start[side] = (data.xpos[body] + rotation @ GRASP_POINT, rotation)
            welds[side] = MocapWeld(model, next(i for i in range(model.neq)
                                                if model.eq_obj2id[i] == body))
        plan = transfer_plan(sample_box_pose(seed)[:3], start)
        targets = np.empty((steps, 14))
        box = physics.model.jnt_qposadr[physics.model.name2id("red_box_joint", "joint")]
        for t in range(steps):
            if t == REPLAN_STEP:  # once: a grasp that followed the cube chased what its own jaw pushed
                here = physics.data.qpos[box: box + 3].copy()
                plan = transfer_plan(sample_box_pose(seed)[:3], start, here if held is None else held)
            action = []
            for side in ARMS:
                point, rotation, gripper = pose_at(plan[side], t)
                action += [welds[side].mocap(point, rotation), [gripper]]
            try:
                timestep = env.step(np.concatenate(action))
            except control.PhysicsError as err:
                raise SimulationDiverged(f"end-effector rollout of seed {seed} diverged at step {t + 1}") from err
            targets[t] = timestep.observation["qpos"]
            targets[t, 6], targets[t, 13] = action[1][0], action[3][0]  # the command, not where the fingers lag
        return targets
    finally:
        physics.free()


PERTURB_KNOTS = (50, 100, 150)  # a perturbed replay's right-arm offset takes a new value at each, held after the last


def check_perturb(scale: float) -> None:
    """ValueError unless `scale` is a usable perturbation (rad): at least 0, under 1 (nan refused too)."""
    if not 0.0 <= scale < 1.0:
        raise ValueError(f"--perturb must be at least 0 and under 1 rad, got {scale}")


def _executed(targets: np.ndarray, offsets: np.ndarray | None) -> np.ndarray:
    """What a replay sends to the sim: the targets, plus the offsets of a perturbed one."""
    return targets if offsets is None else targets + offsets[: len(targets)]


def right_arm_offsets(seed: int, steps: int, scale: float) -> np.ndarray:
    """[steps, 14] offsets a perturbed replay adds to the joint targets it executes while the recorded actions stay
    the plan's (DART: the demonstrations then show the way back from states a policy's own errors lead to).

    Only the right arm's six joints: zero at the start, a normal draw (standard deviation `scale` rad) at each of
    PERTURB_KNOTS, linear in between, the last held to the end, so the cube reaches the meeting point off by as
    much and the left grasp, aimed where the replay holds the cube, learns to go where the cube is. Seeded by the
    episode seed."""
    offsets = np.zeros((steps, 14))
    if scale <= 0:
        return offsets
    knots = np.array([0, *PERTURB_KNOTS])
    values = np.zeros((len(knots), 6))
    values[1:] = np.random.default_rng([seed, 48]).normal(0.0, scale, (len(knots) - 1, 6))
    for joint in range(6):
        offsets[:, 7 + joint] = np.interp(np.arange(steps), knots, values[:, joint])
    return offsets


@dataclass
class Demonstration:
    seed: int
    episode: Episode  # the joint-space replay as recorded (cameras, qpos, qvel, targets, reward)
    max_reward: float  # the best reward stage the replay reached
    success: bool


def replay(env, seed: int, targets: np.ndarray, task: str, offsets: np.ndarray | None = None) -> Demonstration:
    """Replay joint targets in `env` (an `AlohaSimEnv`) from `reset(seed)`, recording what its cameras see; with
    `offsets`, `targets + offsets` are executed and `targets` recorded as the actions."""
    recorder = EpisodeRecorder(env.cameras, task=task)
    observation = env.reset(seed)
    for action, command in zip(targets, _executed(targets, offsets)):
        recorder.add(observation.images, observation.qpos, observation.qvel, action, observation.env_state)
        result = env.step(command)
        recorder.add_reward(result.reward)
        observation = result.observation
    return Demonstration(seed, recorder.episode(max_reward=env.max_reward), env.episode_max_reward, env.success)


def held_in_replay(env, seed: int, targets: np.ndarray, offsets: np.ndarray | None = None) -> np.ndarray:
    """Where the cube is at REPLAN_STEP when `targets` (+ `offsets`) are replayed in `env` (the joint-space task;
    not rendered)."""
    env.reset(seed)
    for action in _executed(targets, offsets)[:REPLAN_STEP]:
        observation = env.step(action, render=False).observation
    return observation.env_state[:3].copy()


def demonstration(env, seed: int, perturb: float = 0.0) -> Demonstration:
    """Demonstration `seed`: the end-effector rollout, replayed and recorded in `env` (transfer_cube).

    The two tasks grasp differently (a welded gripper against joint position control): the cube can sit a few
    centimetres apart in the two right grippers, or lie on the table in one of them. So the rollout is made twice:
    the second aims the left grasp where the joint-space replay of the first holds the cube, and is the one kept.
    `perturb` > 0: both replays execute the right arm off its targets (`right_arm_offsets`), the recording keeps
    the targets as the actions.
    """
    if env.task != "transfer_cube":
        raise ValueError(f"scripted demonstrations exist for transfer_cube only, not {env.task!r}")
    check_perturb(perturb)
    offsets = right_arm_offsets(seed, env.max_steps, perturb) if perturb > 0 else None
    first = end_effector_rollout(seed, env.max_steps)
    targets = end_effector_rollout(seed, env.max_steps, held=held_in_replay(env, seed, first, offsets))
    return replay(env, seed, targets, env.instruction, offsets)
