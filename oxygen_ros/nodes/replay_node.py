"""Replay a rosbag2 onto live topics with the bag's timing, so the VLA node can be evaluated on recorded episodes.

`oxygen-ros replay BAG [--rate R] [--loop] [--clock] [--topics T ...] [--wait-for T ...]
[--wait-for-subscribers T ...] [--delay S] [--ack-timeout S] [--allow-partial] [--schedule-report FILE]`

Messages are republished as the raw CDR bytes stored in the bag (never deserialized), each at
`start + ceil((log_time - first_log_time) / rate)` nanoseconds on the monotonic clock, never before; one plain
thread does the scheduling because publishing from outside the executor is safe and a timer per message would add
executor latency. Each topic is published with the QoS its publishers offered when it was recorded
(`offered_qos_profiles`, see `bag_qos`), so a latched topic such as `instruction` stays transient local. A bag
recorded without QoS gets a fallback: camera-like types sensor-data QoS (best effort), topics with a single message
latched, everything else reliable. `--clock` publishes rosgraph_msgs/Clock on /clock with the bag time, for nodes
running with use_sim_time. At the end the replay waits (up to `--ack-timeout` seconds) until every reliable
subscriber has acknowledged what was published (/clock's last value too), so a process that exits right after its
last message does not take that message's delivery with it.
`--schedule-report FILE` writes the replay's own record of when it published each message and /clock value
(`data/replay_schedule.py`) and logs how late the messages went out.

Before anything is published the whole bag is read once and counted against its metadata: a damaged or
truncated bag is refused (exit 1) unless `--allow-partial` is given, which replays what is readable with a
warning.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("replay_node"))

import argparse
import math
import os
import threading
import time
from collections.abc import Sequence

from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.utilities import remove_ros_args

from oxygen_ros.command_line import CommandParser
from oxygen_ros.data.bag import TopicInfo, bag_problem, bag_topics, iter_raw
from oxygen_ros.data.episode import DataError
from oxygen_ros.data.replay_schedule import ScheduleRecord
from oxygen_ros.nodes.bag_qos import replay_profile
from oxygen_ros.nodes.conversions import ns_to_stamp
from oxygen_ros.nodes.lifecycle import ros_process, spinning
from oxygen_ros.nodes.qos import LATCHED_QOS
from oxygen_ros.nodes.topic_types import TopicTypeError, is_sensor_stream, message_class


def select_topics(bag: str, topics: Sequence[str] | None) -> list[tuple[TopicInfo, type]]:
    """The bag's topics to replay with their rclpy classes; missing topics or unknown types raise with names."""
    available = {t.name: t for t in bag_topics(bag)}
    if topics:
        missing = [t for t in topics if t not in available]
        if missing:
            raise DataError(f"{bag}: requested topics not in bag: {missing} (bag has {sorted(available)})")
        chosen = [available[t] for t in topics]
    else:
        chosen = list(available.values())
    if not chosen:
        raise DataError(f"{bag}: bag has no topics")
    return [(info, message_class(info.msgtype, info.name)) for info in chosen]


def qos_for(info: TopicInfo) -> QoSProfile:
    """The recorded publishers' QoS when the bag has it, else a guess from the type and message count."""
    if info.qos:
        return replay_profile(info.qos)
    if is_sensor_stream(info.msgtype):
        return qos_profile_sensor_data
    if info.count == 1:
        return LATCHED_QOS
    return QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)


class ReplayNode(Node):
    """Publishers for a bag's topics plus the playback loop (`play`), run from the caller's thread."""

    def __init__(self, bag: str, rate: float = 1.0, loop: bool = False, clock: bool = False,
                 topics: Sequence[str] | None = None, clock_hz: float = 100.0,
                 wait_for: Sequence[str] = (), wait_for_subscribers: Sequence[str] = (),
                 allow_partial: bool = False, record_schedule: bool = False, context=None):
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        selected = select_topics(bag, topics)
        unknown = [t for t in wait_for if t not in {info.name for info, _ in selected}]
        if unknown:
            raise DataError(f"--wait-for topics are not being replayed: {unknown}")
        problem = bag_problem(bag, [info.name for info, _ in selected])
        if problem is not None and not allow_partial:
            raise DataError(f"{problem}; --allow-partial replays what is readable")
        self.wait_for = list(wait_for)
        self.wait_for_subscribers = list(wait_for_subscribers)
        clock_class = message_class("rosgraph_msgs/msg/Clock", "/clock") if clock else None
        super().__init__("replay", context=context)
        self.bag, self.rate, self.loop = bag, rate, loop
        self.topics = [info.name for info, _ in selected]
        self._topic_publishers = {info.name: self.create_publisher(cls, info.name, qos_for(info)) for info, cls in selected}
        self._clock_class = clock_class
        self._clock_pub = self.create_publisher(clock_class, "/clock", QoSProfile(depth=1)) if clock else None
        self._clock_period_ns = max(1, round(1e9 / clock_hz))
        self.published = 0
        self.schedule = ScheduleRecord() if record_schedule else None
        self.incomplete = problem  # a one-line integrity problem, if the bag has one
        if problem is not None:
            self.get_logger().warning(f"replaying a partial bag: {problem}")

    def _on_incomplete(self, problem: str) -> None:
        if problem != self.incomplete:  # the bag changed since it was checked
            self.incomplete = problem
            self.get_logger().error(problem)

    def wait_until_heard(self, stop: threading.Event) -> bool:
        """Block until each `wait_for` topic has a subscriber matched to this replay (e.g. the node under test is
        up) and each `wait_for_subscribers` topic one anywhere in the graph (e.g. a recorder of that node's
        outputs, which subscribes only once the node advertises them); False if stopped first."""
        while not (all(self._topic_publishers[t].get_subscription_count() > 0 for t in self.wait_for)
                   and all(self.count_subscribers(t) > 0 for t in self.wait_for_subscribers)):
            if stop.wait(0.05):
                return False
        return True

    def _publish_clock(self, bag_ns: int, loop: int, due_ns: int | None, at_ns: int) -> None:
        msg = self._clock_class()
        msg.clock = ns_to_stamp(bag_ns)
        if self.schedule is not None:
            self.schedule.add(loop, "/clock", bag_ns, due_ns, at_ns)
        self._clock_pub.publish(msg)

    def _wait_until(self, due_ns: int, bag_start_ns: int, zero_ns: int, loop: int, stop: threading.Event) -> int | None:
        """Sleep until monotonic `due_ns`, publishing /clock on its period meanwhile (bag time from the elapsed
        monotonic time); the monotonic time it woke at, None if stopped."""
        next_clock = time.monotonic_ns()
        while True:
            now = time.monotonic_ns()
            if now >= due_ns:
                return None if stop.is_set() else now
            if self._clock_pub is not None and now >= next_clock:
                self._publish_clock(bag_start_ns + int((now - zero_ns) * self.rate), loop, None, now)
                next_clock = now + self._clock_period_ns
            wake = min(due_ns, next_clock) if self._clock_pub is not None else due_ns
            if stop.wait(max(0, wake - now) / 1e9):
                return None

    def play(self, stop: threading.Event) -> int:
        """Publish the bag (repeatedly with loop) until done or `stop` is set; returns messages published."""
        loop = 0
        while not stop.is_set():
            first_ns = zero_ns = None
            for raw in iter_raw(self.bag, self.topics, on_incomplete=self._on_incomplete):
                if first_ns is None:  # time zero is the first message, not the (slower) opening of the bag
                    first_ns, zero_ns = raw.log_time_ns, time.monotonic_ns()
                    if self.schedule is not None:
                        self.schedule.start(zero_ns)
                due = zero_ns + math.ceil((raw.log_time_ns - first_ns) / self.rate)
                now = self._wait_until(due, first_ns, zero_ns, loop, stop)
                if now is None:
                    return self.published
                if self._clock_pub is not None:
                    self._publish_clock(raw.log_time_ns, loop, due, now)
                if self.schedule is not None:
                    self.schedule.add(loop, raw.topic, raw.log_time_ns, due, now)
                self._topic_publishers[raw.topic].publish(raw.data)
                self.published += 1
            if not self.loop:
                break
            loop += 1
        return self.published

    def wait_for_delivery(self, timeout: float) -> bool:
        """Block until every matched reliable subscriber has acknowledged all messages published, /clock's last
        value included (best-effort publishers count as delivered), or `timeout` seconds have passed in all; False
        (with a warning naming the topics) if some were not acknowledged in time."""
        deadline = time.monotonic() + timeout
        publishers = dict(self._topic_publishers)
        if self._clock_pub is not None:
            publishers["/clock"] = self._clock_pub
        late = []
        for topic, publisher in publishers.items():
            left = max(0.0, deadline - time.monotonic())
            if not publisher.wait_for_all_acked(Duration(nanoseconds=int(left * 1e9))):
                late.append(topic)
        if late:
            self.get_logger().warning(f"not acknowledged by every subscriber within {timeout:g} s: {late}")
        return not late


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("replay", __doc__)
    parser.add_argument("bag", help="rosbag2 folder (MCAP or sqlite3)")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor (2 = twice as fast)")
    parser.add_argument("--loop", action="store_true", help="start over at the end")
    parser.add_argument("--clock", action="store_true", help="publish /clock with the bag time")
    parser.add_argument("--clock-hz", type=float, default=100.0, help="/clock rate between messages")
    parser.add_argument("--topics", nargs="+", default=None, help="only these topics (default: all)")
    parser.add_argument("--wait-for", nargs="+", default=[], metavar="TOPIC",
                        help="start only once these replayed topics have subscribers")
    parser.add_argument("--wait-for-subscribers", nargs="+", default=[], metavar="TOPIC",
                        help="start only once these topics (not replayed) have a subscriber in the ROS graph, e.g. "
                        "the node's outputs a recorder subscribes to")
    parser.add_argument("--delay", type=float, default=0.5,
                        help="seconds to wait (after --wait-for) so subscribers finish matching")
    parser.add_argument("--ack-timeout", type=float, default=2.0,
                        help="seconds to wait at the end for reliable subscribers to acknowledge every message")
    parser.add_argument("--allow-partial", action="store_true",
                        help="replay a damaged bag's readable messages (warning) instead of refusing it")
    parser.add_argument("--schedule-report", default=None, metavar="FILE",
                        help="write when each message and /clock value was published (JSON, monotonic ns from the "
                        "first message) and log how late the messages went out")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(remove_ros_args(argv))
    if not (0 < args.rate < math.inf and 0 < args.clock_hz < math.inf):  # NaN fails too
        print("error: --rate and --clock-hz must be positive finite numbers", file=sys.stderr)
        return 1
    if not 0 <= args.ack_timeout < math.inf:
        print("error: --ack-timeout must be a finite number of seconds, 0 or more", file=sys.stderr)
        return 1
    if args.schedule_report is not None and os.path.lexists(args.schedule_report):
        print(f"error: {args.schedule_report}: output already exists; refusing to overwrite", file=sys.stderr)
        return 1
    with ros_process("replay", argv) as (context, stop):
        try:
            node = ReplayNode(args.bag, rate=args.rate, loop=args.loop, clock=args.clock, topics=args.topics,
                              clock_hz=args.clock_hz, wait_for=args.wait_for,
                              wait_for_subscribers=args.wait_for_subscribers, allow_partial=args.allow_partial,
                              record_schedule=args.schedule_report is not None, context=context)
        except (DataError, TopicTypeError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        with spinning(node):
            node.get_logger().info(f"replaying {args.bag}: {node.topics} at rate {args.rate}")
            if node.wait_until_heard(stop) and not stop.wait(args.delay):
                node.play(stop)
                if not stop.is_set():
                    node.wait_for_delivery(args.ack_timeout)
            node.get_logger().info(f"published {node.published} messages")
            if node.schedule is not None:
                node.schedule.write(args.schedule_report, args.bag, args.rate)
                node.get_logger().info(f"{node.schedule.summary_line()} (report: {args.schedule_report})")
        return 1 if node.incomplete is not None and not args.allow_partial else 0

