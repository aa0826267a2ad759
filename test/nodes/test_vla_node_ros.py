"""The VLA node over real DDS: started as a process with the shipped parameter file (as the launch file does), fed
by a sensor publisher in this process, judged by what it publishes.

Every node here runs the `tiny` preset with the ALOHA file and `-p` overrides for what `tiny` lacks (it has two
image keys, so two cameras) and with one torch thread, so several nodes fit on a small machine.
"""

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import rclpy
import torch
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import String
from test_replay_node import Child
from trajectory_msgs.msg import JointTrajectory
from visualization_msgs.msg import Marker, MarkerArray

from oxygen_ros.control.plan_markers import TIME_SCALE, VALUE_SCALE
from oxygen_ros.data.episode import ALOHA_JOINT_NAMES
from oxygen_ros.data.jpeg import encode_jpeg
from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.msg import EngineStatus, Narration
from oxygen_ros.nodes.conversions import ns_to_stamp
from oxygen_ros.nodes.latency_probe import SensorPublisher
from oxygen_ros.nodes.vla_node import main as vla_node_main

REPO = Path(__file__).resolve().parents[2]
ALOHA = REPO / "config" / "aloha.yaml"
# The shipped file starts disarmed (autostart false); these nodes drive a test robot at once. A file, not `-p`, so a
# parameter file given later (a test's own) still decides.
ARMED = ["--params-file", str(ALOHA), "--params-file", str(REPO / "test" / "fixtures" / "armed.yaml")]
CAMERAS = ["camera/cam_high/image_raw", "camera/cam_left_wrist/image_raw"]
TINY = ["-p", "model.preset:=tiny", "-p", f"cameras.topics:=[{','.join(CAMERAS)}]",
        "-p", "cameras.keys:=[base_0_rgb,left_wrist_0_rgb]", "-p", "cameras.compressed:=[false,false]",
        "-p", "control.horizon:=6", "-p", "control.time_step:=0.1",  # 0.6 s plans: longer than a loaded machine's
        # frame ages (a plan that has ended when it would go out is refused, as a controller would refuse it)
        "-p", "model.cpu_threads:=1", "-p", "status.rate_hz:=10.0"]
STARTUP_TIMEOUT_S = 240.0  # importing torch and building the model; minutes on a busy machine


def start_node(env: dict, cache: Path, *overrides: str, namespace: str = "") -> Child:
    env = dict(env, XDG_CACHE_HOME=str(cache))
    args = ["-m", "oxygen_ros.nodes.vla_node", "--ros-args", *ARMED, *TINY, *overrides]
    if namespace:
        args += ["-r", f"__ns:={namespace}"]
    return Child(args, env)


def diagnostic_values(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


class Robot:
    """The test's side of one robot: sensors published into a namespace, everything the node sends back kept."""

    def __init__(self, context, namespace: str = "", compressed_second_camera: bool = False):
        self.node = rclpy.create_node("robot_side", namespace=namespace or None, context=context)
        self.sensors = SensorPublisher(self.node, CAMERAS if not compressed_second_camera else CAMERAS[:1],
                                       ALOHA_JOINT_NAMES)
        self.compressed_pub = None
        if compressed_second_camera:
            self.compressed_pub = self.node.create_publisher(CompressedImage, CAMERAS[1] + "/compressed",
                                                             qos_profile_sensor_data)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.instruction_pub = self.node.create_publisher(String, "instruction", latched)
        self.lock = threading.Lock()
        self.chunks: list[tuple[float, JointTrajectory]] = []
        self.narrations: list[Narration] = []
        self.statuses: list[EngineStatus] = []
        self.diagnostics: list[DiagnosticStatus] = []
        self.node.create_subscription(JointTrajectory, "action_chunk", self._keep(self.chunks, timed=True), 100)
        self.node.create_subscription(Narration, "narration", self._keep(self.narrations), 100)
        self.node.create_subscription(EngineStatus, "engine_status", self._keep(self.statuses), 50)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 50)
        self.markers: list[MarkerArray] = []
        self.node.create_subscription(MarkerArray, "chunk_markers", self._keep(self.markers), 100)

    def _keep(self, store: list, timed: bool = False):
        def callback(msg):
            with self.lock:
                store.append((time.monotonic(), msg) if timed else msg)
        return callback

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        ours = f"{self.node.get_namespace().rstrip('/')}/vla_node: vla engine"
        with self.lock:
            self.diagnostics += [s for s in msg.status if s.name == ours]

    def publish_good(self, compressed_ok: bool = True) -> int:
        stamp = self.sensors.publish_frame()
        if self.compressed_pub is not None and compressed_ok:
            self.publish_compressed(encode_jpeg(self.sensors.images[0], 90), stamp)
        return stamp

    def publish_compressed(self, data: bytes, stamp: int, fmt: str = "jpeg") -> None:
        msg = CompressedImage(format=fmt, data=data)
        msg.header.stamp = ns_to_stamp(stamp)
        self.compressed_pub.publish(msg)

    def chunk_stamps(self) -> set[int]:
        with self.lock:
            return {stamp_to_ns(m.header.stamp) for _, m in self.chunks}

    def last_status(self) -> EngineStatus | None:
        with self.lock:
            return self.statuses[-1] if self.statuses else None

    def last_values(self) -> dict[str, str]:
        with self.lock:
            return diagnostic_values(self.diagnostics[-1]) if self.diagnostics else {}

    def counter(self, name: str) -> int:
        """A counter from the node's latest /diagnostics (0 before it reports one)."""
        return int(self.last_values().get(name, "0"))

    def recovers(self, timeout: float, child: "Child | None" = None) -> None:
        """Good frames again until a chunk computed from one of them arrives."""
        good: list[int] = []

        def acted() -> bool:
            good.append(self.publish_good())
            time.sleep(1 / 30)
            return bool(set(good) & self.chunk_stamps())

        assert wait_until(acted, timeout, child), (self.last_values(), child.stop()[1] if child else "")


class Spinner:
    """One SingleThreadedExecutor thread for the test's nodes."""

    def __init__(self, context, nodes):
        self.executor = SingleThreadedExecutor(context=context)
        for node in nodes:
            self.executor.add_node(node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def close(self, nodes) -> None:
        self.executor.shutdown()
        self.thread.join()
        for node in nodes:
            node.destroy_node()


def wait_until(condition, timeout: float, child: Child | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if child is not None and child.process.poll() is not None:
            return condition()  # the node died: no point waiting
        time.sleep(0.02)
    return condition()


def drive(robot: Robot, seconds: float, rate_hz: float = 30.0, **kwargs) -> list[int]:
    """Publish good frames for `seconds` from this thread; returns their stamps."""
    stamps, period = [], 1.0 / rate_hz
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stamps.append(robot.publish_good(**kwargs))
        time.sleep(period)
    return stamps


def test_namespaced_nodes_act_at_rate_narrate_report_and_exit_cleanly(ros_context, ros_env, model_cache):
    """robot1 is measured while robot2 idles (it has no sensors yet); then both run, each on its own inputs."""
    rate = 20.0
    robots = {ns: Robot(ros_context, ns) for ns in ("/robot1", "/robot2")}
    robot1, robot2 = robots.values()
    robot1.instruction_pub.publish(String(data="pick up the red cube"))  # latched: sent before the node exists
    spinner = Spinner(ros_context, [r.node for r in robots.values()])
    children = {
        "/robot1": start_node(ros_env, model_cache, "-p", f"control.rate_hz:={rate}", "-p", "control.time_step:=0.04",
                              "-p", "language.every_n_frames:=5", "-p", "language.max_new_tokens:=8",
                              "-p", "language.stream_every:=4", "-p", "visualization.markers:=true",
                              "-p", "visualization.frame_id:=world", namespace="/robot1"),
        "/robot2": start_node(ros_env, model_cache, "-p", "control.rate_hz:=10.0", "-p", "language.policy:=off",
                              namespace="/robot2"),
    }
    try:
        for ns, robot in robots.items():
            assert wait_until(lambda r=robot: r.last_status() is not None, STARTUP_TIMEOUT_S, children[ns]), \
                children[ns].stop()[1]
            children[ns].note_shm()
        publisher, stop = robot1.sensors.start(30.0)
        try:
            assert wait_until(lambda: robot1.chunks, 20, children["/robot1"]), children["/robot1"].stop()[1]
            time.sleep(1.0)  # warm-up
            with robot1.lock:
                begin, first_status = len(robot1.chunks), robot1.statuses[-1]
            time.sleep(3.0)
            with robot1.lock:
                measured, last_status = robot1.chunks[begin:], robot1.statuses[-1]
        finally:
            stop.set()
            publisher.join()
        assert not robot2.chunks and robot2.last_status().state == "waiting_for_camera"
        # Now both robots see sensors, each its own.
        both = {ns: [] for ns in robots}
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            for ns, robot in robots.items():
                both[ns].append(robot.publish_good())
            time.sleep(1 / 30)
        assert wait_until(lambda: all(set(both[ns]) & robots[ns].chunk_stamps() for ns in robots), 20)
        # robot2's status reports its actions (robot1's narrations and statuses were flowing all along).
        assert wait_until(lambda: robot2.last_status().actions_published > 0 and robot2.diagnostics, 20)
        results = {ns: child.stop() for ns, child in children.items()}
    finally:
        for child in children.values():
            child.stop()
        spinner.close([r.node for r in robots.values()])

    for rc, output in results.values():
        assert rc == 0, output
        assert "terminate called" not in output and "Traceback" not in output, output
    # No cross-talk: every chunk comes from a frame published to that robot's namespace.
    assert robot1.chunk_stamps() <= set(robot1.sensors.stamps)
    assert robot2.chunk_stamps() <= set(robot2.sensors.stamps) and robot2.chunk_stamps()
    assert robot2.statuses[-1].actions_published > 0 and robot2.diagnostics
    assert not robot2.narrations and robot1.narrations

    # The timer paces the node (frames come at 30 Hz): at 20 Hz where the machine lets it, slower only with the
    # deadline misses that say why (a busy machine stretches the ticks past the period), never faster. Told by the
    # node's own statuses (chunks published between two of them, over their stamps, both taken on the node's one
    # executor thread), not by when this process took the chunks in: a starved listener takes a backlog in a burst,
    # which looks faster than the node. A timer fires at most once per period slot, one late slot at most caught up,
    # so over 1.5 s or more the count stays within the 10 % below.
    span_s = (stamp_to_ns(last_status.header.stamp) - stamp_to_ns(first_status.header.stamp)) / 1e9
    assert span_s >= 1.5 and len(measured) >= 2, (span_s, len(measured))  # statuses come at 2 Hz
    measured_rate = (last_status.actions_published - first_status.actions_published) / span_s
    misses = robot1.statuses[-1].deadline_misses
    assert measured_rate <= 1.1 * rate and (measured_rate >= 0.9 * rate or misses > 0), (measured_rate, misses)
    for _, chunk in robot1.chunks:
        assert chunk.joint_names == list(ALOHA_JOINT_NAMES)
        assert len(chunk.points) == 6
        assert [stamp_to_ns(p.time_from_start) for p in chunk.points] == [40_000_000 * (i + 1) for i in range(6)]
        assert all(len(p.positions) == 14 and np.isfinite(p.positions).all() for p in chunk.points)

    chunk_stamps = robot1.chunk_stamps()
    finals = [n for n in robot1.narrations if n.final]
    assert len(finals) >= 5
    assert len({n.request_id for n in finals}) == len(finals), "one final message per request"
    by_request: dict[int, list[Narration]] = {}
    for narration in robot1.narrations:
        assert stamp_to_ns(narration.header.stamp) in chunk_stamps  # a frame the node acted on
        assert narration.header.frame_id == "camera_0"  # the first camera's frame
        by_request.setdefault(narration.request_id, []).append(narration)
    for messages in by_request.values():
        assert [m.final for m in messages].count(True) <= 1 and not any(m.final for m in messages[:-1])
        assert [m.num_tokens for m in messages] == sorted(m.num_tokens for m in messages)
        assert len({stamp_to_ns(m.header.stamp) for m in messages}) == 1
    assert all(0 < m.num_tokens <= 8 for m in finals if m.text)

    check_markers(robot1, finals)
    assert not robot2.markers  # visualization.markers is off by default

    running = [s for s in robot1.statuses if s.state == "running"]
    assert running, [s.state for s in robot1.statuses]
    for status in running:
        assert status.kv_slots_total == 8 and status.kv_slots_used <= status.kv_slots_total
        assert status.kv_bytes_used <= status.kv_bytes_total and status.kv_bytes_total > 0
        assert status.actions_published > 0
        assert 0 < status.action_latency_p50_ms <= status.action_latency_p99_ms
    assert any(s.language_tokens_per_s > 0 for s in running)

    # Acting: OK, or a WARN that says it acts below 90 % of its rate (a busy machine); never an ERROR.
    assert all(s.level in (DiagnosticStatus.OK, DiagnosticStatus.WARN) for s in robot1.diagnostics)
    assert any(s.level == DiagnosticStatus.OK or s.message.startswith("acting at") for s in robot1.diagnostics)
    values = diagnostic_values(robot1.diagnostics[-1])
    # Good inputs only: nothing dropped but frames or states that a busy machine let age past their limits.
    aged = ("dropped_stale_frame", "dropped_stale_state")
    stale = sum(int(values.get(k, "0")) for k in aged)
    assert all(values[k] == "0" for k in values if k.startswith("dropped_") and k not in ("dropped_frames", *aged)), \
        values
    assert all(s.dropped_frames <= stale for s in running), (stale, [s.dropped_frames for s in running])
    assert int(values["actions_published"]) >= len(measured) and float(values["node_overhead_ms_p50"]) >= 0
    assert values["instructions_ignored"] == "0" and values["model_errors"] == "0"


def check_markers(robot: Robot, finals: list[Narration]) -> None:
    """chunk_markers carries each published plan as a chart (a lane per joint: x the time ahead, z the value; a
    sphere at each lane's end) stamped like its action_chunk, and each final narration's text."""
    chunks: dict[int, list[JointTrajectory]] = {}  # a reused frame's chunks share its stamp
    for _, chunk in robot.chunks:
        chunks.setdefault(stamp_to_ns(chunk.header.stamp), []).append(chunk)

    def chart(chunk: JointTrajectory) -> list[tuple[int, list[float], list[float]]]:
        lanes = [(j, [0.04 * (i + 1) * TIME_SCALE for i in range(6)],
                  [p.positions[j] * VALUE_SCALE for p in chunk.points]) for j in range(14)]
        return lanes + [(-1, [0.04 * 6 * TIME_SCALE] * 14, [v * VALUE_SCALE for v in chunk.points[-1].positions])]

    plans = [a for a in robot.markers if a.markers[0].ns == "plan_path"]
    texts = [m for a in robot.markers for m in a.markers if m.ns == "narration"]
    assert plans and texts and len(plans) + len(texts) == len(robot.markers)
    for array in plans:
        lanes = [("plan_path", j, Marker.LINE_STRIP) for j in range(14)]
        assert [(m.ns, m.id, m.type) for m in array.markers] == [*lanes, ("plan_end", 0, Marker.SPHERE_LIST)]
        assert all(m.header.frame_id == "world" and m.action == Marker.ADD for m in array.markers)
        drawn = [(m.id if m.ns == "plan_path" else -1, [p.x for p in m.points], [p.z for p in m.points])
                 for m in array.markers]
        assert any(all(j == k and x == pytest.approx(ex) and z == pytest.approx(ez, rel=1e-6, abs=1e-9)
                       for (j, x, z), (k, ex, ez) in zip(drawn, chart(chunk), strict=True))
                   for chunk in chunks[stamp_to_ns(array.markers[0].header.stamp)])
    assert all(m.type == Marker.TEXT_VIEW_FACING and m.header.frame_id == "world" for m in texts)
    assert {(stamp_to_ns(m.header.stamp), m.text) for m in texts} <= {(stamp_to_ns(n.header.stamp), n.text)
                                                                      for n in finals}


def test_bad_inputs_are_dropped_counted_and_the_node_keeps_acting(ros_context, ros_env, model_cache):
    robot = Robot(ros_context, compressed_second_camera=True)
    spinner = Spinner(ros_context, [robot.node])
    child = start_node(ros_env, model_cache, "-p", "control.rate_hz:=20.0", "-p", "cameras.compressed:=[false,true]",
                       "-p", "control.max_image_age_s:=0.5", "-p", "instruction.max_chars:=300",
                       "-p", "language.policy:=on_instruction_change")

    counter = robot.counter

    def recovers() -> None:
        robot.recovers(20)

    def bad(publish, counter_name: str) -> None:
        before = counter(counter_name)
        publish()
        assert wait_until(lambda: counter(counter_name) > before, 10), (counter_name, robot.last_values())
        recovers()

    try:
        assert wait_until(lambda: robot.last_status() is not None, STARTUP_TIMEOUT_S, child), child.stop()[1]
        child.note_shm()
        # One camera missing at start: no action, and the status says which.
        drive(robot, 0.6, compressed_ok=False)
        assert not robot.chunks
        assert robot.last_status().state == "waiting_for_camera"
        assert CAMERAS[1] in robot.diagnostics[-1].message and robot.diagnostics[-1].level == DiagnosticStatus.WARN
        recovers()
        assert not {k: v for k, v in robot.last_values().items()  # a missing camera is waited for, not a drop
                    if k.startswith("dropped_") and k not in ("dropped_frames", "dropped_stale_frame",
                                                              "dropped_stale_state") and v != "0"}

        def image(**fields) -> Image:
            msg = robot.sensors.image_msg(0, robot.node.get_clock().now().nanoseconds)
            for name, value in fields.items():
                setattr(msg, name, value)
            return msg

        camera0 = robot.sensors.image_pubs[0]
        bad(lambda: camera0.publish(image(encoding="yuv422")), "dropped_encoding")
        bad(lambda: camera0.publish(image(data=bytes(100))), "dropped_size")  # truncated data
        bad(lambda: camera0.publish(image(width=200)), "dropped_size")  # size does not match the data
        def now() -> int:  # each bad message newer than the good ones before it (older ones are out of order)
            return robot.node.get_clock().now().nanoseconds

        jpeg = encode_jpeg(robot.sensors.images[0], 90)
        bad(lambda: robot.publish_compressed(jpeg[: len(jpeg) // 2], now()), "dropped_corrupt")
        joints = robot.sensors.joint_pub
        bad(lambda: joints.publish(robot.sensors.joint_msg(now(), [float("nan")] + [0.0] * 13)), "dropped_nan_joint")

        def missing():
            msg = robot.sensors.joint_msg(now())
            msg.name, msg.position = msg.name[1:], msg.position[1:]
            return msg

        bad(lambda: joints.publish(missing()), "dropped_missing_joint")

        def stale() -> None:
            for _ in range(3):
                robot.sensors.publish_frame(robot.node.get_clock().now().nanoseconds - 2_000_000_000)
                robot.publish_compressed(jpeg, robot.node.get_clock().now().nanoseconds - 2_000_000_000)
                time.sleep(0.1)

        bad(stale, "dropped_stale_frame")
        assert "stale_frame" in {s.state for s in robot.statuses}

        bad(lambda: robot.instruction_pub.publish(String(data="   ")), "instructions_ignored")
        long_text = " ".join(f"then move block {i} onto the tray" for i in range(40))  # 1,270 characters
        bad(lambda: robot.instruction_pub.publish(String(data=long_text)), "instructions_truncated")
        # Cut to max_chars first, then by words again, because 300 characters do not fit a 64-token prompt.
        assert wait_until(lambda: counter("instructions_truncated") == 2, 10), robot.last_values()
        drive(robot, 0.5)
        time.sleep(0.3)
        rc, output = child.stop()
    finally:
        child.stop()
        spinner.close([robot.node])

    assert rc == 0, output
    values = diagnostic_values(robot.diagnostics[-1])
    assert values["model_errors"] == "0", output
    # The stale frames came after newer ones: out of order, so the kept ones aged into stale ticks.
    assert {k: int(values[k]) for k in values if k.startswith("dropped_") and k != "dropped_frames"} == {
        "dropped_encoding": 1, "dropped_size": 2, "dropped_corrupt": 1, "dropped_nan_joint": 1,
        "dropped_missing_joint": 1, "dropped_stale_frame": int(values["dropped_stale_frame"]),
        "dropped_out_of_order": int(values["dropped_out_of_order"])}
    assert int(values["dropped_stale_frame"]) >= 1 and int(values["dropped_out_of_order"]) >= 3
    assert robot.statuses[-1].dropped_frames == sum(
        int(values[k]) for k in values if k.startswith("dropped_") and k != "dropped_frames")
    assert robot.statuses[-1].state == "running"
    assert "instruction too long for the model's prompt" in output
    narrated = {n.request_id for n in robot.narrations}
    assert len(narrated) >= 2, "on_instruction_change narrates the default task and the new instruction"


def test_unknown_camera_key_is_a_clear_start_up_error(capfd, tmp_path, monkeypatch):
    # The ALOHA file as shipped maps three cameras; the tiny preset has only two image keys. The node's own main()
    # runs here (no process: it fails before it would build the model), with the arguments ros2 run would pass.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vla_node_main(["--ros-args", *ARMED, "-p", "model.preset:=tiny"]) == 1
    output = capfd.readouterr().err
    assert "cannot start: cameras.keys ['right_wrist_0_rgb'] are not image keys of this model" in output, output
    assert vla_node_main(["--ros-args", *ARMED, "-p", "model.checkpoint:=/nonexistent"]) == 1
    assert "model.checkpoint '/nonexistent' cannot be loaded: '/nonexistent' is neither a checkpoint folder nor a " \
        "hub repo id" in capfd.readouterr().err
    threads = torch.get_num_threads()  # TINY sets one torch thread, in this process here
    try:
        assert vla_node_main(["--ros-args", *ARMED, *TINY,
                              "-p", "cameras.topics:=[cam 1,cam2]"]) == 1
    finally:
        torch.set_num_threads(threads)
    assert "cannot start: cameras.topics: " in capfd.readouterr().err
