"""A scripted (not learned) plan for gym-aloha's `transfer_cube`: the right arm grasps the cube and lifts it.

It shows that the closed loop (sim -> topics -> policy -> action chunks -> sim) can drive the task to gym-aloha's
lift stage (reward 2); it knows where the cube is because it draws the cube pose from the episode seed with
gym-aloha's own sampler, as `AlohaSimEnv.reset(seed)` does. Joint targets come from inverse kinematics on the task's
MuJoCo model: damped least squares on the right gripper's grasp point and orientation (fingers closing along the
world y axis, pointing down at `PITCH` below the horizontal), through key poses at fixed times, interpolated
linearly in joint space at the sim's 50 Hz. The left arm holds its start pose.
"""

from __future__ import annotations

import numpy as np

from oxygen_ros.sim.aloha_env import DT, TASKS

RIGHT_ARM = slice(8, 14)  # the right arm's six joints in the model's qpos and dofs
GRASP_POINT = np.array([0.10, 0.0, 0.0])  # between the fingertips, in the gripper link's frame
PITCH = np.radians(50.0)
OPEN, CLOSED = 1.0, 0.0  # gym-aloha's normalized gripper command

# (seconds from the episode start, height of the grasp point above the cube centre in m, right gripper command)
KEY_POSES = ((1.2, 0.10, OPEN), (2.0, 0.0, OPEN), (2.6, 0.0, CLOSED), (3.6, 0.15, CLOSED))
HOLD_S = 2.0


def _start_qpos() -> np.ndarray:
    from gym_aloha.constants import START_ARM_POSE

    return np.asarray(START_ARM_POSE, dtype=np.float64)


def _grasp_rotation() -> np.ndarray:
    """Gripper orientation (columns = its x, y, z axes in the world): pointing towards -x and down by PITCH,
    fingers closing along world y, as at the start pose but pitched down."""
    x = np.array([-np.cos(PITCH), 0.0, -np.sin(PITCH)])
    y = np.array([0.0, -1.0, 0.0])
    return np.column_stack([x, y, np.cross(x, y)])


def solve_right_arm(model, data, target: np.ndarray, rotation: np.ndarray, q0: np.ndarray,
                    iterations: int = 300, damping: float = 1e-3) -> np.ndarray:
    """Right-arm joints that put the grasp point at `target` with the gripper at `rotation` (least squares)."""
    import mujoco

    body = model.body("vx300s_right/gripper_link").id
    low, high = model.jnt_range[RIGHT_ARM].T
    q = q0.copy()
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    for _ in range(iterations):
        data.qpos[RIGHT_ARM] = q
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        current = data.xmat[body].reshape(3, 3)
        point = data.xpos[body] + current @ GRASP_POINT
        position_error = target - point
        rotation_error = 0.5 * sum(np.cross(current[:, i], rotation[:, i]) for i in range(3))
        error = np.concatenate([position_error, 0.3 * rotation_error])
        if np.linalg.norm(position_error) < 1e-4 and np.linalg.norm(rotation_error) < 1e-3:
            break
        mujoco.mj_jac(model, data, jacp, jacr, point, body)
        jac = np.vstack([jacp[:, RIGHT_ARM], 0.3 * jacr[:, RIGHT_ARM]])
        step = jac.T @ np.linalg.solve(jac @ jac.T + damping * np.eye(6), error)
        q = np.clip(q + step, low, high)
    return q


def transfer_cube_lift_plan(seed: int) -> np.ndarray:
    """[T, 14] joint targets, one per 50 Hz step, for the episode reset with `seed`: grasp, then lift and hold."""
    import mujoco
    from gym_aloha.constants import ASSETS_DIR
    from gym_aloha.utils import sample_box_pose

    model = mujoco.MjModel.from_xml_path(str(ASSETS_DIR / TASKS["transfer_cube"][0]))
    data = mujoco.MjData(model)
    start = _start_qpos()
    data.qpos[: len(start)] = start
    cube = sample_box_pose(seed)[:3]
    rotation = _grasp_rotation()
    start_command = np.concatenate([start[:6], [OPEN], start[8:14], [OPEN]])
    keys = [(0.0, start_command)]
    q = start[RIGHT_ARM]
    for seconds, height, gripper in KEY_POSES:
        q = solve_right_arm(model, data, cube + np.array([0.0, 0.0, height]), rotation, q)
        keys.append((seconds, np.concatenate([start_command[:7], q, [gripper]])))
    keys.append((keys[-1][0] + HOLD_S, keys[-1][1]))
    times = np.array([t for t, _ in keys])
    commands = np.stack([c for _, c in keys])
    steps = np.arange(int(round(times[-1] / DT)) + 1) * DT
    return np.stack([np.interp(steps, times, commands[:, j]) for j in range(commands.shape[1])], axis=1)
