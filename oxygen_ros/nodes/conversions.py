"""ROS messages <-> the numpy arrays the engine takes and returns; pure functions, no node state.

Every rejection raises `ConversionError` with a short `reason` code (counted per reason by the VLA node) and a
message that says what was wrong, so a bad camera driver or joint-state publisher is easy to find from the log.
Image sizes are checked against `ImageLimits` from the message fields (raw) or the JPEG/PNG header (compressed)
before any pixel is decoded, so a small message claiming a huge image costs nothing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from builtin_interfaces.msg import Duration, Time
from PIL.Image import DecompressionBombError, UnidentifiedImageError
from sensor_msgs.msg import CompressedImage, Image, JointState
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.control.trajectory_rules import ControllerSettings, TrajectoryPoint, refusal
from oxygen_ros.data.jpeg import decode_image
from oxygen_ros.data.stamps import split_ns, stamp_to_ns
from oxygen_ros.model.config import resized_shape

# encoding -> (channels, index of R, G, B within a pixel); mono8 is replicated to three channels.
_ENCODINGS = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "rgba8": (4, (0, 1, 2)),
    "bgra8": (4, (2, 1, 0)),
    "mono8": (1, (0, 0, 0)),
}
IMAGE_ENCODINGS = tuple(_ENCODINGS)
COMPRESSED_FORMATS = ("jpeg", "png")  # matched as words of the format string ("rgb8; jpeg compressed bgr8")


class ConversionError(ValueError):
    """A message that cannot be used; `reason` names the kind of fault for counters."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ImageLimits:
    max_pixels: int = 0  # width x height budget; 0: none
    model_size: int = 0  # the model's square input: images too thin to resize into it are refused; 0: no check
    crops: tuple = ()  # the model's `image_crops`: (image key, (top, left, bottom, right)) of the part it sees


def check_dimensions(width: int, height: int, limits: ImageLimits | None) -> None:
    """Empty, over-budget and too-thin images raise ConversionError ("size", "too_large", "aspect")."""
    if width == 0 or height == 0:
        raise ConversionError("size", f"empty image ({width}x{height})")
    if limits is None:
        return
    if limits.max_pixels and width * height > limits.max_pixels:
        raise ConversionError("too_large", f"{width}x{height} image has {width * height} pixels, over the "
                                           f"budget of {limits.max_pixels} (cameras.max_pixels)")
    if limits.model_size and 0 in resized_shape(height, width, limits.model_size):
        raise ConversionError("aspect", f"{width}x{height} image is too thin to resize into the model's "
                                        f"{limits.model_size}x{limits.model_size} input")


def ns_to_stamp(ns: int) -> Time:
    sec, nanosec = split_ns(ns)
    return Time(sec=sec, nanosec=nanosec)


def check_image(msg: Image, limits: ImageLimits | None = None) -> None:
    """The cheap checks (encoding, sizes), done when a message arrives; raises ConversionError."""
    if msg.encoding not in _ENCODINGS:
        raise ConversionError("encoding", f"unsupported image encoding {msg.encoding!r}; "
                                          f"supported: {', '.join(IMAGE_ENCODINGS)}")
    channels = _ENCODINGS[msg.encoding][0]
    check_dimensions(msg.width, msg.height, limits)
    if msg.step < msg.width * channels:
        raise ConversionError("size", f"step {msg.step} is less than width {msg.width} x {channels} bytes")
    if len(msg.data) != msg.step * msg.height:
        raise ConversionError("size", f"image data has {len(msg.data)} bytes, step x height = "
                                      f"{msg.step} x {msg.height} = {msg.step * msg.height}")


def image_to_rgb(msg: Image, limits: ImageLimits | None = None) -> np.ndarray:
    """sensor_msgs/Image (rgb8, bgr8, rgba8, bgra8, mono8; any row padding) -> HxWx3 uint8 RGB."""
    check_image(msg, limits)
    channels, order = _ENCODINGS[msg.encoding]
    rows = np.frombuffer(msg.data, dtype=np.uint8).reshape(msg.height, msg.step)
    pixels = rows[:, : msg.width * channels].reshape(msg.height, msg.width, channels)
    if order == (0, 1, 2) and channels == 3:
        return pixels
    return np.ascontiguousarray(pixels[:, :, list(order)])


def check_compressed(msg: CompressedImage, limits: ImageLimits | None = None) -> None:
    """Format, and the image size its JPEG/PNG header claims; raises ConversionError."""
    words = msg.format.lower().replace(";", " ").split()
    if not any(fmt in words or (fmt == "jpeg" and "jpg" in words) for fmt in COMPRESSED_FORMATS):
        raise ConversionError("encoding", f"unsupported compressed format {msg.format!r}; supported: jpeg, png")
    if len(msg.data) == 0:
        raise ConversionError("size", "compressed image has no data")
    check_dimensions(*header_size(bytes(msg.data[:_HEADER_SCAN_BYTES])), limits)


def compressed_to_rgb(msg: CompressedImage, limits: ImageLimits | None = None) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg or png) -> HxWx3 uint8 RGB; corrupt data raises ConversionError."""
    check_compressed(msg, limits)
    try:
        return decode_image(bytes(msg.data))
    except Exception as err:  # Pillow raises OSError, SyntaxError, ValueError, ... on malformed data
        cause = err.__cause__ or err  # decode_image wraps Pillow's error
        # Pillow's "cannot identify" text ends in the repr of its buffer object: leave it out.
        what = "Pillow cannot identify it" if isinstance(cause, UnidentifiedImageError) else \
            f"{type(cause).__name__}: {cause}"
        reason = "too_large" if isinstance(cause, DecompressionBombError) else "corrupt"  # Pillow's own limit
        raise ConversionError(reason, f"cannot decode {len(msg.data)} bytes of {msg.format!r}: {what}") from None


# A JPEG's frame header follows its tables (quantization, Huffman, EXIF/ICC may be large); PNG's IHDR is first.
_HEADER_SCAN_BYTES = 1 << 20
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic); C4, C8 and CC are other segments.
_JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset((0x01, *range(0xD0, 0xD8)))  # TEM, RSTn: no length field


def header_size(data: bytes) -> tuple[int, int]:
    """(width, height) that a JPEG's or PNG's header declares, read without decoding; raises ConversionError."""
    if data.startswith(_PNG_SIGNATURE):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ConversionError("corrupt", "PNG data without its IHDR header")
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if not data.startswith(b"\xff\xd8"):
        raise ConversionError("corrupt", "data is neither a JPEG nor a PNG image")
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise ConversionError("corrupt", f"JPEG data has no marker at byte {i}")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker in _JPEG_STANDALONE:
            i += 2
        elif marker in _JPEG_FRAME_MARKERS:
            if i + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return width, height
        elif marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header before them
            break
        else:
            i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    raise ConversionError("corrupt", "JPEG data without a frame header")


def joint_positions(msg: JointState, names: list[str] | tuple[str, ...]) -> np.ndarray:
    """Positions of `names`, in that order, picked by name from a JointState (any order, extra joints ignored)."""
    if len(msg.position) != len(msg.name):
        raise ConversionError("joint_state", f"JointState has {len(msg.name)} names but "
                                             f"{len(msg.position)} positions")
    index = {name: i for i, name in enumerate(msg.name)}
    if len(index) != len(msg.name):  # which of two values is the joint's? neither can be trusted
        twice = sorted({n for n in msg.name if msg.name.count(n) > 1})
        raise ConversionError("duplicate_joint", f"JointState names {twice} more than once")
    missing = [name for name in names if name not in index]
    if missing:
        raise ConversionError("missing_joint", f"JointState lacks joints {missing}")
    state = np.array([msg.position[index[name]] for name in names], dtype=np.float64)
    bad = [name for name, value in zip(names, state, strict=True) if not np.isfinite(value)]
    if bad:
        raise ConversionError("nan_joint", f"JointState has non-finite positions for {bad}")
    return state


def chunk_to_trajectory(actions: np.ndarray, joint_names: list[str] | tuple[str, ...], stamp_ns: int,
                        time_step_s: float, horizon: int, velocities: np.ndarray | None = None) -> JointTrajectory:
    """The first `horizon` steps of an action chunk [H, D] -> JointTrajectory, point i at (i + 1) * time_step, with
    each point's `velocities` when given (same shape), else none. The last point's velocities are 0: a
    joint_trajectory_controller with Jazzy's and Kilted's defaults refuses a whole trajectory that does not end at
    rest (`control.trajectory_rules`), and the arm stops at the plan's end unless the next plan replaces it.

    header.stamp is the camera frame the chunk was computed from: a joint_trajectory_controller starts the
    trajectory at that time, so the chunk stays aligned with the observation that produced it.
    """
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 2 or actions.shape[1] != len(joint_names):
        raise ValueError(f"actions of shape {actions.shape} do not match {len(joint_names)} joint names")
    if velocities is not None and np.shape(velocities) != actions.shape:
        raise ValueError(f"velocities of shape {np.shape(velocities)} do not match the positions' {actions.shape}")
    if not 1 <= horizon <= actions.shape[0]:
        raise ValueError(f"horizon must lie in [1, {actions.shape[0]}], got {horizon}")
    msg = JointTrajectory()
    msg.header.stamp = ns_to_stamp(stamp_ns)
    msg.joint_names = list(joint_names)
    step_ns = round(time_step_s * 1e9)
    if velocities is not None:
        velocities = np.array(velocities[:horizon], dtype=np.float64)
        velocities[-1] = 0.0
    for i in range(horizon):
        sec, nanosec = split_ns((i + 1) * step_ns)
        msg.points.append(JointTrajectoryPoint(
            positions=actions[i].tolist(), velocities=[] if velocities is None else np.asarray(velocities[i]).tolist(),
            time_from_start=Duration(sec=sec, nanosec=nanosec)))
    return msg


def trajectory_refusal(msg: JointTrajectory, settings: ControllerSettings, now_ns: int) -> str | None:
    """Why a joint_trajectory_controller with `settings` refuses `msg` arriving at `now_ns`, or None."""
    points = [TrajectoryPoint(stamp_to_ns(p.time_from_start), list(p.positions), list(p.velocities),
                              list(p.accelerations), list(p.effort)) for p in msg.points]
    return refusal(settings, list(msg.joint_names), points, stamp_to_ns(msg.header.stamp), now_ns)
