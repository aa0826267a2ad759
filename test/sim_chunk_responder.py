"""A stand-in policy for sim tests: answers every camera frame with an action chunk, over real DDS.

Chunk values are a known function of absolute sim step, `target(base, t)`, so a test can check from the recording
that the sim executed chunk[t - source_step] at every step t (any misalignment shifts the sinusoid); chunk[i] goes
out as the position for step source + i + 1, the VLA node's timing. The chunk
for the frame at step k is published when the frame of step k + delay arrives: an injected model delay of
`delay` control steps. Joint names go out reversed, to exercise the sim's by-name mapping. Runnable as a script
(`python sim_chunk_responder.py --ros-args -p delay_steps:=2`) so the demo can use it as its policy process;
there `mismatch:=0.03` adds a random per-chunk offset (rad) so successive chunks disagree as a real policy's do.
`bang:=5.0` instead commands every joint to +-5 rad on alternate steps: violent enough to make the physics diverge.
`plan:=FILE.npy` instead answers with rows of a [T, 14] array of joint targets indexed by absolute sim step (the
last row past its end): a known plan, e.g. a demonstration, replayed over DDS.
"""

import math
import signal
import sys
import threading

import numpy as np
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import Image, JointState
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.data.episode import ALOHA_JOINT_NAMES

DT = 0.02
STEP_NS = 20_000_000
AMPLITUDE, FREQUENCY_HZ = 0.2, 0.5
MOVING = (0, 7)  # the two waist joints swing; everything else holds its start position


def target(base: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Commanded joints at absolute sim steps `steps`: [len(steps), 14]."""
    out = np.repeat(np.asarray(base, dtype=np.float64)[None, :], len(steps), axis=0)
    swing = AMPLITUDE * np.sin(2 * math.pi * FREQUENCY_HZ * np.asarray(steps) * DT)
    for j in MOVING:
        out[:, j] += swing
    return out


class ChunkResponder(Node):
    def __init__(self, context=None, camera: str = "top", delay_steps: int = 2, horizon: int = 20,
                 send_malformed_first: bool = True, bang: float = 0.0):
        super().__init__("chunk_responder", context=context)
        self.camera = self.declare_parameter("camera", camera).value
        self.delay = self.declare_parameter("delay_steps", delay_steps).value
        self.horizon = self.declare_parameter("horizon", horizon).value
        self.mismatch = self.declare_parameter("mismatch", 0.0).value
        self.bang = self.declare_parameter("bang", float(bang)).value
        plan = self.declare_parameter("plan", "").value
        self.plan = np.load(plan) if plan else None
        self.rng = np.random.default_rng(0)
        self.send_malformed = send_malformed_first
        self.base: np.ndarray | None = None
        self.frames = 0
        self.published = 0
        self.pub = self.create_publisher(JointTrajectory, "action_chunk", QoSProfile(depth=10))
        self.create_subscription(JointState, "joint_states", self._on_joints, QoSProfile(depth=10))
        self.create_subscription(Image, f"camera/{self.camera}/image_raw", self._on_image, qos_profile_sensor_data)

    def _on_joints(self, msg: JointState) -> None:
        if self.base is None:
            by_name = dict(zip(msg.name, msg.position))
            self.base = np.array([by_name[j] for j in ALOHA_JOINT_NAMES])

    def _on_image(self, msg: Image) -> None:
        self.frames += 1
        step = (msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec) // STEP_NS
        source = step - self.delay
        if self.base is None or source < 0:
            return
        if self.send_malformed:
            self.send_malformed = False
            bad = JointTrajectory(joint_names=list(ALOHA_JOINT_NAMES[:7]))
            bad.points = [JointTrajectoryPoint(positions=[0.0] * 7)]
            self.pub.publish(bad)
        names = list(reversed(ALOHA_JOINT_NAMES))
        actions = target(self.base, np.arange(source, source + self.horizon))
        if self.mismatch:
            actions[:, list(MOVING)] += self.rng.normal(0.0, self.mismatch, len(MOVING))
        if self.plan is not None:
            actions = self.plan[np.minimum(np.arange(source, source + self.horizon), len(self.plan) - 1)]
        if self.bang:
            signs = np.where(np.arange(source, source + self.horizon) % 2 == 0, -1.0, 1.0)
            actions = np.repeat(self.bang * signs[:, None], 14, axis=1)
        actions = actions[:, ::-1]
        chunk = JointTrajectory(joint_names=names)
        chunk.header.stamp.sec, chunk.header.stamp.nanosec = divmod(source * STEP_NS, 1_000_000_000)
        for i, row in enumerate(actions):
            point = JointTrajectoryPoint(positions=row.tolist())
            point.time_from_start.sec, point.time_from_start.nanosec = divmod((i + 1) * STEP_NS, 1_000_000_000)
            chunk.points.append(point)
        self.pub.publish(chunk)
        self.published += 1


def main() -> int:
    stop = threading.Event()
    context = rclpy.Context()
    rclpy.init(args=sys.argv, context=context, signal_handler_options=SignalHandlerOptions.NO)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    node = ChunkResponder(context=context, send_malformed_first=False)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    stop.wait()
    executor.shutdown()
    spin.join()
    node.destroy_node()
    context.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
