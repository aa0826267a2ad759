"""The fleet server node over real DDS: 4 namespaced robots on one node, served by the Robion lockstep stage split
(its table profiled at start-up on the served models), each gets only its own chunks, its own narration and its own
engine_status; the node serves only its GPU's robots and loads only their models, each robot with its SLO from the
assignment file and its own embodiment (one is a DROID arm: its velocities integrated from its frame's state); a
frame whose stamp is already past its deadline is never served and is counted, in the robot's engine_status and on
/diagnostics. (The default whole-device design over DDS: `test_fleet_node_clients.py`.)"""

import json
import subprocess
import sys

import numpy as np
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.srv import GetState
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.msg import EngineStatus, Narration

from ros_test_utils import rclpy, spin_until, stop_process

CAMERAS = ("base_0_rgb", "left_wrist_0_rgb")  # the tiny preset's cameras; the first one triggers a request
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


def image(stamp: Time, value: int) -> Image:
    msg = Image()
    msg.header.stamp = stamp
    msg.height, msg.width, msg.encoding, msg.step = 48, 64, "rgb8", 64 * 3
    msg.data = bytes([value % 256]) * (48 * 64 * 3)
    return msg


def test_fleet_node_serves_namespaced_robots_and_only_its_assigned_ones(tmp_path, ros_env, ros_context):
    robots = [f"robot{i}" for i in range(1, 6)]
    assignment = tmp_path / "assignment.json"
    gpu_of = {r: 0 for r in robots[:4]} | {"robot5": 1}  # robot5 belongs to another GPU's node
    model_of = {"robot1": "a", "robot2": "b", "robot3": "a", "robot4": "b", "robot5": "c"}
    slo_of = {r: 20.0 + i for i, r in enumerate(robots)}  # loose (the machine is loaded), one per robot
    assignment.write_text(json.dumps({"method": "milp", "gpu_of": gpu_of, "model_of": model_of, "slo_of": slo_of}))
    args = [
        "-p", "models:=['a=tiny:0', 'b=tiny:1', 'c=tiny:2']",  # c is only robot5's, on the other GPU
        "-p", "slo_ms:=1.0",  # every robot's SLO comes from the file
        "-p", f"assignment_file:={assignment}",
        "-p", "gpu_index:=0",
        "-p", "design:=robion",
        "-p", "profile_repeats:=1",
        "-p", "cpu_threads:=2",
        "-p", "max_batch:=2",
        "-p", "narrate_every:=2",
        "-p", "max_new_tokens:=4",
        "-p", f"robots:={robots}", "-p", f"robot_models:={[model_of[r] for r in robots]}",
        "-p", "embodiments:=[absolute, absolute, droid, absolute, absolute]",  # robot3: a DROID arm (8 joints)
    ]
    server = subprocess.Popen(
        [sys.executable, "-m", "oxygen_ros.nodes.fleet_node", "--ros-args", *args],
        env=ros_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    node = rclpy.create_node("fleet_test_robots", context=ros_context)
    try:
        cams = {r: [node.create_publisher(Image, f"/{r}/camera/{c}/image_raw", qos_profile_sensor_data)
                    for c in CAMERAS] for r in robots}
        joints = {r: node.create_publisher(JointState, f"/{r}/joint_states", 10) for r in robots}
        tasks = {r: node.create_publisher(String, f"/{r}/instruction", LATCHED) for r in robots}
        received = {r: [] for r in robots}
        narrations = {r: [] for r in robots}
        statuses = {r: [] for r in robots}
        diagnostics = {}
        node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: diagnostics.update(
            {s.name.split(":")[0].strip("/"): {kv.key: kv.value for kv in s.values} for s in m.status}), 10)
        for r in robots:
            node.create_subscription(
                JointTrajectory, f"/{r}/action_chunk", lambda m, r=r: received[r].append(m), 10
            )
            node.create_subscription(Narration, f"/{r}/narration", lambda m, r=r: narrations[r].append(m), 50)
            node.create_subscription(EngineStatus, f"/{r}/engine_status", lambda m, r=r: statuses[r].append(m), 10)
        served = robots[:4]
        matched = lambda: all(p.get_subscription_count() > 0 for r in served for p in cams[r])  # noqa: E731
        spin_until(node, lambda: matched() or server.poll() is not None, timeout=90)
        assert matched(), server.poll() is None or server.stdout.read()
        assert all(p.get_subscription_count() == 0 for p in cams["robot5"])  # not this node's robot
        get_state = node.create_client(GetState, "/fleet_server/get_state")  # a managed node, autostarted
        assert get_state.wait_for_service(timeout_sec=30)
        state = get_state.call_async(GetState.Request())
        spin_until(node, state.done, timeout=30)
        assert state.result().current_state.label == "active"
        def joint_state(r, i, stamp):
            count = 8 if r == "robot3" else 14
            state = JointState(name=[f"{r}_j{j}" for j in range(count)], position=[0.1 * i] * count)
            state.header.stamp = stamp
            return state

        for i, r in enumerate(robots, start=1):
            tasks[r].publish(String(data=f"pick up the cube, {r}"))
            joints[r].publish(joint_state(r, i, Time(sec=1)))
        spin_until(node, lambda: False, timeout=0.5)  # the node knows every robot's joints before any frame
        sent = {r: set() for r in robots}
        old = node.get_clock().now().to_msg()
        old.sec -= 60  # a minute old, past robot1's 20 s deadline before it arrives
        for k in range(3):  # best-effort camera topics: some may be lost, one is enough
            old.nanosec = k
            joints["robot1"].publish(joint_state("robot1", 1, old))
            cams["robot1"][1].publish(image(old, 1))
            cams["robot1"][0].publish(image(old, 1))
            spin_until(node, lambda: False, timeout=0.3)  # each is the newest when the node reads it
        for k in range(8):
            for i, r in enumerate(robots, start=1):
                stamp = node.get_clock().now().to_msg()
                stamp.nanosec = (stamp.nanosec // 10 * 10 + i) % 1_000_000_000  # distinct per robot and frame
                joints[r].publish(joint_state(r, i, stamp))
                cams[r][1].publish(image(stamp, 10 * i + k))
                cams[r][0].publish(image(stamp, 10 * i + k))
                sent[r].add((stamp.sec, stamp.nanosec))
            spin_until(node, lambda: False, timeout=0.15)
        assert spin_until(node, lambda: all(len(received[r]) >= 3 for r in served), timeout=120), {
            r: len(v) for r, v in received.items()
        }
        assert spin_until(node, lambda: all(any(n.final for n in narrations[r]) for r in served), timeout=120), {
            r: len(v) for r, v in narrations.items()
        }
        assert spin_until(node, lambda: all(s and s[-1].actions_published >= 3 for r, s in statuses.items()
                                            if r in served), timeout=10)
        late = lambda: statuses["robot1"] and statuses["robot1"][-1].deadline_misses >= 1  # noqa: E731
        assert spin_until(node, lambda: late() and "robot4" in diagnostics, timeout=10), statuses["robot1"][-1:]
        misses = statuses["robot1"][-1].deadline_misses
        assert misses <= 3 and statuses["robot1"][-1].dropped_frames == misses  # never served, counted and told
        assert all(statuses[r][-1].deadline_misses == 0 for r in served[1:])
        assert diagnostics["robot1"]["late_on_arrival"] == str(misses)
        assert float(diagnostics["robot1"]["slo_attainment"]) < 1.0
        for r in served:
            assert diagnostics[r]["slo_ms"] == f"{1e3 * slo_of[r]:g}" and diagnostics[r]["model"] == model_of[r]
            assert diagnostics[r]["batching"].startswith("robion: stage batches on device shares"), diagnostics[r]
        assert all(float(diagnostics[r]["slo_attainment"]) == 1.0 for r in served[1:])
        for r in served:
            # served while its frames were fresh (the last status may already say stale_frame: the frames stopped, and
            # on a loaded machine the waits above can outlast their age)
            assert any(s.state == "running" for s in statuses[r]) and statuses[r][-1].kv_slots_total > 0
            for narration in narrations[r]:
                assert (narration.header.stamp.sec, narration.header.stamp.nanosec) in sent[r]
                assert narration.num_tokens <= 4
        assert narrations["robot5"] == [] and statuses["robot5"] == []
        for r in served:
            stamps = {(m.header.stamp.sec, m.header.stamp.nanosec) for m in received[r]}
            assert stamps <= sent[r], (r, stamps - sent[r])  # only its own fresh frames, never another robot's
            count = 8 if r == "robot3" else 14
            for msg in received[r]:
                assert msg.joint_names == [f"{r}_j{j}" for j in range(count)]
                assert len(msg.points) == 8 and len(msg.points[0].positions) == count  # tiny: horizon 8
                if r == "robot3":  # droid: steps (rad/s / 15) summed from the frame's state (0.3) on its grid
                    positions = np.array([p.positions for p in msg.points])
                    velocities = np.array([p.velocities for p in msg.points])
                    np.testing.assert_allclose(positions[:-1, :7] - 0.3,
                                               np.cumsum(velocities[:-1, :7], axis=0) / 15, atol=1e-9)
                    assert not velocities[-1].any()  # the plan ends at rest (a trajectory controller's rule)
                    assert msg.points[0].time_from_start.nanosec == round(1e9 / 15)
                else:
                    assert not msg.points[0].velocities
        assert received["robot5"] == []
    finally:
        node.destroy_node()
        code = stop_process(server, timeout=20)
        output = server.stdout.read()
    assert code == 0, output
    assert "published" in output and "action chunks" in output
    assert "with models ['a', 'b']" in output  # c is robot5's, on the other GPU: not loaded here
    assert "design robion" in output
