"""Episode -> rosbag2, so a recorded episode can be replayed to the VLA node as live sensor topics.

Topics (relative names, so a namespace or remap places them under a robot):
  camera/<cam>/image_raw              sensor_msgs/msg/Image, rgb8        (or, with compressed images,)
  camera/<cam>/image_raw/compressed   sensor_msgs/msg/CompressedImage, jpeg  (image_transport's naming)
  joint_states                        sensor_msgs/msg/JointState: position = state, velocity, effort if known
  instruction                         std_msgs/msg/String, once at the episode start (skipped if no task)
  episode/action                      sensor_msgs/msg/JointState: the recorded action, for evaluation only
Every header stamp is `base_time + episode time` and the bag's log time equals it, so replay timing and the
stamps the node sees agree.

Each topic carries the QoS a live robot would offer on it (`offered_qos_profiles` in metadata.yaml, which
`ros2 bag play` and `oxygen-ros replay` publish with): cameras the sensor-data profile (best effort, depth 5),
`instruction` reliable and transient local (latched: a node that subscribes late still gets the task),
`joint_states` and `episode/action` reliable.

An MCAP bag's chunks carry their CRC-32 (`mcap_chunks.seal_chunks`), so damage inside a chunk stops its reading.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import numpy as np
from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.rosbag2 import StoragePlugin, Writer

from ..command_line import progress
from .atomic import atomic_output
from .episode import DataError, Episode
from .jpeg import encode_jpeg
from .mcap_chunks import seal_chunks
from .msgtypes import bag_typestore
from .stamps import NS_PER_S, split_ns

DEFAULT_BASE_TIME_NS = 1_700_000_000 * NS_PER_S  # a fixed wall-clock-like epoch keeps outputs reproducible
MAX_STAMP_S = 2**31 - 1  # the largest builtin_interfaces/Time.sec (an int32)
STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
JOINT_STATES_TOPIC = "joint_states"
INSTRUCTION_TOPIC = "instruction"
ACTION_TOPIC = "episode/action"


def offered_qos(reliable: bool, latched: bool, depth: int) -> Qos:
    """A keep-last QoS profile in the form rosbag2 stores; deadline, lifespan and lease 0 mean "not set"."""
    unset = QosTime(sec=0, nsec=0)
    return Qos(
        history=QosHistory.KEEP_LAST, depth=depth,
        reliability=QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
        durability=QosDurability.TRANSIENT_LOCAL if latched else QosDurability.VOLATILE,
        deadline=unset, lifespan=unset, liveliness=QosLiveliness.AUTOMATIC, liveliness_lease_duration=unset,
        avoid_ros_namespace_conventions=False,
    )


SENSOR_QOS = offered_qos(reliable=False, latched=False, depth=5)  # what camera drivers offer (sensor data)
STATE_QOS = offered_qos(reliable=True, latched=False, depth=100)
LATCHED_QOS = offered_qos(reliable=True, latched=True, depth=1)


def base_time_seconds(text: str) -> float:
    """A `--base-time` argument (seconds since the epoch) checked to give ROS stamps; argparse reports a bad one."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_STAMP_S:  # also false for NaN
        raise argparse.ArgumentTypeError(f"must be seconds from 0 to {MAX_STAMP_S}, got {text!r}")
    return seconds


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
        sec, nanosec = split_ns(stamp_ns)
        return Header(stamp=Time(sec=sec, nanosec=nanosec), frame_id=frame_id)

    def joint_state(stamp_ns: int, position, velocity=None, effort=None):
        empty = np.zeros(0, dtype=np.float64)
        return types["sensor_msgs/msg/JointState"](
            header=header(stamp_ns), name=list(episode.joint_names[: len(position)]),
            position=np.asarray(position, np.float64),
            velocity=empty if velocity is None else np.asarray(velocity, np.float64),
            effort=empty if effort is None else np.asarray(effort, np.float64),
        )

    stamps = base_time_ns + np.round(episode.times() * 1e9).astype(np.int64)
    if stamps[0] < 0 or stamps[-1] // NS_PER_S > MAX_STAMP_S:
        raise DataError(f"stamps from {stamps[0] / 1e9:.3f} s to {stamps[-1] / 1e9:.3f} s do not fit a ROS time "
                        f"(0 to {MAX_STAMP_S} s); choose another base time")
    with atomic_output(out) as tmp:
        with Writer(tmp, version=9, storage_plugin=STORAGES[storage]) as writer:
            image_type = "sensor_msgs/msg/CompressedImage" if compressed_images else "sensor_msgs/msg/Image"
            cams = {cam: writer.add_connection(camera_topic(cam, compressed_images), image_type, typestore=store,
                                               offered_qos_profiles=[SENSOR_QOS])
                    for cam in episode.cameras}
            joints = writer.add_connection(JOINT_STATES_TOPIC, "sensor_msgs/msg/JointState", typestore=store,
                                           offered_qos_profiles=[STATE_QOS])
            actions = writer.add_connection(ACTION_TOPIC, "sensor_msgs/msg/JointState", typestore=store,
                                            offered_qos_profiles=[STATE_QOS])
            if episode.task:
                conn = writer.add_connection(INSTRUCTION_TOPIC, "std_msgs/msg/String", typestore=store,
                                             offered_qos_profiles=[LATCHED_QOS])
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
        for mcap in Path(tmp).glob("*.mcap"):  # rosbags leaves the chunk checksums unset
            seal_chunks(mcap)
    return Path(out)
