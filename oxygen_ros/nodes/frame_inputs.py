"""The newest input of each kind, and the decision a control tick takes on them: act on a frame, or say why not.

Subscriptions call `on_image` / `on_joint_state` / `Instruction.set`, which only run cheap checks (an image's size
comes from its message fields or its JPEG/PNG header) and keep the newest message. Images are decoded by
`decode_pending`, which the VLA node runs on a thread of its own (`DecodeThread`), so a tick only ever uses images
already decoded and a costly one (a large JPEG within the pixel budget) delays the next image of its camera, never
the control path; one message per camera waits at most, so a camera faster than the decoder costs no conversions
it does not need. Rules, in the order a tick applies them:

- a message that fails its checks or its decoding (encoding, size, over the pixel budget, too thin for the model's
  input, corrupt compressed data, missing, duplicated or non-finite joint, a joint state that moved faster than
  its velocity limit allows: `implausible_state`) is dropped and counted by reason;
  whatever the decoder raises is such a drop, never an error of the tick. The camera (or the state) keeps its last
  good value, so one bad message among good ones does not stop the robot; the age checks below bound how old a
  kept value can be;
- a message stamped before the newest one kept from its source arrived out of order: dropped and counted
  (`out_of_order`), so the frames a tick acts on never go back in time. (Unless the kept one is stamped more than
  `future_tolerance_s` ahead of the node clock: then the clock went back, a bag looping or a simulator reset, and
  the older stamp belongs to the timeline now in force.)
- a camera that has never delivered a good image: no action, state `waiting_for_camera`;
- no good joint state yet: no action, `waiting_for_state`;
- an image or the joint state stamped more than `future_tolerance_s` ahead of the node clock: the tick is skipped
  and counted (`future_frame` / `future_state`), state `future_frame` (a clock or stamping fault: such a frame
  would otherwise pass the age checks for as long as its stamp stays ahead);
- the oldest of the cameras' newest images is older than `max_image_age_s` (node clock, so simulated time under
  `use_sim_time`, minus header stamp): skipped and counted (`stale_frame`), state `stale_frame`;
- the newest good joint state is older than `max_state_age_s` (same clock rule): skipped and counted
  (`stale_state`), state `stale_state`; a robot whose every state message is rejected ends here too;
- otherwise the tick acts on the newest image of every camera. An image already used by the previous tick is
  used again (the joint state is fresh, and a controller expects a chunk every period); such ticks are counted
  as `reused_frames`.
The frame's stamp and frame_id are those of the first camera's image.

`forget(since_ns)` starts an episode (the node's `~/reset`): every kept input and the state check's last plausible
state are dropped, so the next tick waits for new ones, and a message stamped at or before `since_ns` (taken before
the reset: the previous episode's, still on its way) is dropped and counted (`before_reset`).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.model.preprocess import resize_with_pad
from oxygen_ros.robots.state_check import StateCheck
from oxygen_ros.robots.state_units import StateUnits, identity

from .conversions import (
    ConversionError,
    ImageLimits,
    check_compressed,
    check_image,
    compressed_to_rgb,
    image_to_rgb,
    joint_positions,
)

RUNNING = "running"
WAITING_FOR_CAMERA = "waiting_for_camera"
WAITING_FOR_STATE = "waiting_for_state"
FUTURE_FRAME = "future_frame"
STALE_FRAME = "stale_frame"
STALE_STATE = "stale_state"
MODEL_ERROR = "model_error"
SKIPPED_TICK_STATES = (FUTURE_FRAME, STALE_FRAME, STALE_STATE)  # ticks counted as drops (logged), not waits
JOINT_STATES = "joint_states"  # the source name of joint-state drops
DECODER_NICE = 10  # added to the decoder thread's niceness: the control path comes first


@dataclass(frozen=True)
class InputLimits:
    """How old, how far ahead and how large inputs may be; 0 turns a check off."""

    max_image_age_s: float = 0.0
    max_state_age_s: float = 0.0
    future_tolerance_s: float = 0.0
    images: ImageLimits = ImageLimits()


@dataclass
class InputFrame:
    images: dict[str, np.ndarray | Tensor]  # model image key -> HxWx3 uint8 RGB, or the model's input made of it
    # (`resize_with_pad`'s [3, size, size], when the limits give the model's size)
    state: np.ndarray
    stamp_ns: int
    frame_id: str
    reused: bool  # no camera delivered a new image since the previous frame


@dataclass
class Dropped:
    """A message refused while decoding: where it came from, the counter it went to, and why in words."""

    source: str  # topic
    reason: str
    message: str


@dataclass
class Decision:
    state: str
    frame: InputFrame | None
    detail: str = ""  # why not, in words (empty when acting)
    dropped: list[Dropped] = field(default_factory=list)  # decode failures of this tick, already counted


@dataclass
class _Camera:
    topic: str
    key: str
    compressed: bool
    pending: object = None  # newest message, not decoded yet
    newest_ns: int | None = None  # stamp of the newest message kept (pending or decoded)
    image: np.ndarray | None = None  # newest good image
    stamp_ns: int = 0
    frame_id: str = ""
    fresh: bool = False  # decoded since the last frame used it


def _age(now_ns: int, stamp_ns: int) -> str:
    return f"{(now_ns - stamp_ns) / 1e9:.3f} s"


class FrameInputs:
    """Newest camera images and joint state; `next_frame` applies the rules in the module docstring."""

    def __init__(self, camera_topics: tuple[str, ...], camera_keys: tuple[str, ...], compressed: tuple[bool, ...],
                 state_names: tuple[str, ...], limits: InputLimits, state_check: StateCheck | None = None,
                 units: StateUnits | None = None):
        """`state_check`: drops a joint state that moved faster than the velocity limits allow (`implausible_state`,
        `oxygen_ros.robots.state_check`); `units`: each state joint's name on the topic and its conversion into the
        command's units (`oxygen_ros.robots.state_units`; default: the same names, as measured)."""
        self.state_check = state_check
        self.cameras = [_Camera(topic, key, c) for topic, key, c in
                        zip(camera_topics, camera_keys, compressed, strict=True)]
        self.state_names = state_names
        self.units = units or identity(state_names)
        self.limits = limits
        self.state: np.ndarray | None = None
        self.state_stamp_ns = 0
        self.states_rejected = 0  # joint-state messages rejected since the last good one
        self.drops: Counter[str] = Counter()  # reason -> messages or ticks dropped
        self.reused_frames = 0
        self.image_age_ns: int | None = None  # at the last tick: node clock - oldest of the newest image stamps
        self.state_age_ns: int | None = None  # at the last tick: node clock - newest good joint state stamp
        self._lock = threading.RLock()  # the cameras and drops: the decoder's thread and the tick's
        self._decode_drops: dict[tuple[str, str], Dropped] = {}  # the last per (topic, reason) since the last tick
        self.since_ns: int | None = None  # after `forget`: messages stamped at or before it are dropped

    @property
    def dropped_frames(self) -> int:
        return sum(self.drop_counts().values())

    def drop_counts(self) -> dict[str, int]:
        """reason -> messages or ticks dropped, a copy (the decoder's thread adds to them)."""
        with self._lock:
            return dict(self.drops)

    def _count(self, err: ConversionError) -> ConversionError:
        with self._lock:
            self.drops[err.reason] += 1
        return err

    def _out_of_order(self, newest_ns: int | None, stamp_ns: int, now_ns: int) -> ConversionError | None:
        if newest_ns is None or stamp_ns >= newest_ns or newest_ns - now_ns > round(
                self.limits.future_tolerance_s * 1e9):
            return None
        return self._count(ConversionError("out_of_order", f"stamped {(newest_ns - stamp_ns) / 1e9:.3f} s before "
                                                           "the newest message kept from this source"))

    def _before_reset(self, stamp_ns: int) -> ConversionError | None:
        if self.since_ns is None or stamp_ns > self.since_ns or not stamp_ns:  # unstamped: cannot be dated
            return None
        return self._count(ConversionError("before_reset", f"stamped {(self.since_ns - stamp_ns) / 1e9:.3f} s "
                                                           "before the last reset (the previous episode's)"))

    def forget(self, since_ns: int) -> None:
        """A new episode: no input kept, messages stamped at or before `since_ns` dropped (`before_reset`)."""
        with self._lock:
            self.since_ns = since_ns
            for camera in self.cameras:
                camera.pending, camera.newest_ns, camera.image, camera.fresh = None, None, None, False
            self.state, self.state_stamp_ns, self.states_rejected = None, 0, 0
            if self.state_check is not None:  # the robot may start the episode anywhere
                self.state_check.last = None
            self.image_age_ns = self.state_age_ns = None

    def on_image(self, index: int, msg, now_ns: int) -> None:
        """Keep `msg` as camera `index`'s newest image, to be decoded; raises ConversionError (counted) if it fails
        the checks or is older than the newest kept (`now_ns`: the node clock)."""
        camera = self.cameras[index]
        try:
            check_compressed(msg, self.limits.images) if camera.compressed else check_image(msg, self.limits.images)
        except ConversionError as err:
            raise self._count(err) from None
        stamp_ns = stamp_to_ns(msg.header.stamp)
        with self._lock:
            if (err := self._before_reset(stamp_ns) or self._out_of_order(camera.newest_ns, stamp_ns, now_ns)) \
                    is not None:
                raise err
            camera.pending, camera.newest_ns = msg, stamp_ns

    def on_joint_state(self, msg, now_ns: int) -> None:
        """Keep the state picked from `msg` by name; raises ConversionError (counted) if a joint is bad or the
        message is older than the newest good one."""
        stamp_ns = stamp_to_ns(msg.header.stamp)
        newest = self.state_stamp_ns if self.state is not None else None
        if (err := self._before_reset(stamp_ns)) is not None:
            raise err
        try:
            if (err := self._out_of_order(newest, stamp_ns, now_ns)) is not None:
                raise err
            state = self.units.to_state(joint_positions(msg, self.units.topic_names))
            if self.state_check is not None and (why := self.state_check.check(state, stamp_ns, now_ns)):
                raise ConversionError("implausible_state", why)
            self.state = state
        except ConversionError as err:
            if err.reason != "out_of_order":
                self.states_rejected += 1
                self._count(err)
            raise err from None
        self.state_stamp_ns, self.states_rejected = stamp_ns, 0

    def decode_pending(self) -> None:
        """Decode every camera's pending message (off the control path: `DecodeThread`); a failure is counted and
        reported by the next `next_frame`."""
        for camera in self.cameras:
            with self._lock:
                msg, camera.pending = camera.pending, None
            if msg is None:
                continue
            try:
                image = compressed_to_rgb(msg, self.limits.images) if camera.compressed else \
                    image_to_rgb(msg, self.limits.images)
                if self.limits.images.model_size:  # the model's input, made here rather than in the tick
                    image = resize_with_pad(image, self.limits.images.model_size,
                                            dict(self.limits.images.crops).get(camera.key))
            except ConversionError as err:
                with self._lock:
                    self._count(err)
                    self._decode_drops[(camera.topic, err.reason)] = Dropped(camera.topic, err.reason, str(err))
                continue
            with self._lock:
                if self._before_reset(stamp_to_ns(msg.header.stamp)) is not None:  # decoded across a reset
                    continue
                camera.image = image
                camera.stamp_ns, camera.frame_id, camera.fresh = stamp_to_ns(msg.header.stamp), \
                    msg.header.frame_id, True

    def next_frame(self, now_ns: int) -> Decision:
        with self._lock:
            return self._next_frame(now_ns)

    def _next_frame(self, now_ns: int) -> Decision:
        dropped, self._decode_drops = list(self._decode_drops.values()), {}
        waiting = [c.topic for c in self.cameras if c.image is None]
        if waiting:
            self.image_age_ns = None
            return Decision(WAITING_FOR_CAMERA, None, "no image yet from " + ", ".join(waiting), dropped)
        oldest = min(self.cameras, key=lambda c: c.stamp_ns)
        self.image_age_ns = now_ns - oldest.stamp_ns
        if self.state is None:
            return Decision(WAITING_FOR_STATE, None, self._state_detail("no good joint state yet"), dropped)
        self.state_age_ns = now_ns - self.state_stamp_ns
        limits = self.limits
        tolerance_ns = round(limits.future_tolerance_s * 1e9)
        if tolerance_ns:
            newest = max(self.cameras, key=lambda c: c.stamp_ns)
            if newest.stamp_ns - now_ns > tolerance_ns:
                self.drops["future_frame"] += 1
                return Decision(FUTURE_FRAME, None, f"image from {newest.topic} is stamped "
                                f"{_age(newest.stamp_ns, now_ns)} ahead of the node clock", dropped)
            if self.state_stamp_ns - now_ns > tolerance_ns:
                self.drops["future_state"] += 1
                return Decision(FUTURE_FRAME, None, f"joint state is stamped {_age(self.state_stamp_ns, now_ns)} "
                                "ahead of the node clock", dropped)
        if limits.max_image_age_s and self.image_age_ns > round(limits.max_image_age_s * 1e9):
            self.drops["stale_frame"] += 1
            return Decision(STALE_FRAME, None, f"newest image from {oldest.topic} is "
                            f"{_age(now_ns, oldest.stamp_ns)} old", dropped)
        if limits.max_state_age_s and self.state_age_ns > round(limits.max_state_age_s * 1e9):
            self.drops["stale_state"] += 1
            unstamped = " (its header.stamp is zero)" if not self.state_stamp_ns else ""
            return Decision(STALE_STATE, None, self._state_detail(
                f"newest good joint state is {_age(now_ns, self.state_stamp_ns)} old{unstamped}"), dropped)
        reused = not any(c.fresh for c in self.cameras)
        self.reused_frames += reused
        for camera in self.cameras:
            camera.fresh = False
        first = self.cameras[0]
        frame = InputFrame(images={c.key: c.image for c in self.cameras}, state=self.state, stamp_ns=first.stamp_ns,
                      frame_id=first.frame_id, reused=reused)
        return Decision(RUNNING, frame, "", dropped)

    def _state_detail(self, what: str) -> str:
        if self.states_rejected:
            return f"{what}; the last {self.states_rejected} joint-state messages were rejected"
        return what



class DecodeThread:
    """Runs `FrameInputs.decode_pending` on a thread of its own whenever `wake` is called (after `on_image` kept a
    message): the control tick never decodes. Pillow releases the interpreter lock while it decodes, and the thread
    runs at a lower scheduling priority (Linux nice 10, per thread; the threads it starts inherit it), so a costly
    image (a JPEG claiming the whole pixel budget) takes the cores the control path leaves, not the control
    path's. With the model's size in the limits it also resizes each image to the model's input here, so the tick
    never pays for a large one. (Its torch thread count is left alone: setting it would also set the process's
    default, which the control path's thread reads when it starts.)"""

    def __init__(self, inputs: FrameInputs):
        self.inputs = inputs
        self._wake = threading.Event()
        self._stop = False
        self.thread = threading.Thread(target=self._run, name="oxygen-decode", daemon=True)
        self.thread.start()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        try:  # a Linux thread is a task of its own: this lowers only the decoder's priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), DECODER_NICE)
        except (AttributeError, OSError):  # no per-thread priorities here: the decoder runs at the node's
            pass
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            self.inputs.decode_pending()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self.thread.join(timeout=10)

