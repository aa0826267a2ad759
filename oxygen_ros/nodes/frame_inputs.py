"""The newest input of each kind, and the decision a control tick takes on them: act on a frame, or say why not.

Subscriptions call `on_image` / `on_joint_state` / `Instruction.set`, which only run cheap checks and keep the
newest message; images are decoded at the tick that first uses them (a camera faster than the control rate costs
no conversions it does not need). Rules, in the order a tick applies them:

- a message that fails its checks (encoding, size, corrupt compressed data, missing or non-finite joint) is
  dropped and counted by reason; the camera (or the state) keeps its last good value, so one bad message among
  good ones does not stop the robot, and the image age check below bounds how old a kept image can be;
- a camera that has never delivered a good image: no action, state `waiting_for_camera`;
- no good joint state yet: no action, `waiting_for_state`;
- the oldest of the cameras' newest images is older than `max_image_age_s` (node clock, so simulated time under
  `use_sim_time`, minus header stamp): the tick is skipped and counted (`stale_frame`);
- otherwise the tick acts on the newest image of every camera. An image already used by the previous tick is
  used again (the joint state is fresh, and a controller expects a chunk every period); such ticks are counted
  as `reused_frames`.
The frame's stamp and frame_id are those of the first camera's image.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from oxygen_ros.model.preprocess import normalized_state
from oxygen_ros.model.prompt import tokenize_prompt

from .conversions import (
    ConversionError,
    check_compressed,
    check_image,
    compressed_to_rgb,
    image_to_rgb,
    joint_positions,
    stamp_to_ns,
)

RUNNING = "running"
WAITING_FOR_CAMERA = "waiting_for_camera"
WAITING_FOR_STATE = "waiting_for_state"
STALE_FRAME = "stale_frame"
MODEL_ERROR = "model_error"


@dataclass
class Frame:
    images: dict[str, np.ndarray]  # model image key -> HxWx3 uint8 RGB
    state: np.ndarray
    stamp_ns: int
    frame_id: str
    reused: bool  # no camera delivered a new image since the previous frame


@dataclass
class _Camera:
    key: str
    compressed: bool
    pending: object = None  # newest message, not decoded yet
    image: np.ndarray | None = None  # newest good image
    stamp_ns: int = 0
    frame_id: str = ""
    fresh: bool = False  # decoded since the last frame used it


class FrameInputs:
    """Newest camera images and joint state; `next_frame` applies the rules in the module docstring."""

    def __init__(self, camera_keys: tuple[str, ...], compressed: tuple[bool, ...], state_names: tuple[str, ...],
                 max_image_age_s: float):
        self.cameras = [_Camera(key, c) for key, c in zip(camera_keys, compressed, strict=True)]
        self.state_names = state_names
        self.max_image_age_ns = round(max_image_age_s * 1e9)
        self.state: np.ndarray | None = None
        self.drops: Counter[str] = Counter()  # reason -> messages or ticks dropped
        self.reused_frames = 0

    @property
    def dropped_frames(self) -> int:
        return sum(self.drops.values())

    def on_image(self, index: int, msg) -> None:
        """Keep `msg` as camera `index`'s newest image; raises ConversionError (counted) if it fails the checks."""
        camera = self.cameras[index]
        try:
            check_compressed(msg) if camera.compressed else check_image(msg)
        except ConversionError as err:
            self.drops[err.reason] += 1
            raise
        camera.pending = msg

    def on_joint_state(self, msg) -> None:
        """Keep the state picked from `msg` by name; raises ConversionError (counted) if a joint is bad."""
        try:
            self.state = joint_positions(msg, self.state_names)
        except ConversionError as err:
            self.drops[err.reason] += 1
            raise

    def missing_cameras(self) -> list[str]:
        return [c.key for c in self.cameras if c.image is None and c.pending is None]

    def next_frame(self, now_ns: int) -> tuple[str, Frame | None, list[ConversionError]]:
        """(state, frame or None, decode errors of this tick); errors are already counted."""
        errors = self._decode_pending()
        if any(c.image is None for c in self.cameras):
            return WAITING_FOR_CAMERA, None, errors
        if self.state is None:
            return WAITING_FOR_STATE, None, errors
        oldest = min(c.stamp_ns for c in self.cameras)
        if self.max_image_age_ns and now_ns - oldest > self.max_image_age_ns:
            self.drops["stale_frame"] += 1
            return STALE_FRAME, None, errors
        reused = not any(c.fresh for c in self.cameras)
        self.reused_frames += reused
        for camera in self.cameras:
            camera.fresh = False
        first = self.cameras[0]
        frame = Frame(images={c.key: c.image for c in self.cameras}, state=self.state, stamp_ns=first.stamp_ns,
                      frame_id=first.frame_id, reused=reused)
        return RUNNING, frame, errors

    def _decode_pending(self) -> list[ConversionError]:
        errors = []
        for camera in self.cameras:
            msg, camera.pending = camera.pending, None
            if msg is None:
                continue
            try:
                camera.image = compressed_to_rgb(msg) if camera.compressed else image_to_rgb(msg)
            except ConversionError as err:
                self.drops[err.reason] += 1
                errors.append(err)
                continue
            camera.stamp_ns, camera.frame_id, camera.fresh = stamp_to_ns(msg.header.stamp), msg.header.frame_id, True
        return errors


class Instruction:
    """The task text: a default until a message arrives; empty ones ignored, long ones cut, both counted."""

    def __init__(self, default: str, max_chars: int):
        self.max_chars = max_chars
        self.text = default[:max_chars]
        self._received = self.text  # the last accepted text before any prompt fitting
        self.version = 0  # bumped on every accepted change (on_instruction_change narrates once per version)
        self.ignored = 0
        self.truncated = 0

    def set(self, text: str) -> str:
        """Apply a received instruction; returns "ignored", "truncated" or "accepted"."""
        text = text.strip()
        if not text:
            self.ignored += 1
            return "ignored"
        outcome = "accepted"
        if len(text) > self.max_chars:
            text = text[: self.max_chars]
            self.truncated += 1
            outcome = "truncated"
        if text != self._received:
            self.text = self._received = text
            self.version += 1
        return outcome

    def fit_prompt(self, tokenizer, state: np.ndarray, config, norm_stats) -> bool:
        """Drop words from the end of the text until the model's prompt fits max_token_len with this state.

        Returns False when the text already fits or no shortening helps (then the prompt error has another
        cause); on success the shorter text replaces the current one (same version: it is the same task).
        """
        try:
            normalized = normalized_state(state, config, norm_stats)
        except ValueError:
            return False  # the state itself is the problem, not the text

        def fits(text: str) -> bool:
            try:
                tokenize_prompt(tokenizer, text, normalized, config.max_token_len)
            except ValueError:
                return False
            return True

        words = self.text.split()
        if fits(self.text) or not fits(""):
            return False
        low, high = 0, len(words)  # words[:low] fits, words[:high] does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(" ".join(words[:middle])) else (low, middle)
        self.text = " ".join(words[:low])
        self.truncated += 1
        return True
