"""The message type registry used for bags: ROS 2 kilted's standard types plus ours from `msg/*.msg`.

Bags written here must carry exact type names and definitions so that `ros2 bag` and other tools can read them,
and our Narration / EngineStatus messages need their definitions registered from the same .msg files the rosidl
build uses (no second copy). Those files sit in the source tree's `msg/` or, once installed, in
`share/oxygen_ros/msg/` under an ament prefix.
"""

from __future__ import annotations

import os
from pathlib import Path

from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

PACKAGE = "oxygen_ros"


def message_dirs() -> list[Path]:
    """Directories that may hold our .msg files, most specific first."""
    dirs = [Path(__file__).resolve().parents[2] / "msg"]
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if prefix:
            dirs.append(Path(prefix) / "share" / PACKAGE / "msg")
    return dirs


def custom_message_definitions() -> dict[str, str]:
    """Type name (`oxygen_ros/msg/Narration`) -> .msg text, from the first directory that has any."""
    for directory in message_dirs():
        files = sorted(directory.glob("*.msg"))
        if files:
            return {f"{PACKAGE}/msg/{f.stem}": f.read_text() for f in files}
    return {}


def bag_typestore() -> Typestore:
    """A fresh typestore: kilted standard types + our custom types (callers may register more)."""
    store = get_typestore(Stores.ROS2_KILTED)
    types = {}
    for name, text in custom_message_definitions().items():
        types.update(get_types_from_msg(text, name))
    store.register(types)
    return store
