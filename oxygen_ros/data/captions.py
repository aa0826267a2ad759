"""Short per-frame captions derived from an ALOHA episode's recorded actions: which arm moves, in which phase.

The caption of frame t describes the commanded motion over the next `window` frames: for each arm, its gripper
closing or opening, else its arm joints moving (`moves` with the gripper open, `carries` with it closed), joined
with "and"; "the arms hold still" when nothing moves. Thresholds are fractions of each joint's range over the
episode, so any ALOHA-layout episode gets captions, and the same function labels training data and scores the
narration a policy produces.

`object_captions` adds where the scene's object is (a simulator's `environment_state`) to each frame's caption, in
whole centimetres of the world frame: text a policy's language side learns to say from the images, as pi0.5
co-trains its vision-language model on locating objects.
"""

from __future__ import annotations

import numpy as np

ARMS = (("left", 0), ("right", 7))  # ALOHA action layout: per arm 6 joints then the gripper
STILL = "the arms hold still"


def _ranges(actions: np.ndarray) -> np.ndarray:
    return np.maximum(np.quantile(actions, 0.99, axis=0) - np.quantile(actions, 0.01, axis=0), 1e-6)


def frame_captions(actions: np.ndarray, window: int = 12, moving: float = 0.04) -> list[str]:
    """One caption per frame of `actions` (T, 14); a joint `moving` when it travels more than that fraction of its
    episode range within the window."""
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 2 or actions.shape[1] != 14:
        raise ValueError(f"captions need ALOHA's 14 action joints, got actions of shape {actions.shape}")
    ranges = _ranges(actions)
    low, high = np.quantile(actions, 0.01, axis=0), np.quantile(actions, 0.99, axis=0)
    captions = []
    for t in range(len(actions)):
        span = actions[t : t + window + 1]
        travel = (span.max(axis=0) - span.min(axis=0)) / ranges
        phrases = []
        for arm, first in ARMS:
            gripper = first + 6
            if travel[gripper] > moving:
                closing = span[-1, gripper] < span[0, gripper]
                phrases.append(f"{arm} gripper {'closes' if closing else 'opens'}")
            elif travel[first:gripper].max() > moving:
                holding = actions[t, gripper] < (low[gripper] + high[gripper]) / 2
                phrases.append(f"{arm} arm {'carries' if holding else 'moves'}")
        captions.append(" and ".join(phrases) if phrases else STILL)
    return captions


def object_captions(captions: list[str], environment_state: np.ndarray) -> list[str]:
    """Each caption followed by the object's position, the first three numbers of its frame's `environment_state`
    (metres, world frame) rounded to whole centimetres: "..., object at x 11 y 54 z 2"."""
    state = np.asarray(environment_state, dtype=np.float64)
    if state.ndim != 2 or state.shape[1] < 3 or len(state) != len(captions):
        raise ValueError(f"object captions need one environment state of at least x, y, z per caption; got shape "
                         f"{state.shape} for {len(captions)} captions")
    centimetres = np.floor(state[:, :3] * 100.0 + 0.5).astype(int)
    return [f"{caption}, object at x {x} y {y} z {z}" for caption, (x, y, z) in zip(captions, centimetres)]
