"""A synthetic robot of a fleet: sends camera frames to a fleet node and measures, on its own clock, how long each
frame's action chunk takes to come back.

In its namespace (``-r __ns:=/robot1``) it publishes ``camera/<cam>/image_raw`` (rgb8, or
``.../image_raw/compressed`` JPEG with ``compressed``) for each of ``cameras``, ``joint_states`` (``joint_names``)
with the same stamp, and ``instruction`` (latched), at ``rate_hz`` from ``phase_s`` with each frame up to ``jitter``
of a period late (`evaluation.fleet.robot_load.FrameSchedule`), and listens to ``action_chunk`` and ``engine_status``. A
frame's stamp is the system clock when it is sent, minus ``backdate_s`` (a camera or link that delivers old frames);
a chunk's latency is its receipt on the system clock minus its header stamp (the frame's), on time within
``slo_ms``; a frame with no chunk is a miss.

Frames are sent once the fleet node subscribes to every camera. The first chunk back, or ``ready_after_s`` of
sending without one (an overloaded server), writes ``ready_path`` (if given); frames sent from ``warmup_s`` after
that count in the summary. On SIGINT/SIGTERM, or after ``duration_s``
(0: until stopped), it stops sending, listens ``grace_s`` more for chunks of frames already sent, and writes
``summary_path`` (JSON): its score (`robot_load.score`), the last ``engine_status`` it heard, and every frame as
[sent, stamp, received or null] (ns), so a benchmark can score any window of the run. ``oxygen-ros
fleet-dds-bench`` starts many of these against one fleet node.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("robot_client"))

import io
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.time import Time
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.evaluation.fleet.robot_load import FrameLedger, FrameSchedule, score
from oxygen_ros.msg import EngineStatus

from .lifecycle import ros_process, spinning
from .qos import LATCHED_QOS, SENSOR_QOS

NODE_NAME = "robot_client"
DEFAULTS = {
    "cameras": ["base_0_rgb", "left_wrist_0_rgb"],  # the tiny preset's
    "joint_names": [f"joint{i}" for i in range(14)],  # an ALOHA-sized state
    "image_size": 224,
    "compressed": False,
    "rate_hz": 10.0,
    "phase_s": 0.0,
    "jitter": 0.2,
    "seed": 0,
    "slo_ms": 200.0,
    "backdate_s": 0.0,
    "instruction": "do the task",
    "warmup_s": 2.0,
    "ready_after_s": 10.0,
    "duration_s": 0.0,
    "grace_s": 1.0,
    "ready_path": "",
    "summary_path": "",
}
STATUS_FIELDS = ("state", "actions_published", "deadline_misses", "dropped_frames")


def jpeg_bytes(pixels: np.ndarray) -> bytes:
    from PIL import Image as PILImage

    buffer = io.BytesIO()
    PILImage.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


class RobotClient(Node):
    def __init__(self, context=None):
        super().__init__(NODE_NAME, context=context)
        p = {name: self.declare_parameter(name, value).value for name, value in DEFAULTS.items()}
        if not p["cameras"] or p["image_size"] <= 0 or p["slo_ms"] <= 0 or p["backdate_s"] < 0:
            raise ValueError("need at least one camera, a positive image_size and slo_ms, and backdate_s >= 0")
        self.params = p
        self.slo_s = p["slo_ms"] / 1e3
        self.ledger = FrameLedger()
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.measure_from_ns: int | None = None
        self.status: dict = {}
        rng = np.random.default_rng(p["seed"])
        size = p["image_size"]
        self.image_msgs = []
        self.image_pubs = []
        for camera in p["cameras"]:
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            topic = f"camera/{camera}/image_raw"
            if p["compressed"]:
                msg = CompressedImage(format="jpeg", data=jpeg_bytes(pixels))
                self.image_pubs.append(self.create_publisher(CompressedImage, f"{topic}/compressed", SENSOR_QOS))
            else:
                msg = Image(height=size, width=size, encoding="rgb8", step=size * 3, data=pixels.tobytes())
                self.image_pubs.append(self.create_publisher(Image, topic, SENSOR_QOS))
            msg.header.frame_id = camera
            self.image_msgs.append(msg)
        self.joint_msg = JointState(name=list(p["joint_names"]),
                                    position=[0.0] * len(p["joint_names"]))
        self.joint_pub = self.create_publisher(JointState, "joint_states", SENSOR_QOS)
        self.instruction_pub = self.create_publisher(String, "instruction", LATCHED_QOS)
        self.chunk_sub = self.create_subscription(JointTrajectory, "action_chunk", self._on_chunk, QoSProfile(depth=50))
        self.create_subscription(EngineStatus, "engine_status", self._on_status, 10)

    def _on_chunk(self, msg: JointTrajectory) -> None:
        received_ns = time.time_ns()
        with self.lock:
            self.ledger.received(Time.from_msg(msg.header.stamp).nanoseconds, received_ns)
        self._mark_ready(received_ns, "first chunk")

    def _mark_ready(self, now_ns: int, reason: str) -> None:
        """Measure from `warmup_s` after now; say so in `ready_path` (once: the first chunk or `ready_after_s`)."""
        with self.lock:
            if self.ready.is_set():
                return
            self.measure_from_ns = now_ns + round(self.params["warmup_s"] * 1e9)
            self.ready.set()
        if self.params["ready_path"]:
            Path(self.params["ready_path"]).write_text(f"{now_ns} {reason}\n")

    def _on_status(self, msg: EngineStatus) -> None:
        self.status = {name: getattr(msg, name) for name in STATUS_FIELDS}

    def matched(self) -> bool:
        return (all(pub.get_subscription_count() > 0 for pub in self.image_pubs)
                and self.count_publishers(self.chunk_sub.topic_name) > 0)

    def publish_frame(self, stamp_ns: int) -> None:
        """Joint state and the other cameras first, the first camera last: its image is what makes the frame."""
        stamp = Time(nanoseconds=stamp_ns).to_msg()
        self.joint_msg.header.stamp = stamp
        self.joint_pub.publish(self.joint_msg)
        for msg, pub in [*zip(self.image_msgs[1:], self.image_pubs[1:]), (self.image_msgs[0], self.image_pubs[0])]:
            msg.header.stamp = stamp
            pub.publish(msg)

    def run(self, stop: threading.Event) -> None:
        """Wait for the fleet node, then send frames until `stop` or `duration_s`; then listen `grace_s` more."""
        p = self.params
        while not self.matched():
            if stop.wait(0.05):
                return
        if p["instruction"]:
            self.instruction_pub.publish(String(data=p["instruction"]))
        matched_ns, ready_after_ns = time.time_ns(), round(p["ready_after_s"] * 1e9)
        schedule = FrameSchedule(p["rate_hz"], matched_ns, p["phase_s"], p["jitter"], p["seed"])
        end_ns = time.time_ns() + round(p["duration_s"] * 1e9) if p["duration_s"] > 0 else None
        backdate_ns = round(p["backdate_s"] * 1e9)
        while not stop.is_set():
            send_ns = schedule.next_ns()
            if end_ns is not None and send_ns >= end_ns:
                break
            if stop.wait(max(0.0, (send_ns - time.time_ns()) / 1e9)):
                break
            sent_ns = time.time_ns()
            stamp_ns = sent_ns - backdate_ns
            with self.lock:
                self.ledger.sent(sent_ns, stamp_ns)
            self.publish_frame(stamp_ns)
            if sent_ns - matched_ns > ready_after_ns:
                self._mark_ready(sent_ns, f"no chunk {p['ready_after_s']:g} s after the fleet node subscribed")
        time.sleep(p["grace_s"])

    def summary(self) -> dict:
        with self.lock:
            rows = self.ledger.rows()
            frames = list(self.ledger.frames)
            unknown, duplicate = self.ledger.unknown_chunks, self.ledger.duplicate_chunks
        measured = score(frames, self.slo_s, self.measure_from_ns) if self.measure_from_ns is not None else None
        return {"robot": self.get_namespace(), "slo_ms": self.params["slo_ms"], "rate_hz": self.params["rate_hz"],
                "backdate_s": self.params["backdate_s"], "ready": self.ready.is_set(),
                "measure_from_ns": self.measure_from_ns,
                "score": measured.summary() if measured is not None else None,
                "unknown_chunks": unknown, "duplicate_chunks": duplicate, "engine_status": self.status,
                "frames": rows}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with ros_process(NODE_NAME, argv) as (context, stop):
        try:
            node = RobotClient(context=context)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        with spinning(node, stop) as spinner:
            node.run(stop)
            summary = node.summary()
            if node.params["summary_path"]:  # before shutting down: the measurement is kept whatever happens then
                Path(node.params["summary_path"]).write_text(json.dumps(summary) + "\n")
        scored = summary["score"]
        node_line = (f"{summary['robot']}: {len(summary['frames'])} frames sent, "
                     + (f"attainment {scored['attainment']:.3f} over {scored['frames']} measured, latency p50 "
                        f"{scored['latency_ms_p50']:.1f} ms p99 {scored['latency_ms_p99']:.1f} ms"
                        if scored else "no chunk received"))
        print(node_line, flush=True)
        if spinner.failure is not None:
            print(f"error: robot client failed: {spinner.failure!r}", file=sys.stderr)
            return 1
        return 0
