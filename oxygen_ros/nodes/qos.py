"""The QoS profiles the nodes share."""

from __future__ import annotations

from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

# Latched: a late subscriber still gets the last message (instructions, one-off topics of a bag).
LATCHED_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
# Sensor data (best effort: hears best-effort and reliable publishers) with a history of one: only the newest image
# or joint state matters, so a busy executor never works through a backlog of older frames.
SENSOR_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT, durability=DurabilityPolicy.VOLATILE)
