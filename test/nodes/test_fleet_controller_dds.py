"""The fleet controller and three fleet_node processes over real DDS (tiny models on CPU): robots join one by one and
get chunks from the node the controller placed them on; a robot that does not fit is refused with the reason; a
robot that leaves loses its subscriptions on its node, whose model is let go when it was its last user; a node
killed with SIGKILL has its robot re-placed on a live node, where it gets chunks again, and nobody else moves; a
controller killed and restarted takes the placement back from the nodes' heartbeats and moves nobody; a node
refuses an older or unreadable assignment and drops frames past a robot's rate at arrival, all counted.

Each server holds one robot here (``max_robots_per_server: 1``: the SLO-safe share of every robot is a whole
server), so which robot fits where is decided by the placement, not by this machine's speed; the SLOs are loose
(2 s) so a loaded machine drops no frame. Waits are bounded and generous; nothing is timed against a rate."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builtin_interfaces.msg import Time
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from test_fleet_metrics import free_port, scrape
from trajectory_msgs.msg import JointTrajectory

from ros_test_utils import rclpy, spin_until, stop_process

pytestmark = pytest.mark.system

LUT = Path(__file__).parents[1] / "fixtures" / "fleet_cpu_lut.json"  # models a and b
CAMERAS = ("base_0_rgb", "left_wrist_0_rgb")  # the tiny preset's; the first one makes a frame
SERVERS = ("gpu0", "gpu1", "gpu2")
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
RELIABLE = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)


def ros_node(module: str, env: dict, *ros_args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, "--ros-args", *ros_args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def image(stamp: Time) -> Image:
    msg = Image()
    msg.header.stamp = stamp
    msg.height, msg.width, msg.encoding, msg.step = 48, 64, "rgb8", 64 * 3
    msg.data = bytes([7]) * (48 * 64 * 3)
    return msg


class Fleet:
    """The test's side of the fleet: robots' topics, the controller's topics and the nodes' heartbeats."""

    def __init__(self, node):
        self.node = node
        self.assignment, self.status, self.answers, self.beats = {}, {}, [], {}
        self.chunks: dict[str, list] = {}
        self.pubs: dict[str, tuple] = {}
        node.create_subscription(String, "/fleet/assignment", self._assignment, LATCHED)
        node.create_subscription(String, "/fleet/status", lambda m: self.status.update(json.loads(m.data)), LATCHED)
        node.create_subscription(String, "/fleet/join_answer", lambda m: self.answers.append(json.loads(m.data)),
                                 RELIABLE)
        node.create_subscription(String, "/fleet/heartbeat", self._beat, RELIABLE)
        self.join_pub = node.create_publisher(String, "/fleet/join", RELIABLE)

    def _assignment(self, msg):
        try:
            document = json.loads(msg.data)
        except json.JSONDecodeError:
            return  # the test's own bad input
        if document.get("version", 0) >= self.assignment.get("version", 0):
            self.assignment.update(document)

    def _beat(self, msg):
        beat = json.loads(msg.data)
        self.beats[beat["server"]] = beat

    def robot(self, robot_id: str) -> None:
        self.chunks[robot_id] = []
        self.node.create_subscription(JointTrajectory, f"/{robot_id}/action_chunk",
                                      lambda m, r=robot_id: self.chunks[r].append(m), 10)
        cams = [self.node.create_publisher(Image, f"/{robot_id}/camera/{c}/image_raw", qos_profile_sensor_data)
                for c in CAMERAS]
        self.pubs[robot_id] = (self.node.create_publisher(JointState, f"/{robot_id}/joint_states", 10), cams)

    def send_frames(self, robots) -> None:
        stamp = self.node.get_clock().now().to_msg()
        for robot_id in robots:
            joints, cams = self.pubs[robot_id]
            state = JointState(name=[f"{robot_id}_j{j}" for j in range(14)], position=[0.1] * 14)
            state.header.stamp = stamp
            joints.publish(state)
            cams[1].publish(image(stamp))
            cams[0].publish(image(stamp))

    def spin_until(self, condition, timeout: float, robots=()) -> bool:
        """Spin, sending a frame of each of `robots` every 0.2 s, until `condition()` or the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            self.send_frames(robots)
            spin_until(self.node, lambda: False, timeout=0.2)
        return condition()

    def request(self, **fields) -> dict:
        before = len(self.answers)
        self.join_pub.publish(String(data=json.dumps(fields)))
        assert self.spin_until(lambda: len(self.answers) > before, timeout=60), fields
        return self.answers[before]

    def publisher_nodes(self, topic: str) -> set[str]:
        return {info.node_name for info in self.node.get_publishers_info_by_topic(topic)}

    def subscriber_nodes(self, topic: str) -> set[str]:
        return {info.node_name for info in self.node.get_subscriptions_info_by_topic(topic)}


def test_the_controller_places_refuses_re_places_and_lets_robots_leave(ros_env, ros_context):
    common = ["-p", f"profile_file:={LUT}", "-p", "models:=['a=tiny:0', 'b=tiny:1']"]
    controller_args = [*common, "-p", f"servers:={list(SERVERS)}", "-p", "max_robots_per_server:=1",
                       "-p", "load_seeds:=1", "-p", "load_duration_s:=2.0", "-p", "heartbeat_timeout_s:=1.5",
                       "-p", "recover_s:=4.0", "-p", "min_replan_interval_s:=0.2", "-p", "status_rate_hz:=2.0",
                       "-p", f"metrics_port:={(metrics_port := free_port())}"]
    controller = ros_node("oxygen_ros.nodes.fleet_controller", ros_env, *controller_args)
    nodes = {server: ros_node("oxygen_ros.nodes.fleet_node", ros_env, *common, "-r", f"__node:=fleet_{server}",
                              "-p", "assignment_topic:=/fleet/assignment", "-p", f"server_name:={server}",
                              "-p", "cpu_threads:=1", "-p", "narrate_every:=0", "-p", "heartbeat_period_s:=0.3",
                              "-p", "max_batch:=2", "-p", "max_robots_per_model:=2")
             for server in SERVERS}
    processes = [controller, *nodes.values()]
    node = rclpy.create_node("fleet_controller_test", context=ros_context)
    fleet = Fleet(node)
    try:
        def all_up():
            return (fleet.status.get("ready") and all(fleet.status["servers"][s]["alive"] for s in SERVERS)
                    and fleet.join_pub.get_subscription_count() > 0)

        assert fleet.spin_until(lambda: all_up() or any(p.poll() is not None for p in processes), timeout=120), \
            fleet.status
        assert all_up(), [p.stdout.read()[-3000:] for p in processes if p.poll() is not None]

        # robots join one by one; each gets chunks from the node it was placed on
        placed = {}
        for robot_id, model in (("r1", "a"), ("r2", "b"), ("r3", "a")):
            fleet.robot(robot_id)
            answer = fleet.request(op="join", robot_id=robot_id, model_id=model, rate_hz=5.0, slo_s=2.0)
            assert answer["accepted"] and answer["server"] in SERVERS, answer
            placed[robot_id] = answer["server"]
            assert fleet.spin_until(lambda r=robot_id: len(fleet.chunks[r]) >= 2, timeout=60, robots=placed), \
                (robot_id, fleet.beats)
            assert fleet.publisher_nodes(f"/{robot_id}/action_chunk") == {f"fleet_{placed[robot_id]}"}
        assert sorted(placed.values()) == sorted(SERVERS)  # each server holds one robot
        assert all(fleet.assignment["server_of"][r] == s for r, s in placed.items())

        # a fourth robot does not fit: refused with the reason, nobody moved
        fleet.robot("r4")
        answer = fleet.request(op="join", robot_id="r4", model_id="a", rate_hz=5.0, slo_s=2.0)
        assert not answer["accepted"] and answer["server"] is None and "does not fit" in answer["reason"], answer
        assert fleet.request(op="join", robot_id="r5", model_id="zzz", rate_hz=5.0, slo_s=2.0)["reason"].startswith(
            "unknown model 'zzz'")
        assert fleet.request(op="join", robot_id="r1", model_id="a", rate_hz=5.0, slo_s=2.0)["reason"].startswith(
            "duplicate robot id r1")
        assert "bad request" in fleet.request(op="join", robot_id="r6", model_id="a", rate_hz=-1, slo_s=2.0)["reason"]
        assert fleet.spin_until(lambda: "r4" in fleet.status.get("refused", {}), timeout=10)
        assert "does not fit" in fleet.status["refused"]["r4"]
        # the same view as Prometheus metrics (scraped once the status counts r6's bad request)
        assert fleet.spin_until(lambda: fleet.status.get("bad_requests", 0) >= 1, timeout=10)
        metrics = scrape(metrics_port)
        assert metrics[("oxygen_fleet_ready", ())] == 1 and metrics[("oxygen_fleet_refused_robots", ())] >= 1
        assert metrics[("oxygen_fleet_robots", (("state", "placed"),))] == 3
        assert all(metrics[(f"oxygen_fleet_server_{name}", (("server", s),))] == 1 for s in SERVERS
                   for name in ("alive", "robots"))
        assert metrics[("oxygen_fleet_bad_requests_total", ())] >= 1  # r6's

        # r3 leaves: its subscriptions are gone from its node, and model a (its last user there) is let go
        gone = placed.pop("r3")
        assert "a" in fleet.beats[gone]["models"]
        assert fleet.request(op="leave", robot_id="r3")["accepted"]
        camera = f"/r3/camera/{CAMERAS[0]}/image_raw"
        assert fleet.spin_until(lambda: not fleet.subscriber_nodes(camera) and fleet.beats[gone]["models"] == []
                                and fleet.beats[gone]["robots"] == {}, timeout=30, robots=placed), fleet.beats[gone]
        assert fleet.spin_until(lambda: not fleet.publisher_nodes("/r3/action_chunk"), timeout=10)  # drained

        # SIGKILL the node serving r2: r2 is re-placed on the live free server and gets chunks again; r1 stays
        killed, r1_server = placed["r2"], placed["r1"]
        os.kill(nodes[killed].pid, signal.SIGKILL)
        nodes[killed].wait(timeout=30)
        killed_at = time.monotonic()
        moved = lambda: fleet.assignment["server_of"].get("r2") not in (None, killed)  # noqa: E731
        assert fleet.spin_until(moved, timeout=20, robots=placed), fleet.assignment
        print(f"r2 re-placed {time.monotonic() - killed_at:.1f} s after the kill")
        assert fleet.assignment["server_of"]["r2"] == gone  # the one server with room
        assert fleet.assignment["server_of"]["r1"] == r1_server
        # the status goes out with the assignment, on its own topic: it may be taken in a moment after it
        assert fleet.spin_until(lambda: not fleet.status["servers"][killed]["alive"], timeout=10, robots=placed), \
            fleet.status["servers"]
        before = len(fleet.chunks["r2"])
        assert fleet.spin_until(lambda: len(fleet.chunks["r2"]) >= before + 2, timeout=60, robots=placed)
        # the killed process cannot publish; DDS may list its publisher until its participant's lease runs out
        assert f"fleet_{gone}" in fleet.publisher_nodes("/r2/action_chunk") <= {f"fleet_{gone}", f"fleet_{killed}"}
        assert fleet.spin_until(lambda: "b" in fleet.beats[gone]["models"], timeout=10)
        assert fleet.publisher_nodes("/r1/action_chunk") == {f"fleet_{r1_server}"}
        assert fleet.status["robots"]["r1"]["server"] == r1_server

        # the controller is killed and restarted: it takes the placement back from the nodes' heartbeats (its
        # latched copy died with it) and moves nobody
        placement, version = dict(fleet.assignment["server_of"]), fleet.assignment["version"]
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait(timeout=30)
        fleet.status.clear()
        fleet.assignment.clear()
        controller = ros_node("oxygen_ros.nodes.fleet_controller", ros_env, *controller_args)
        processes[0] = controller
        assert fleet.spin_until(lambda: fleet.status.get("ready") or controller.poll() is not None, timeout=90,
                                robots=placed), fleet.status
        assert fleet.spin_until(lambda: fleet.assignment.get("server_of") == placement, timeout=10, robots=placed), \
            fleet.assignment
        assert fleet.assignment["version"] == version
        before = {r: len(fleet.chunks[r]) for r in placed}
        assert fleet.spin_until(lambda: all(len(fleet.chunks[r]) >= before[r] + 2 for r in placed), timeout=60,
                                robots=placed)
        assert all(fleet.beats[s]["version"] == version for s in SERVERS if s != killed)

        # bad input to a node: an older assignment version and an unreadable one are refused, counted, and change
        # nothing; frames past a robot's rate are dropped at arrival, counted
        rogue = node.create_publisher(String, "/fleet/assignment", LATCHED)  # latched, depth 1: one at a time
        live = [s for s in SERVERS if s != killed]
        for text, count in ((json.dumps({"version": 1, "server_of": {}, "model_of": {}, "slo_of": {}, "rate_of": {}}),
                             "stale_assignments"), ("not json", "bad_assignments")):
            rogue.publish(String(data=text))
            counted = lambda count=count: all(fleet.beats[s][count] >= 1 for s in live)  # noqa: E731
            assert fleet.spin_until(counted, timeout=20, robots=placed), {s: fleet.beats[s] for s in live}
        assert all(fleet.beats[s]["version"] == version for s in live)
        assert {r for s in live for r in fleet.beats[s]["robots"]} == {"r1", "r2"}
        for _ in range(25):  # r1 at 50 Hz, placed for 5 Hz
            fleet.send_frames(["r1"])
            spin_until(node, lambda: False, timeout=0.02)
        over = lambda: fleet.beats[r1_server]["robots"]["r1"]["over_rate"] > 0  # noqa: E731
        assert fleet.spin_until(over, timeout=10), fleet.beats[r1_server]
    finally:
        node.destroy_node()
        codes = {name: stop_process(p, timeout=20) for name, p in [("controller", processes[0]), *nodes.items()]}
        outputs = {name: p.stdout.read() for name, p in [("controller", processes[0]), *nodes.items()]}
    assert codes["controller"] == 0, outputs["controller"][-3000:]
    assert all(codes[s] == 0 for s in SERVERS if s != killed), {s: outputs[s][-2000:] for s in SERVERS}
    assert "recovered from the heartbeats of" in outputs["controller"]  # the restarted one
    assert "model a unloaded" in outputs[gone]
