"""Real-time chunking in the fleet node over real DDS (`output.handover: rtc_guided`, `robots/rtc_guide.py`): each
robot's frames are guided toward the chunk it is executing with its own measured delay, robots of one model share
its batches whether guided or not, and a robot whose delay reaches the execution horizon is sampled plainly,
counted and logged while the others stay guided.

Three robots on one tiny model, a point every 0.1 s, an execution horizon of 6 steps: `fresh` sends frames stamped
now, `behind` frames stamped 0.2 s in the past (a longer delay, still guided), `late` frames 0.65 s in the past (a
delay at or beyond the execution horizon: plain; still inside the tiny model's 8-step chunk, whose plan would
otherwise end before it goes out and be refused as past, `robots/command_path.py`).
"""

import subprocess
import sys
import threading
import time

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from test_vla_node_ros import Spinner
from test_vla_node_rtc import first_point_gaps
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.nodes.latency_probe import SensorPublisher

from ros_test_utils import rclpy, stop_process

CAMERAS = ["camera/base_0_rgb/image_raw", "camera/left_wrist_0_rgb/image_raw"]
JOINTS = [f"j{i}" for i in range(14)]
BEHIND_NS = {"fresh": 0, "behind": 200_000_000, "late": 650_000_000}


def test_fleet_robots_are_guided_with_their_own_delays_and_a_late_one_falls_back_to_plain(ros_env, ros_context):
    robots = list(BEHIND_NS)
    args = ["-p", "models:=['a=tiny:0']", "-p", f"robots:={robots}", "-p", "robot_models:=[a, a, a]",
            "-p", "slo_ms:=5000.0", "-p", "max_batch:=4", "-p", "cpu_threads:=1", "-p", "narrate_every:=3",
            "-p", "max_new_tokens:=4", "-p", "action_dt:=0.1", "-p", "rate_hz:=10.0",
            "-p", "max_image_age_s:=2.0", "-p", "max_state_age_s:=2.0",
            "-p", "output.handover:=rtc_guided", "-p", "output.rtc_execution_horizon:=6"]
    server = subprocess.Popen([sys.executable, "-m", "oxygen_ros.nodes.fleet_node", "--ros-args", *args],
                              env=ros_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    nodes = {r: rclpy.create_node("robot_side", namespace=f"/{r}", context=ros_context) for r in robots}
    sensors = {r: SensorPublisher(nodes[r], CAMERAS, JOINTS) for r in robots}
    lock = threading.Lock()
    chunks = {r: [] for r in robots}
    values = {}

    def keep(r):
        return lambda msg: chunks[r].append((time.monotonic(), msg))

    def on_diagnostics(msg):
        with lock:
            values.update({s.name.split(":")[0].strip("/"): {kv.key: kv.value for kv in s.values}
                           for s in msg.status})

    for r in robots:
        nodes[r].create_subscription(JointTrajectory, "action_chunk", keep(r), 100)
    nodes["fresh"].create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 50)
    spinner = Spinner(ros_context, nodes.values())

    def counter(robot, name):
        with lock:
            return int(values.get(robot, {}).get(name, "0"))

    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and server.poll() is None:
            for r in robots:
                sensors[r].publish_frame(nodes[r].get_clock().now().nanoseconds - BEHIND_NS[r])
            time.sleep(0.1)
            if counter("fresh", "rtc_guided") >= 8 and counter("behind", "rtc_guided") >= 8 and \
                    counter("late", "rtc_plain_delay") >= 5:
                break
        with lock:
            seen = {r: dict(values.get(r, {})) for r in robots}
    finally:
        spinner.close(nodes.values())
        rc = stop_process(server)
        output = server.stdout.read()
    assert rc == 0, output
    assert "Traceback" not in output, output
    assert int(seen["fresh"]["rtc_guided"]) >= 8 and int(seen["behind"]["rtc_guided"]) >= 8, seen
    # each robot's own delay: the one whose frames are older waits more steps for its chunks
    assert 1 <= int(seen["fresh"]["rtc_delay_steps"]) < int(seen["behind"]["rtc_delay_steps"]) < 6, seen
    # a delay at or beyond the execution horizon: plain, counted and logged; the robot keeps getting chunks
    assert int(seen["late"]["rtc_plain_delay"]) >= 5 and int(seen["late"]["rtc_guided"]) == 0, seen
    assert len(chunks["late"]) >= 5
    assert "real-time chunking: frame sampled without guidance (delay)" in output
    # the guided robots' chunks take over where the executed ones are; the plain robot's jump
    halves = [first_point_gaps(chunks[r]) for r in ("fresh", "behind")]  # the start is plain (warm-up)
    guided = [g for gaps in halves for g in gaps[len(gaps) // 2:] if g is not None]
    plain = [g for g in first_point_gaps(chunks["late"]) if g is not None]
    assert len(guided) >= 6 and len(plain) >= 3, (guided, plain)
    assert np.median(guided) < 0.25 * np.median(plain), (guided, plain)
