"""`velocity_watchdog`: zero a velocity group when its commands stop.

Parameters: `topics` (the groups' command topics, std_msgs/Float64MultiArray, e.g. `arm_controller/commands`),
`timeout_s` (default 0.5), `control_period_s` (the commander's control period, default 1 / 15 s; `timeout_s` must be
longer, else one start-up line and exit 1). Per topic, once no moving command has come for `timeout_s`, it publishes
one command of zeros as wide as the last one (`oxygen_ros/control/velocity_watchdog.py`). Run it beside the node
that commands the group, in a separate process, so a crash or a stall of the commander does not take it along.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below
    from oxygen_ros.nodes.entry import run

    sys.exit(run("velocity_watchdog"))

from collections.abc import Sequence

from rclpy.node import Node
from std_msgs.msg import Float64MultiArray

from oxygen_ros.control.velocity_watchdog import VelocityWatchdog, WatchdogError, check_timeout
from oxygen_ros.nodes.lifecycle import ros_process, spinning


class VelocityWatchdogNode(Node):
    def __init__(self, context=None):
        super().__init__("velocity_watchdog", context=context)
        topics = list(self.declare_parameter("topics", [""]).value)
        timeout_s = float(self.declare_parameter("timeout_s", 0.5).value)
        period_s = float(self.declare_parameter("control_period_s", 1 / 15).value)
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise WatchdogError(f"topics must list the velocity groups' command topics, got {topics}")
        check_timeout(timeout_s, period_s)
        self.watchdog = VelocityWatchdog(round(timeout_s * 1e9))
        self.pubs = {topic: self.create_publisher(Float64MultiArray, topic, 10) for topic in topics}
        for topic in topics:
            self.create_subscription(Float64MultiArray, topic, lambda msg, t=topic: self._heard(t, msg), 10)
        self.create_timer(min(period_s, timeout_s / 4), self._check)
        self.get_logger().info(f"zeroing {', '.join(topics)} after {timeout_s:g} s without a command")

    def _now(self) -> int:
        return self.get_clock().now().nanoseconds

    def _heard(self, topic: str, msg: Float64MultiArray) -> None:
        self.watchdog.command(topic, msg.data, self._now())

    def _check(self) -> None:
        for topic, width in self.watchdog.due(self._now()):
            self.pubs[topic].publish(Float64MultiArray(data=[0.0] * width))
            self.get_logger().warning(f"no command on {topic} for {self.watchdog.timeout_ns / 1e9:g} s: sent zeros")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with ros_process("velocity_watchdog", argv) as (context, stop):
        try:
            node = VelocityWatchdogNode(context=context)
        except (WatchdogError, ValueError, TypeError) as err:
            print(f"cannot start: {err}", file=sys.stderr)
            return 1
        with spinning(node, stop):
            stop.wait()
        return 0
