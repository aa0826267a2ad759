"""Episode -> rosbag2, so a recorded episode can be replayed to the VLA node as live sensor topics.

Topics (relative names, so a namespace or remap places them under a robot):
  camera/<cam>/image_raw              sensor_msgs/msg/Image, rgb8        (or, with compressed images,)
  camera/<cam>/image_raw/compressed   sensor_msgs/msg/CompressedImage, jpeg  (image_transport's naming)
  joint_states                        sensor_msgs/msg/JointState: position = state, velocity, effort if known
  instruction                         std_msgs/msg/String, once at the episode start (skipped if no task)
  episode/action                      sensor_msgs/msg/JointState: the recorded action, for evaluation only
Every header stamp is `base_time + episode time` and the bag's log time equals it, so replay timing and the
stamps the node sees agree.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from rosbags.rosbag2 import StoragePlugin, Writer

from ..command_line import progress
from .atomic import atomic_output
from .episode import Episode
from .jpeg import encode_jpeg
from .msgtypes import bag_typestore

DEFAULT_BASE_TIME_NS = 1_700_000_000 * 1_000_000_000  # a fixed wall-clock-like epoch keeps outputs reproducible
STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
JOINT_STATES_TOPIC = "joint_states"
INSTRUCTION_TOPIC = "instruction"
ACTION_TOPIC = "episode/action"


def camera_topic(camera: str, compressed: bool = False) -> str:
    return f"camera/{camera}/image_raw" + ("/compressed" if compressed else "")


def write_episode_bag(
    episode: Episode,
    out: str | os.PathLike,
    storage: str = "mcap",
    compressed_images: bool = False,
    base_time_ns: int = DEFAULT_BASE_TIME_NS,
) -> Path:
    """Write `episode` as a rosbag2 (version 9) directory at `out`; it appears only when complete."""
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {sorted(STORAGES)}, got {storage!r}")
    store = bag_typestore()
    types = store.types
    Time, Header = types["builtin_interfaces/msg/Time"], types["std_msgs/msg/Header"]

    def header(stamp_ns: int, frame_id: str = ""):
        return Header(stamp=Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id=frame_id)

    def joint_state(stamp_ns: int, position, velocity=None, effort=None):
        empty = np.zeros(0, dtype=np.float64)
        return types["sensor_msgs/msg/JointState"](
            header=header(stamp_ns), name=list(episode.joint_names[: len(position)]),
            position=np.asarray(position, np.float64),
            velocity=empty if velocity is None else np.asarray(velocity, np.float64),
            effort=empty if effort is None else np.asarray(effort, np.float64),
        )

    stamps = base_time_ns + np.round(episode.times() * 1e9).astype(np.int64)
    with atomic_output(out) as tmp, Writer(tmp, version=9, storage_plugin=STORAGES[storage]) as writer:
        image_type = "sensor_msgs/msg/CompressedImage" if compressed_images else "sensor_msgs/msg/Image"
        cams = {cam: writer.add_connection(camera_topic(cam, compressed_images), image_type, typestore=store)
                for cam in episode.cameras}
        joints = writer.add_connection(JOINT_STATES_TOPIC, "sensor_msgs/msg/JointState", typestore=store)
        actions = writer.add_connection(ACTION_TOPIC, "sensor_msgs/msg/JointState", typestore=store)
        if episode.task:
            conn = writer.add_connection(INSTRUCTION_TOPIC, "std_msgs/msg/String", typestore=store)
            message = types["std_msgs/msg/String"](data=episode.task)
            writer.write(conn, int(stamps[0]), store.serialize_cdr(message, "std_msgs/msg/String"))
        for t, stamp in enumerate(progress(stamps.tolist(), desc="frames")):
            for cam, conn in cams.items():
                frame = episode.images[cam][t]
                if compressed_images:
                    msg = types[image_type](header=header(stamp, cam), format="jpeg",
                                            data=np.frombuffer(encode_jpeg(frame, 90), dtype=np.uint8))
                else:
                    h, w = frame.shape[:2]
                    msg = types[image_type](header=header(stamp, cam), height=h, width=w, encoding="rgb8",
                                            is_bigendian=0, step=w * 3, data=frame.reshape(-1))
                writer.write(conn, stamp, store.serialize_cdr(msg, image_type))
            velocity = None if episode.velocity is None else episode.velocity[t]
            effort = None if episode.effort is None else episode.effort[t]
            msg = joint_state(stamp, episode.state[t], velocity, effort)
            writer.write(joints, stamp, store.serialize_cdr(msg, "sensor_msgs/msg/JointState"))
            msg = joint_state(stamp, episode.actions[t])
            writer.write(actions, stamp, store.serialize_cdr(msg, "sensor_msgs/msg/JointState"))
    return Path(out)
