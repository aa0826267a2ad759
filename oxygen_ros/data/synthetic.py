"""Small synthetic episodes with real structure, for tests and the demo (no data set can be downloaded).

Each camera shows a coloured square moving over a gradient background, so frame order, camera identity and
lossy-codec damage are all visible in the pixels; the actions lead the state by a few frames, as a teleoperated
leader arm leads its follower. Joints follow smooth sinusoids (`motion="sinusoids"`), or, for the 14 ALOHA joints,
a scripted bimanual hand-over (`motion="handover"`): one arm or gripper moves at a time between key poses, so the
episode has phases a caption can name, and each camera also shows one marker per arm that follows the arm's
waist and shoulder and shrinks while its gripper is closed, so the pixels show what the arms do.
"""

from __future__ import annotations

import numpy as np

from .episode import Episode, default_joint_names

_COLOURS = ((230, 40, 40), (40, 200, 60), (50, 80, 230), (230, 200, 30), (200, 60, 200), (40, 200, 200))


def moving_square_frames(num_frames: int, height: int, width: int, camera_index: int = 0,
                         phase_offset: float = 0.0) -> np.ndarray:
    """(T, H, W, 3) uint8: a square crossing the frame along a Lissajous path, colour set by the camera."""
    ys, xs = np.mgrid[0:height, 0:width]
    background = np.stack([xs * 120 // max(width, 1), ys * 120 // max(height, 1), np.full_like(xs, 60)], -1)
    side = max(4, min(height, width) // 5)
    phase = np.linspace(0.0, 2.0 * np.pi, num_frames, endpoint=False) + phase_offset
    top = ((0.5 + 0.45 * np.sin(phase + camera_index)) * (height - side)).astype(int)
    left = ((0.5 + 0.45 * np.sin(2 * phase + camera_index)) * (width - side)).astype(int)
    frames = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    frames[:] = background.astype(np.uint8)
    colour = np.array(_COLOURS[camera_index % len(_COLOURS)], dtype=np.uint8)
    for t in range(num_frames):
        frames[t, top[t] : top[t] + side, left[t] : left[t] + side] = colour
    return frames


def joint_trajectory(num_frames: int, dim: int, fps: float, seed: int = 0) -> np.ndarray:
    """(T, D) float32 smooth joint positions: per-joint sinusoids with random amplitude, period and phase."""
    rng = np.random.default_rng(seed)
    t = np.arange(num_frames)[:, None] / fps
    amplitude = rng.uniform(0.1, 0.6, dim)
    period = rng.uniform(1.5, 4.0, dim)
    phase = rng.uniform(0, 2 * np.pi, dim)
    offset = rng.uniform(-0.5, 0.5, dim)
    return (offset + amplitude * np.sin(2 * np.pi * t / period + phase)).astype(np.float32)


# ALOHA joint order per arm: waist, shoulder, elbow, forearm_roll, wrist_angle, wrist_rotate, gripper.
_HOME = (0.0, -0.9, 1.1, 0.0, -0.3, 0.0, 0.9)
_GRIPPER_CLOSED = 0.15
# The hand-over as (duration weight, {arm: key pose}); an arm missing from a step holds its pose. Left picks the
# cube and brings it to the middle, right takes it, left lets go and goes home while right carries it to the bowl.
_HANDOVER = (
    (0.6, {}),
    (1.6, {"left": (0.45, -0.2, 0.55, 0.2, 0.5, -0.3, 0.9)}),
    (0.8, {"left": (0.45, -0.2, 0.55, 0.2, 0.5, -0.3, _GRIPPER_CLOSED)}),
    (1.6, {"left": (-0.25, -0.55, 0.95, -0.1, 0.1, 0.4, _GRIPPER_CLOSED)}),
    (1.6, {"right": (0.3, -0.45, 0.85, 0.15, 0.2, -0.4, 0.9)}),
    (0.8, {"right": (0.3, -0.45, 0.85, 0.15, 0.2, -0.4, _GRIPPER_CLOSED)}),
    (0.8, {"left": (-0.25, -0.55, 0.95, -0.1, 0.1, 0.4, 0.9)}),
    (1.8, {"left": _HOME, "right": (-0.5, -0.1, 0.4, -0.2, 0.6, 0.3, _GRIPPER_CLOSED)}),
    (0.8, {"right": (-0.5, -0.1, 0.4, -0.2, 0.6, 0.3, 0.9)}),
    (1.6, {"right": _HOME}),
    (0.6, {}),
)


def handover_trajectory(num_frames: int) -> np.ndarray:
    """(T, 14) float32 ALOHA joint positions for the scripted hand-over, stretched over `num_frames`.

    Between key poses every joint follows a smooth step (zero velocity at both ends).
    """
    weights = np.array([w for w, _ in _HANDOVER])
    ends = np.round(np.cumsum(weights) / weights.sum() * num_frames).astype(int)
    poses = {"left": np.array(_HOME), "right": np.array(_HOME)}
    path = np.empty((num_frames, 14), dtype=np.float32)
    start = 0
    for end, (_, targets) in zip(ends, _HANDOVER):
        ramp = np.linspace(0.0, 1.0, max(end - start, 1), endpoint=False)[:, None]
        smooth = ramp * ramp * (3.0 - 2.0 * ramp)
        for column, arm in ((0, "left"), (7, "right")):
            target = np.array(targets.get(arm, poses[arm]))
            path[start:end, column : column + 7] = poses[arm] + smooth[: end - start] * (target - poses[arm])
            poses[arm] = target
        start = end
    return path


def draw_arm_markers(frames: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Draw one marker per arm into (T, H, W, 3) frames in place: position from waist and shoulder, a smaller
    marker while the gripper is closed (left arm white, right arm black)."""
    _, height, width, _ = frames.shape
    for column, value in ((0, 255), (7, 0)):
        waist, shoulder, gripper = state[:, column], state[:, column + 1], state[:, column + 6]
        centre_x = ((0.5 - 0.35 * np.sin(waist) + (0.18 if column else -0.18)) * width).astype(int)
        centre_y = ((0.75 - 0.45 * (shoulder + 0.9)) * height).astype(int)
        half = np.where(gripper > 0.5, max(3, height // 8), max(2, height // 16))
        for t in range(len(frames)):
            top, left = max(0, centre_y[t] - half[t]), max(0, centre_x[t] - half[t])
            frames[t, top : centre_y[t] + half[t], left : centre_x[t] + half[t]] = value
    return frames


def synthetic_episode(
    seconds: float = 2.0,
    fps: float = 50.0,
    cameras: tuple[str, ...] = ("cam_high", "cam_left_wrist"),
    height: int = 96,
    width: int = 128,
    dim: int = 14,
    task: str = "pick up the red cube",
    seed: int = 0,
    lead_frames: int = 3,
    motion: str = "sinusoids",
) -> Episode:
    """An Episode of `seconds * fps` frames; `actions[t]` equals `state[t + lead_frames]` (clamped at the end).

    `motion` is "sinusoids" (any `dim`) or "handover" (the scripted 14-joint ALOHA task, arm markers drawn).
    """
    num_frames = int(round(seconds * fps))
    if motion == "sinusoids":
        path = joint_trajectory(num_frames + lead_frames, dim, fps, seed)
    elif motion == "handover" and dim == 14:
        path = handover_trajectory(num_frames + lead_frames)
    else:
        raise ValueError(f"motion must be 'sinusoids' or 'handover' (14 joints), got {motion!r} with dim {dim}")
    state = path[:num_frames]
    actions = path[lead_frames : lead_frames + num_frames]
    velocity = np.gradient(state, 1.0 / fps, axis=0).astype(np.float32)
    images = {cam: moving_square_frames(num_frames, height, width, i, phase_offset=seed) for i, cam in enumerate(cameras)}
    if motion == "handover":
        for frames in images.values():
            draw_arm_markers(frames, state)
    return Episode(images=images, state=state, actions=actions, fps=fps, task=task,
                   joint_names=default_joint_names(dim), velocity=velocity)
