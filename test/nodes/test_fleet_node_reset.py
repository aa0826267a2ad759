"""An episode boundary per robot in the fleet node over real DDS: `/<robot>/reset` (std_srvs/Trigger).

Two robots on one tiny model, guided (`output.handover: rtc_guided`), frames stamped now at 10 Hz without a gap.
After robot `a`'s reset its next chunk is sampled plainly (nothing of its previous episode is executed any more), no
chunk of a frame stamped before the call is published, a late frame of its previous episode is dropped, guidance
resumes with the delay estimate kept; robot `b` is not touched.
"""

import subprocess
import sys
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
from std_srvs.srv import Trigger
from test_fleet_node_rtc import CAMERAS, JOINTS
from test_vla_node_ros import Spinner
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.nodes.latency_probe import SensorPublisher

from ros_test_utils import rclpy, stop_process


def test_a_robots_reset_starts_its_episode_plain_and_leaves_the_other_robot_alone(ros_env, ros_context):
    robots = ["a", "b"]
    args = ["-p", "models:=['m=tiny:0']", "-p", f"robots:={robots}", "-p", "robot_models:=[m, m]",
            "-p", "slo_ms:=5000.0", "-p", "max_batch:=4", "-p", "cpu_threads:=1", "-p", "narrate_every:=0",
            "-p", "action_dt:=0.1", "-p", "rate_hz:=10.0", "-p", "max_image_age_s:=2.0",
            "-p", "max_state_age_s:=2.0", "-p", "output.handover:=rtc_guided"]
    server = subprocess.Popen([sys.executable, "-m", "oxygen_ros.nodes.fleet_node", "--ros-args", *args],
                              env=ros_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    nodes = {r: rclpy.create_node("robot_side", namespace=f"/{r}", context=ros_context) for r in robots}
    sensors = {r: SensorPublisher(nodes[r], CAMERAS, JOINTS) for r in robots}
    client = nodes["a"].create_client(Trigger, "reset")
    lock = threading.Lock()
    chunks = {r: [] for r in robots}
    values = {}

    def on_diagnostics(msg):
        with lock:
            values.update({s.name.split(":")[0].strip("/"): {kv.key: kv.value for kv in s.values}
                           for s in msg.status})

    for r in robots:
        nodes[r].create_subscription(JointTrajectory, "action_chunk",
                                     lambda msg, r=r: chunks[r].append(stamp_to_ns(msg.header.stamp)), 100)
    nodes["a"].create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 50)
    spinner = Spinner(ros_context, nodes.values())

    def seen(robot) -> dict:
        with lock:
            return dict(values.get(robot, {}))

    def drive_until(condition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and server.poll() is None:
            for r in robots:
                sensors[r].publish_frame()
            time.sleep(0.1)
            if condition():
                return True
        return False

    try:
        assert drive_until(lambda: all(int(seen(r).get("rtc_guided", "0")) >= 4 for r in robots), 240), values
        assert client.wait_for_service(timeout_sec=10.0)
        before = seen("a")  # robot b's frames go on across the call, robot a's resume after it
        called_ns = nodes["a"].get_clock().now().nanoseconds
        future = client.call_async(Trigger.Request())
        deadline = time.monotonic() + 30
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert future.done() and future.result().success, future.result()
        # a status from after the reset
        assert drive_until(lambda: seen("a").get("resets") == "1", 30), seen("a")
        b_before = seen("b")
        with lock:
            a_before = len(chunks["a"])
        late = set()  # the previous episode's frames, late (best-effort cameras: one of the three is enough)
        for k in range(1, 4):
            late.add(sensors["a"].publish_frame(called_ns - k * 1_000_000))
            time.sleep(0.1)
        guided = int(seen("a")["rtc_guided"])
        b_guided = int(b_before["rtc_guided"])  # robot b's status is read as it comes: wait for one after a's
        assert drive_until(lambda: int(seen("a").get("rtc_guided", "0")) >= guided + 4
                           and int(seen("a").get("dropped_frames", "0")) >= 1
                           and int(seen("b").get("rtc_guided", "0")) > b_guided, 120), (seen("a"), seen("b"))
        after, b_after = seen("a"), seen("b")
        with lock:
            new = chunks["a"][a_before:]
    finally:
        spinner.close(nodes.values())
        rc = stop_process(server)
        output = server.stdout.read()
    assert rc == 0, output
    assert "Traceback" not in output, output
    # robot a: the first chunk after the reset plain, then guided with the estimate it had; nothing of before
    assert int(after["rtc_plain_no_chunk"]) >= int(before["rtc_plain_no_chunk"]) + 1, (before, after)
    assert after["rtc_plain_no_estimate"] == before["rtc_plain_no_estimate"], (before, after)
    assert new and min(new) > called_ns and not late & set(new), [s - called_ns for s in new]
    assert int(after["dropped_frames"]) >= 1, after
    assert "/a: reset (1 so far)" in output
    # robot b: not reset, still guided
    assert b_after["resets"] == "0" and int(b_after["rtc_guided"]) > int(b_before["rtc_guided"]), (b_before, b_after)
