"""Record live topics to a rosbag2, e.g. what the VLA node produced while a replayed episode drove it.

`oxygen-ros record OUT_BAG --topics T [T ...] [--storage mcap|sqlite3]`

Subscriptions are raw (CDR bytes straight into the bag, no deserialization). Each topic is subscribed once it
has a publisher in the ROS graph, with its advertised type, best effort if any publisher is best effort (so cameras
on sensor-data QoS are heard), and transient local if all publishers are (so latched topics are caught). Each
publisher's offered QoS is stored in the bag (`offered_qos_profiles`, as rosbag2 does), so a replay republishes
latched topics latched and sensor streams best effort, as they were. The bag's type names and message
definitions come from the kilted standard set plus our msg/ files; a topic whose type is unknown there is
reported and skipped. Each time a topic's subscription matches a new publisher the node logs `hearing TOPIC
from N publisher(s)`: a reliable volatile publisher's messages are recorded from then on (what a publisher sends
before the recorder has matched it is not delivered, the DDS rule for volatile data). Log times are this node's
clock (ROS time, so with use_sim_time they are bag time). The bag is written under a temporary name and moved to OUT_BAG when closed on SIGINT/SIGTERM; an MCAP
bag's chunks carry their CRC-32 (`data/mcap_chunks.py`), so damage inside a chunk stops its reading.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("record_node"))

import argparse
import threading
from collections.abc import Sequence
from pathlib import Path

from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.utilities import remove_ros_args
from rosbags.rosbag2 import Writer

from oxygen_ros.command_line import CommandParser
from oxygen_ros.data.atomic import atomic_output
from oxygen_ros.data.episode import DataError
from oxygen_ros.data.episode_bag import STORAGES
from oxygen_ros.data.mcap_chunks import seal_chunks
from oxygen_ros.data.msgtypes import bag_typestore
from oxygen_ros.nodes.bag_qos import offered_profile
from oxygen_ros.nodes.lifecycle import ros_process, spin_until_stopped
from oxygen_ros.nodes.topic_types import TopicTypeError, message_class


class RecordNode(Node):
    """Subscribes to `topics` as they appear and writes every message to an open rosbags Writer."""

    def __init__(self, writer: Writer, topics: Sequence[str], context=None):
        super().__init__("record", context=context)
        self._writer = writer
        self._store = bag_typestore()
        self._pending = {self.resolve_topic_name(t): t for t in topics}
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self._discover_timer = self.create_timer(0.1, self._discover)

    @property
    def pending(self) -> list[str]:
        """Requested topics not yet published in the graph."""
        return sorted(self._pending)

    def _discover(self) -> None:
        advertised = dict(self.get_topic_names_and_types())
        for name in list(self._pending):
            if name not in advertised:
                continue
            publishers = self.get_publishers_info_by_topic(name)
            if not publishers:  # only subscribers so far: their QoS says nothing about what will be offered
                continue
            del self._pending[name]
            msgtype = advertised[name][0]
            try:
                if msgtype not in self._store.types:
                    raise TopicTypeError(f"message type {msgtype} has no definition for the bag; not recording")
                cls = message_class(msgtype, name)
            except TopicTypeError as err:
                self.get_logger().error(f"{name}: {err}")
                continue
            connection = self._writer.add_connection(
                name, msgtype, typestore=self._store,
                offered_qos_profiles=[offered_profile(p.qos_profile) for p in publishers])
            self.counts[name] = 0
            self.create_subscription(cls, name, lambda data, c=connection: self._write(c, data),
                                     self._qos_for(publishers), raw=True,
                                     event_callbacks=SubscriptionEventCallbacks(
                                         matched=lambda info, topic=name: self._matched(topic, info)))
            self.get_logger().info(f"recording {name} ({msgtype})")
        if not self._pending:
            self._discover_timer.cancel()

    @staticmethod
    def _qos_for(publishers) -> QoSProfile:
        """A subscription that matches every publisher (best effort if any offers it; latched if all do)."""
        best_effort = any(p.qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT for p in publishers)
        latched = all(p.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for p in publishers)
        return QoSProfile(
            depth=100,
            reliability=ReliabilityPolicy.BEST_EFFORT if best_effort else ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE,
        )

    def _matched(self, topic: str, info) -> None:
        if info.current_count_change > 0:
            self.get_logger().info(f"hearing {topic} from {info.current_count} publisher(s)")

    def _write(self, connection, data: bytes) -> None:
        with self._lock:
            self._writer.write(connection, self.get_clock().now().nanoseconds, data)
            self.counts[connection.topic] += 1


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("record", __doc__)
    parser.add_argument("out_bag", help="output rosbag2 folder (must not exist)")
    parser.add_argument("--topics", nargs="+", required=True, help="topics to record")
    parser.add_argument("--storage", choices=sorted(STORAGES), default="mcap", help="rosbag2 storage format")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(remove_ros_args(argv))
    with ros_process("record", argv) as (context, stop):
        try:
            with atomic_output(args.out_bag) as staging:
                with Writer(staging, version=9, storage_plugin=STORAGES[args.storage]) as writer:
                    node = RecordNode(writer, args.topics, context=context)
                    spin_until_stopped(node, stop)
                for mcap in Path(staging).glob("*.mcap"):  # rosbags leaves the chunk checksums unset
                    seal_chunks(mcap)
            print(f"wrote {args.out_bag}: {node.counts}; never seen: {node.pending}")
            return 0
        except DataError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1

