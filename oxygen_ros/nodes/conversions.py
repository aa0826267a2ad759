"""ROS messages <-> the numpy arrays the engine takes and returns; pure functions, no node state.

Every rejection raises `ConversionError` with a short `reason` code (counted per reason by the VLA node) and a
message that says what was wrong, so a bad camera driver or joint-state publisher is easy to find from the log.
"""

from __future__ import annotations

import numpy as np
from builtin_interfaces.msg import Duration, Time
from sensor_msgs.msg import CompressedImage, Image, JointState
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.data.jpeg import decode_image

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


def stamp_to_ns(stamp: Time) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def ns_to_stamp(ns: int) -> Time:
    sec, nanosec = divmod(int(ns), 1_000_000_000)
    return Time(sec=sec, nanosec=nanosec)


def check_image(msg: Image) -> None:
    """The cheap checks (encoding, sizes), done when a message arrives; raises ConversionError."""
    if msg.encoding not in _ENCODINGS:
        raise ConversionError("encoding", f"unsupported image encoding {msg.encoding!r}; "
                                          f"supported: {', '.join(IMAGE_ENCODINGS)}")
    channels = _ENCODINGS[msg.encoding][0]
    if msg.height == 0 or msg.width == 0:
        raise ConversionError("size", f"empty image ({msg.width}x{msg.height})")
    if msg.step < msg.width * channels:
        raise ConversionError("size", f"step {msg.step} is less than width {msg.width} x {channels} bytes")
    if len(msg.data) != msg.step * msg.height:
        raise ConversionError("size", f"image data has {len(msg.data)} bytes, step x height = "
                                      f"{msg.step} x {msg.height} = {msg.step * msg.height}")


def image_to_rgb(msg: Image) -> np.ndarray:
    """sensor_msgs/Image (rgb8, bgr8, rgba8, bgra8, mono8; any row padding) -> HxWx3 uint8 RGB."""
    check_image(msg)
    channels, order = _ENCODINGS[msg.encoding]
    rows = np.frombuffer(msg.data, dtype=np.uint8).reshape(msg.height, msg.step)
    pixels = rows[:, : msg.width * channels].reshape(msg.height, msg.width, channels)
    if order == (0, 1, 2) and channels == 3:
        return pixels
    return np.ascontiguousarray(pixels[:, :, list(order)])


def check_compressed(msg: CompressedImage) -> None:
    words = msg.format.lower().replace(";", " ").split()
    if not any(fmt in words or (fmt == "jpeg" and "jpg" in words) for fmt in COMPRESSED_FORMATS):
        raise ConversionError("encoding", f"unsupported compressed format {msg.format!r}; supported: jpeg, png")
    if len(msg.data) == 0:
        raise ConversionError("size", "compressed image has no data")


def compressed_to_rgb(msg: CompressedImage) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg or png) -> HxWx3 uint8 RGB; corrupt data raises ConversionError."""
    check_compressed(msg)
    try:
        return decode_image(bytes(msg.data))
    except ValueError as err:
        raise ConversionError("corrupt", str(err)) from err


def joint_positions(msg: JointState, names: list[str] | tuple[str, ...]) -> np.ndarray:
    """Positions of `names`, in that order, picked by name from a JointState (any order, extra joints ignored)."""
    if len(msg.position) != len(msg.name):
        raise ConversionError("joint_state", f"JointState has {len(msg.name)} names but "
                                             f"{len(msg.position)} positions")
    index = {name: i for i, name in enumerate(msg.name)}
    missing = [name for name in names if name not in index]
    if missing:
        raise ConversionError("missing_joint", f"JointState lacks joints {missing}")
    state = np.array([msg.position[index[name]] for name in names], dtype=np.float64)
    bad = [name for name, value in zip(names, state, strict=True) if not np.isfinite(value)]
    if bad:
        raise ConversionError("nan_joint", f"JointState has non-finite positions for {bad}")
    return state


def chunk_to_trajectory(actions: np.ndarray, joint_names: list[str] | tuple[str, ...], stamp_ns: int,
                        time_step_s: float, horizon: int) -> JointTrajectory:
    """The first `horizon` steps of an action chunk [H, D] -> JointTrajectory, point i at (i + 1) * time_step.

    header.stamp is the camera frame the chunk was computed from: a joint_trajectory_controller starts the
    trajectory at that time, so the chunk stays aligned with the observation that produced it.
    """
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 2 or actions.shape[1] != len(joint_names):
        raise ValueError(f"actions of shape {actions.shape} do not match {len(joint_names)} joint names")
    if not 1 <= horizon <= actions.shape[0]:
        raise ValueError(f"horizon must lie in [1, {actions.shape[0]}], got {horizon}")
    msg = JointTrajectory()
    msg.header.stamp = ns_to_stamp(stamp_ns)
    msg.joint_names = list(joint_names)
    step_ns = round(time_step_s * 1e9)
    for i in range(horizon):
        sec, nanosec = divmod((i + 1) * step_ns, 1_000_000_000)
        msg.points.append(JointTrajectoryPoint(positions=actions[i].tolist(),
                                               time_from_start=Duration(sec=sec, nanosec=nanosec)))
    return msg
