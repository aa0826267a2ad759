"""ROS time stamps <-> integer nanoseconds, without ROS.

A stamp is anything with integer `sec` and `nanosec` fields: a `builtin_interfaces` Time or Duration, whether built by
rclpy or read from a bag. Building a ROS message from nanoseconds is the ROS layer's (`nodes.conversions.ns_to_stamp`).
"""

from __future__ import annotations

NS_PER_S = 1_000_000_000


def stamp_to_ns(stamp) -> int:
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


def split_ns(ns: int) -> tuple[int, int]:
    """(sec, nanosec) of a stamp `ns` nanoseconds from zero, nanosec in [0, 1e9)."""
    return divmod(int(ns), NS_PER_S)
