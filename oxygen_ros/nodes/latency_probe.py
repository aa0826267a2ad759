"""Drive a VLA node with synthetic sensors and measure it: image stamp -> action chunk receipt, and node overhead.

`python -m oxygen_ros.nodes.latency_probe --cameras camera/cam_high/image_raw ... --joints j1 j2 ... [--rate 30]
[--seconds 10] [--warmup 3]` publishes camera images (rgb8) and joint states with one shared stamp per frame
from a plain thread, receives `action_chunk`, and prints one JSON object: end-to-end latency (receipt on this
node's clock minus the chunk's header stamp, i.e. the image stamp) percentiles, chunk rate, and the node's own
split of a tick into engine time (`runtime.act`) and node overhead, read from its `/diagnostics`.
`oxygen_ros.evaluation.bench.node_latency` starts the node and this probe as processes and tabulates the results; the node
tests use `SensorPublisher` directly.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args
from sensor_msgs.msg import Image, JointState
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.engine.stats import percentile

from .conversions import ns_to_stamp


class SensorPublisher:
    """Camera images and joint states with a shared stamp per frame, on `node`'s publishers (relative topics)."""

    def __init__(self, node: Node, camera_topics: Sequence[str], joint_names: Sequence[str],
                 height: int = 48, width: int = 64, seed: int = 0):
        self.node = node
        self.joint_names = list(joint_names)
        self.image_pubs = [node.create_publisher(Image, t, qos_profile_sensor_data) for t in camera_topics]
        self.joint_pub = node.create_publisher(JointState, "joint_states", qos_profile_sensor_data)
        rng = np.random.default_rng(seed)
        self.images = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in camera_topics]
        self.stamps: list[int] = []  # every frame stamp published, in order
        self._lock = threading.Lock()

    def image_msg(self, index: int, stamp_ns: int) -> Image:
        pixels = self.images[index]
        msg = Image(height=pixels.shape[0], width=pixels.shape[1], encoding="rgb8", step=pixels.shape[1] * 3)
        msg.header.stamp = ns_to_stamp(stamp_ns)
        msg.header.frame_id = f"camera_{index}"
        msg.data = pixels.tobytes()
        return msg

    def joint_msg(self, stamp_ns: int, positions: Sequence[float] | None = None) -> JointState:
        msg = JointState(name=self.joint_names)
        msg.header.stamp = ns_to_stamp(stamp_ns)
        msg.position = [float(p) for p in (positions if positions is not None else
                                            np.linspace(-0.5, 0.5, len(self.joint_names)))]
        return msg

    def publish_frame(self, stamp_ns: int | None = None) -> int:
        """One image per camera and a joint state, stamped now (node clock) unless given; returns the stamp."""
        stamp_ns = self.node.get_clock().now().nanoseconds if stamp_ns is None else stamp_ns
        with self._lock:
            self.stamps.append(stamp_ns)
        for index, pub in enumerate(self.image_pubs):
            pub.publish(self.image_msg(index, stamp_ns))
        self.joint_pub.publish(self.joint_msg(stamp_ns))
        return stamp_ns

    def run(self, rate_hz: float, stop: threading.Event) -> None:
        """Publish frames at `rate_hz` until `stop` is set (call from a plain thread)."""
        next_time = time.monotonic()
        while not stop.is_set():
            self.publish_frame()
            next_time += 1.0 / rate_hz
            stop.wait(max(0.0, next_time - time.monotonic()))

    def start(self, rate_hz: float) -> tuple[threading.Thread, threading.Event]:
        stop = threading.Event()
        thread = threading.Thread(target=self.run, args=(rate_hz, stop), name="sensor-publisher", daemon=True)
        thread.start()
        return thread, stop


def measure(node: Node, sensors: SensorPublisher, rate_hz: float, seconds: float, warmup_s: float,
            first_chunk_timeout_s: float = 60.0) -> dict:
    """Publish for warm-up + `seconds`; returns latency and rate figures over the measured part."""
    chunks: list[tuple[int, int]] = []  # (receipt ns, header stamp ns)
    diagnostics: dict[str, str] = {}

    def on_chunk(msg: JointTrajectory) -> None:
        chunks.append((node.get_clock().now().nanoseconds, stamp_to_ns(msg.header.stamp)))

    def on_diagnostics(msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name.endswith("vla engine"):
                diagnostics.clear()
                diagnostics.update({kv.key: kv.value for kv in status.values})

    node.create_subscription(JointTrajectory, "action_chunk", on_chunk, 100)
    node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    executor = SingleThreadedExecutor(context=node.context)
    executor.add_node(node)
    spin = threading.Thread(target=executor.spin, name="probe-executor", daemon=True)
    spin.start()
    publisher, stop = sensors.start(rate_hz)
    try:
        deadline = time.monotonic() + first_chunk_timeout_s
        while not chunks and time.monotonic() < deadline:
            time.sleep(0.05)
        if not chunks:
            raise TimeoutError(f"no action_chunk within {first_chunk_timeout_s} s")
        time.sleep(warmup_s)
        begin = len(chunks)
        start = time.monotonic()
        time.sleep(seconds)
        measured = chunks[begin:]
        elapsed = time.monotonic() - start
        time.sleep(1.0)  # one more status period, so /diagnostics covers the measured window
        latencies = [receipt - stamp for receipt, stamp in measured]
        return {
            "chunks": len(measured),
            "chunk_rate_hz": len(measured) / elapsed,
            "e2e_ms_p50": percentile(latencies, 0.5) / 1e6,
            "e2e_ms_p99": percentile(latencies, 0.99) / 1e6,
            "e2e_ms_max": max(latencies) / 1e6 if latencies else 0.0,
            "node": dict(diagnostics),  # the node's last /diagnostics key-values
        }
    finally:
        stop.set()
        publisher.join()
        executor.shutdown()
        spin.join()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="latency_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", nargs="+", required=True, help="camera topics the node subscribes to")
    parser.add_argument("--joints", nargs="+", required=True, help="joint names of the published JointState")
    parser.add_argument("--rate", type=float, default=30.0, help="frames per second to publish")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured duration")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds after the first chunk not measured")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=640)
    args = parser.parse_args(remove_ros_args(argv))
    context = rclpy.Context()
    rclpy.init(args=["latency_probe", *argv], context=context, signal_handler_options=SignalHandlerOptions.NO)
    node = Node("latency_probe", context=context)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sensors = SensorPublisher(node, args.cameras, args.joints, args.height, args.width)
        result = measure(node, sensors, args.rate, args.seconds, args.warmup)
    except (TimeoutError, KeyboardInterrupt) as err:
        print(json.dumps({"error": repr(err)}))
        return 1
    finally:
        signal.signal(signal.SIGINT, previous)
        node.destroy_node()
        context.try_shutdown()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
