"""Episode formats (ALOHA HDF5, LeRobot v3), synthetic episodes and rosbag2 I/O, with no ROS runtime needed.

Everything converts through `Episode`; bags are written and read with the pure-Python `rosbags` library so
this layer runs (and is tested) without rclpy.
"""

from .aloha import read_aloha, write_aloha
from .bag import (
    IncompleteBagError,
    RawMessage,
    TopicInfo,
    UnknownMessageTypeError,
    bag_problem,
    bag_topics,
    iter_raw,
    read_messages,
    typestore_for,
)
from .episode import ALOHA_JOINT_NAMES, DataError, Episode
from .episode_bag import camera_topic, write_episode_bag
from .lerobot import read_lerobot, write_lerobot
from .synthetic import synthetic_episode

__all__ = [
    "ALOHA_JOINT_NAMES", "DataError", "Episode", "IncompleteBagError", "RawMessage", "TopicInfo",
    "UnknownMessageTypeError", "bag_problem", "bag_topics", "camera_topic", "iter_raw", "read_aloha", "read_lerobot",
    "read_messages", "synthetic_episode", "typestore_for", "write_aloha", "write_episode_bag", "write_lerobot",
]
