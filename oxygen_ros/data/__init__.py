"""Episode formats (ALOHA HDF5, LeRobot v3), synthetic episodes and rosbag2 I/O, with no ROS runtime needed.

Everything converts through `Episode`; bags are written and read with the pure-Python `rosbags` library so
this layer runs (and is tested) without rclpy. The names below are imported from their modules on first use, so a
process that reads bags (a replay node) does not load what LeRobot's format needs (pyarrow, PyAV).
"""

import importlib

_MODULES = {
    "aloha": ("read_aloha", "write_aloha"),
    "bag": ("IncompleteBagError", "RawMessage", "TopicInfo", "UnknownMessageTypeError", "bag_problem", "bag_topics",
            "iter_raw", "read_messages", "typestore_for"),
    "episode": ("ALOHA_JOINT_NAMES", "DataError", "Episode"),
    "episode_bag": ("camera_topic", "write_episode_bag"),
    "lerobot": ("read_lerobot", "write_lerobot"),
    "synthetic": ("synthetic_episode",),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
