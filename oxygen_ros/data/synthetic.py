"""Small synthetic episodes with real structure, for tests and the demo (no data set can be downloaded).

Each camera shows a coloured square moving over a gradient background, so frame order, camera identity and
lossy-codec damage are all visible in the pixels; joints follow smooth sinusoids and the actions lead the state
by a few frames, as a teleoperated leader arm leads its follower.
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
) -> Episode:
    """An Episode of `seconds * fps` frames; `actions[t]` equals `state[t + lead_frames]` (clamped at the end)."""
    num_frames = int(round(seconds * fps))
    path = joint_trajectory(num_frames + lead_frames, dim, fps, seed)
    state = path[:num_frames]
    actions = path[lead_frames : lead_frames + num_frames]
    velocity = np.gradient(state, 1.0 / fps, axis=0).astype(np.float32)
    images = {cam: moving_square_frames(num_frames, height, width, i, phase_offset=seed) for i, cam in enumerate(cameras)}
    return Episode(images=images, state=state, actions=actions, fps=fps, task=task,
                   joint_names=default_joint_names(dim), velocity=velocity)
