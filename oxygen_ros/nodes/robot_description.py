"""The robot's URDF from the `robot_description` topic, as robot_state_publisher publishes it (latched:
transient local, reliable, one message), when the node's `robot_description` parameter is empty: the joint limits'
source for a robot whose URDF is not a file at hand (`docs/safety.md`)."""

from __future__ import annotations

from rclpy.wait_for_message import wait_for_message
from std_msgs.msg import String

from .parameters import ParameterError
from .qos import LATCHED_QOS

TOPIC = "robot_description"


def description_from_topic(node, timeout_s: float, topic: str = TOPIC) -> str:
    """The URDF text on `topic` (by default `robot_description`, relative: the node's namespace; a fleet robot's
    is in its own namespace); ParameterError, one line, when none arrives within `timeout_s` or it is empty."""
    received, msg = wait_for_message(String, node, topic, qos_profile=LATCHED_QOS, time_to_wait=timeout_s)
    if not received or not msg.data.strip():
        topic = node.resolve_topic_name(topic)
        raise ParameterError(f"robot_description_wait_s: no robot_description on {topic} within {timeout_s:g} s "
                             f"(is robot_state_publisher running in this namespace?)")
    return msg.data
