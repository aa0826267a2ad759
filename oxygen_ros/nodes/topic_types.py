"""Map bag type names (`pkg/msg/Name`) to the rclpy message classes that create publishers and subscriptions.

rclpy needs the generated Python class of a type even to move raw CDR bytes, so a type whose package is not
built and sourced cannot be replayed or recorded; the error says which type and topic.
"""

from __future__ import annotations

import importlib


class TopicTypeError(RuntimeError):
    """A topic's message type has no rclpy class in this environment."""


def message_class(msgtype: str, topic: str = ""):
    """The rclpy class for `pkg/msg/Name`, or TopicTypeError naming the type (and topic)."""
    parts = msgtype.split("/")
    where = f" (topic {topic!r})" if topic else ""
    if len(parts) != 3 or parts[1] != "msg":
        raise TopicTypeError(f"unsupported message type name {msgtype!r}{where}")
    try:
        return getattr(importlib.import_module(f"{parts[0]}.msg"), parts[2])
    except (ImportError, AttributeError) as err:
        raise TopicTypeError(
            f"message type {msgtype}{where} is unknown to rclpy here: build and source the package "
            f"that defines it ({err})"
        ) from err


def is_sensor_stream(msgtype: str) -> bool:
    """High-rate sensor types get the sensor-data QoS (best effort), as camera drivers publish them."""
    return msgtype in {
        "sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage", "sensor_msgs/msg/PointCloud2",
        "sensor_msgs/msg/LaserScan", "sensor_msgs/msg/Imu", "sensor_msgs/msg/CameraInfo",
    }
