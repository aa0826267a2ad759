"""Fleet server node: one process serving many robots, by namespace, from co-located models on one device.

For each robot namespace ``ns`` in ``robots`` (with its model in the parallel ``robot_models``), the node
subscribes ``/<ns>/camera/<cam>/image_raw`` (sensor_msgs/Image, sensor-data QoS) for every camera of the
robot's model, ``/<ns>/joint_states`` and ``/<ns>/instruction`` (std_msgs/String, transient local), and
publishes ``/<ns>/action_chunk`` (trajectory_msgs/JointTrajectory, header stamp = the source frame's stamp).

Every image on the first camera of a robot's model makes one request (with the latest image of the other cameras,
the latest joint state and instruction), which enters that model's queue. Requests of robots that use the same
model are batched together; the device scheduler (lockstep Robion by default, or monolithic) runs on its own
thread with the real stage runner. Requests past their SLO are dropped, not answered late.

Several GPUs: run one node per GPU with the same ``assignment_file`` (from ``oxygen-ros fleet-assign`` or the
traffic controller) and its own ``gpu_index``; each node serves exactly the robots assigned to its GPU. The
robots need nothing else: their topics are the same whichever node serves them.

Parameters: ``models`` (served model specs ``id=source[:seed]``), ``robots``, ``robot_models``, ``slo_ms``,
``assignment_file``, ``gpu_index``, ``device``, ``cpu_threads``, ``profile`` (LUT JSON; empty: profile the
models at start-up), ``design`` (robion | monolithic), ``max_batch``, ``tokenizer`` (SentencePiece model file;
empty: a stand-in trained at start-up), ``instruction`` (used until one arrives), ``action_dt`` (seconds between
chunk points), ``rate_hz`` (nominal robot rate).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("fleet_node"))

import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.fleet.assign_cli import load_assignment
from oxygen_ros.fleet.executor import FleetExecutor
from oxygen_ros.fleet.model_runner import ModelRunner, ModelSpec
from oxygen_ros.fleet.profile_cli import profile_runner
from oxygen_ros.fleet.profile_table import ProfileTable
from oxygen_ros.fleet.requests import FleetRequest, RobotSpec
from oxygen_ros.fleet.simulator import SimConfig, make_device
from oxygen_ros.model.preprocess import Observation, prepare_inputs, robot_actions
from oxygen_ros.model.tokenizer import load_tokenizer, train_tokenizer
from oxygen_ros.nodes.conversions import ConversionError, chunk_to_trajectory, image_to_rgb, stamp_to_ns
from oxygen_ros.nodes.lifecycle import ros_process, spinning

LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


def _namespace(name: str) -> str:
    return "/" + name.strip("/")


class RobotPort:
    """What the node keeps per robot: its spec, latest inputs, and its action chunk publisher."""

    def __init__(self, spec: RobotSpec, namespace: str, cameras: Sequence[str], publisher):
        self.spec = spec
        self.namespace = namespace
        self.cameras = list(cameras)
        self.publisher = publisher
        self.images: dict[str, np.ndarray] = {}
        self.joint_names: list[str] = []
        self.state = np.zeros(0)
        self.task: str | None = None


class FleetNode(Node):
    def __init__(self, context=None):
        super().__init__("fleet_server", context=context)
        p = self._declare_parameters()
        self.design = p["design"]
        specs = [ModelSpec.parse(text) for text in p["models"]]
        if len(p["robots"]) != len(p["robot_models"]):
            raise ValueError("robots and robot_models must have the same length")
        served_models = {s.model_id for s in specs}
        unknown = sorted(set(p["robot_models"]) - served_models)
        if unknown:
            raise ValueError(f"robot_models name models that are not served: {unknown} (served: {sorted(served_models)})")
        robots = list(zip(p["robots"], p["robot_models"]))
        if p["assignment_file"]:
            gpu_of = load_assignment(p["assignment_file"])["gpu_of"]
            missing = [r for r, _ in robots if r.strip("/") not in gpu_of]
            if missing:
                self.get_logger().warning(f"robots not in {p['assignment_file']}, not served here: {missing}")
            robots = [(r, m) for r, m in robots if gpu_of.get(r.strip("/")) == p["gpu_index"]]
        self.runner = ModelRunner(
            specs, p["device"], max_batch=p["max_batch"], cpu_threads=p["cpu_threads"] or None
        )
        if p["profile"]:
            self.lut = ProfileTable.load(p["profile"])
        else:
            self.lut = profile_runner(self.runner, p["max_batch"], repeats=3, warmup=1)
        slowdown = float(self.lut.meta.get("co_run_slowdown", 1.1))
        config = SimConfig(design=self.design, max_batch=p["max_batch"], guard=max(1.1, slowdown))
        self.fleet_device = make_device(config, self.lut)
        self.fleet = FleetExecutor(self.fleet_device, self.runner, on_finish=self._publish_chunks)
        self.tokenizers = self._tokenizers(p["tokenizer"])
        self.default_task = p["instruction"]
        self.action_dt = p["action_dt"]
        self.rate_hz = p["rate_hz"]
        self.ports: dict[str, RobotPort] = {}
        self._ids = 0
        self._id_lock = threading.Lock()
        for name, model_id in robots:
            self._add_robot(name, model_id, p["slo_ms"] / 1e3)
        self.published = 0
        self.get_logger().info(
            f"serving {sorted(self.ports)} with {sorted(served_models)} on {p['device']} "
            f"(gpu_index {p['gpu_index']}, design {self.design})"
        )

    def _declare_parameters(self) -> dict:
        defaults = {
            "models": ["a=tiny:0"],
            "robots": ["robot1"],
            "robot_models": ["a"],
            "slo_ms": 200.0,
            "assignment_file": "",
            "gpu_index": 0,
            "device": "cpu",
            "cpu_threads": 0,
            "profile": "",
            "design": "robion",
            "max_batch": 8,
            "tokenizer": "",
            "instruction": "do the task",
            "action_dt": 0.02,
            "rate_hz": 10.0,  # the robots' nominal control rate (recorded in their specs; requests follow frames)
        }
        return {name: self.declare_parameter(name, value).value for name, value in defaults.items()}

    def _tokenizers(self, path: str) -> dict:
        if path:
            tokenizer = load_tokenizer(path)
            return {m: tokenizer for m in self.runner.models}
        self._scratch = tempfile.TemporaryDirectory(prefix="fleet_tokenizer_")
        folder = Path(self._scratch.name)
        by_vocab = {}
        for served in self.runner.models.values():
            vocab = served.config.vocab_size
            if vocab not in by_vocab:
                by_vocab[vocab] = load_tokenizer(train_tokenizer(folder / f"stand_in_{vocab}.model", vocab))
        return {m: by_vocab[s.config.vocab_size] for m, s in self.runner.models.items()}

    def _add_robot(self, name: str, model_id: str, slo_s: float) -> None:
        namespace = _namespace(name)
        cameras = self.runner.models[model_id].config.camera_names
        publisher = self.create_publisher(JointTrajectory, f"{namespace}/action_chunk", 10)
        spec = RobotSpec(namespace.strip("/"), model_id, self.rate_hz, slo_s)
        port = RobotPort(spec, namespace, cameras, publisher)
        self.ports[port.spec.robot_id] = port
        for camera in cameras:
            self.create_subscription(
                Image,
                f"{namespace}/camera/{camera}/image_raw",
                lambda msg, port=port, camera=camera: self._on_image(port, camera, msg),
                qos_profile_sensor_data,
            )
        self.create_subscription(JointState, f"{namespace}/joint_states", lambda m, p=port: self._on_joints(p, m), 10)
        self.create_subscription(String, f"{namespace}/instruction", lambda m, p=port: self._on_task(p, m), LATCHED)

    # ---- inputs --------------------------------------------------------------------------------------------

    def _on_joints(self, port: RobotPort, msg: JointState) -> None:
        port.joint_names = list(msg.name)
        port.state = np.asarray(msg.position, dtype=np.float64)

    def _on_task(self, port: RobotPort, msg: String) -> None:
        port.task = msg.data

    def _on_image(self, port: RobotPort, camera: str, msg: Image) -> None:
        arrival = self.fleet.now()
        try:
            port.images[camera] = image_to_rgb(msg)
        except ConversionError as err:
            self.get_logger().warning(f"{port.namespace}: {err}", throttle_duration_sec=5.0)
            return
        if camera != port.cameras[0]:
            return
        model_id = port.spec.model_id
        served = self.runner.models[model_id]
        observation = Observation(dict(port.images), port.state, port.task or self.default_task)
        try:
            inputs = prepare_inputs([observation], served.config, self.tokenizers[model_id], served.norm_stats)
        except ValueError as err:
            self.get_logger().warning(f"{port.namespace}: {err}", throttle_duration_sec=5.0)
            return
        with self._id_lock:
            self._ids += 1
            request_id = self._ids
        context = (port.spec.robot_id, msg.header.stamp, list(port.joint_names))
        request = FleetRequest(
            request_id, port.spec.robot_id, model_id, arrival, arrival + port.spec.slo_s, inputs=inputs, context=context
        )
        self.fleet.submit(request)

    # ---- outputs (called on the fleet executor's thread) ---------------------------------------------------

    def _publish_chunks(self, requests: list[FleetRequest]) -> None:
        for request in requests:
            robot_id, stamp, joint_names = request.context
            port = self.ports[robot_id]
            served = self.runner.models[request.model_id]
            dims = min(len(joint_names), served.config.action_dim) or served.config.action_dim
            names = joint_names[:dims] if joint_names else [f"joint_{i}" for i in range(dims)]
            actions = robot_actions(request.actions[None], dims, served.norm_stats)[0]
            port.publisher.publish(chunk_to_trajectory(actions, names, stamp_to_ns(stamp), self.action_dt,
                                                       len(actions)))
            self.published += 1

    def serve(self, stop: threading.Event) -> None:
        self.fleet.run(stop=stop, reset_clock=False)

    def close(self) -> None:
        self.runner.close()
        if getattr(self, "_scratch", None) is not None:
            self._scratch.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with ros_process("fleet_node", argv) as (context, stop):
        try:
            node = FleetNode(context=context)
        except (ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                node.serve(stop)
            except BaseException as err:  # noqa: BLE001 - reported below, then the node exits
                failure.append(err)
                stop.set()

        # the fleet executor runs batches on its own thread and publishes chunks from there
        worker = threading.Thread(target=serve, name="fleet-executor")
        with spinning(node, stop, before_destroy=node.close) as spinner:
            worker.start()
            stop.wait()
            worker.join()
            node.get_logger().info(f"published {node.published} action chunks")
        if failure or spinner.failure is not None:
            print(f"error: fleet node failed: {(failure or [spinner.failure])[0]!r}", file=sys.stderr)
            return 1
        return 0

