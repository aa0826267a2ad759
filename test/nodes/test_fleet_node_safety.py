"""The fleet node's robots get the VLA node's command path, over real DDS: the same walk as the VLA node's
`test_lifecycle_holds_and_limits_from_a_urdf` (test_vla_node_safety.py; its parameter file, URDF and hold helpers),
now for two namespaced robots served by one fleet node. Nothing is commanded before activation; a plan whose first
point is past `max_jump` is refused and the robot held; a robot whose cameras go silent is held within one control
period (the fleet node's input check, every 1 / rate_hz) while the other robot goes on; deactivating holds every
robot; the process's exit holds them again; the URDF's position range clamps every robot's plans, and its slow
joint stretches them. And issue 45's implausible states and non-finite holds, per fleet robot."""

import time

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import Transition
from test_replay_node import Child
from test_vla_node_controllers import Trajectories, points
from test_vla_node_ros import STARTUP_TIMEOUT_S, Spinner, diagnostic_values, wait_until
from test_vla_node_safety import (
    GRIPPER,
    REST,
    SLOW,
    TOPICS,
    WAIST,
    Lifecycle,
    holds_of,
    implausible_state_outputs,
    is_hold,
    plans_of,
    safety_file,
    urdf,
)

from oxygen_ros.data.episode import ALOHA_JOINT_NAMES
from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.nodes.latency_probe import SensorPublisher

ROBOTS = ("robot1", "robot2")
CAMERAS = ["camera/base_0_rgb/image_raw", "camera/left_wrist_0_rgb/image_raw"]  # the tiny preset's cameras


class FleetRobot:
    """The test's side of one fleet robot: its sensors, what its groups' controllers and action_chunk hear, and
    its /diagnostics values."""

    def __init__(self, context, name: str):
        self.node = rclpy.create_node(f"{name}_side", namespace=name, context=context)
        self.sensors = SensorPublisher(self.node, CAMERAS, ALOHA_JOINT_NAMES)
        self.heard = Trajectories(self.node, ["action_chunk", *TOPICS.values()])
        self.values: dict[str, str] = {}
        self.messages: list[str] = []
        ours = f"/{name}: fleet engine"
        self.node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: self._keep(
            [s for s in m.status if s.name == ours]), 50)

    def _keep(self, statuses) -> None:
        for status in statuses:
            self.values = diagnostic_values(status)
            self.messages.append(status.message)

    def frame(self, state: list[float], images: bool = True) -> None:
        stamp = self.node.get_clock().now().nanoseconds
        if images:
            for index, pub in enumerate(self.sensors.image_pubs):
                pub.publish(self.sensors.image_msg(index, stamp))
        self.sensors.joint_pub.publish(self.sensors.joint_msg(stamp, state))

    def counts(self) -> dict[str, int]:
        return {group: len(holds) for group, holds in holds_of(self.heard).items()}

    def plans(self) -> int:
        return len(plans_of(self.heard, "rest"))


def test_fleet_robots_get_the_vla_nodes_holds_and_limits(ros_context, ros_env, model_cache, tmp_path):
    description = urdf({WAIST: (-0.01, 0.01, 1e6), SLOW: (-50.0, 50.0, 0.001)})
    params = safety_file(tmp_path / "safety.yaml", {"max_jump": 0.5}, autostart=False, robot_description=description,
                         limits={"policy": "clamp"})
    rate, max_age = 10.0, 1.0
    robots = {name: FleetRobot(ros_context, name) for name in ROBOTS}
    one, two = robots.values()
    lifecycle = Lifecycle(one.node, "/fleet_server")
    spinner = Spinner(ros_context, [r.node for r in robots.values()])
    child = Child(["-m", "oxygen_ros.nodes.fleet_node", "--ros-args", "--params-file", params,
                   "-p", f"robots:={list(ROBOTS)}", "-p", "robot_models:=[a, a]", "-p", "models:=['a=tiny:0']",
                   "-p", f"joint_names:={list(ALOHA_JOINT_NAMES)}", "-p", "slo_ms:=5000.0", "-p", f"rate_hz:={rate}",
                   "-p", f"action_dt:={1 / rate}", "-p", f"max_image_age_s:={max_age}", "-p", "max_state_age_s:=1.0",
                   "-p", "narrate_every:=0", "-p", "cpu_threads:=1", "-p", "max_batch:=2", "-p", "status_rate_hz:=10.0"],
                  dict(ros_env, XDG_CACHE_HOME=str(model_cache)))
    state = list(np.linspace(-0.5, 0.5, len(ALOHA_JOINT_NAMES)))
    state[0] = 0.0  # left_waist measured at 0: within max_jump of the plans (clamped to +-0.01)
    silent: set[str] = set()  # robots whose cameras are silent

    def feed(seconds: float, until=None, waist: dict | None = None) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for name, robot in robots.items():
                robot.frame([(waist or {}).get(name, 0.0), *state[1:]], images=name not in silent)
            time.sleep(1 / 30)
            if until is not None and until():
                return True
        return until is None or until()

    def heard_all() -> dict:
        return {(name, t): len(r.heard.get(t)) for name, r in robots.items() for t in r.heard.heard}

    try:
        assert wait_until(lifecycle.change.service_is_ready, STARTUP_TIMEOUT_S, child), child.stop()[1]
        child.note_shm()
        feed(1.5)  # autostart false: nothing is commanded
        assert not any(heard_all().values()), "commanded before activation"
        assert lifecycle.transition(Transition.TRANSITION_CONFIGURE) and lifecycle.state() == "inactive"
        feed(1.0)
        assert not any(heard_all().values()), "commanded while inactive"
        assert lifecycle.transition(Transition.TRANSITION_ACTIVATE) and lifecycle.state() == "active"
        assert feed(60, until=lambda: one.plans() >= 5 and two.plans() >= 5), (one.values, two.values)
        assert one.counts() == two.counts() == {"waist": 0, "rest": 0}

        # robot1's first point far from its measured state (left_waist at 3.0, max_jump 0.5): refused, one hold
        # per group however many plans are refused after it; robot2 goes on.
        assert feed(30, until=lambda: one.counts() == {"waist": 1, "rest": 1}, waist={"robot1": 3.0}), one.values
        refused_at, two_at = one.plans(), two.plans()
        feed(1.0, waist={"robot1": 3.0})
        assert one.counts() == {"waist": 1, "rest": 1} and one.plans() == refused_at
        assert two.counts() == {"waist": 0, "rest": 0} and two.plans() > two_at
        assert wait_until(lambda: one.values.get("state") == "limit_rejected", 10), one.values
        assert one.values["limits_rejected_joints"].startswith(f"{WAIST}: ") and "jump limit" in one.messages[-1]
        waist_hold, rest_hold = holds_of(one.heard)["waist"][0], holds_of(one.heard)["rest"][0]
        # held at the measured 3.0 clamped into the URDF's range (+-0.01), never outside the limits
        assert list(waist_hold.joint_names) == [WAIST] and [p.positions[0] for p in waist_hold.points] == [0.01]
        assert list(rest_hold.joint_names) == REST and not rest_hold.points  # `hold: empty`
        assert feed(30, until=lambda: one.plans() > refused_at + 2)

        # robot1's cameras go silent (its joint states go on): one hold per group once its frames are stale.
        silent.add("robot1")
        silent_from, two_at = time.monotonic(), two.plans()
        assert feed(20, until=lambda: one.counts() == {"waist": 2, "rest": 2}), one.values
        held_after = time.monotonic() - silent_from
        feed(1.0)
        assert one.counts() == {"waist": 2, "rest": 2} and one.values["last_hold_reason"] == "stale_frame"
        assert two.counts() == {"waist": 0, "rest": 0} and two.plans() > two_at
        # As the VLA node's test: the last image turns stale max_age after it was sent, and the next input check
        # (at most one control period later) holds; the 2 s on top are room for a loaded machine, no promise.
        assert held_after < max_age + 1 / rate + 2.0, held_after
        silent.clear()
        resumed_from = one.plans()
        assert feed(30, until=lambda: one.plans() > resumed_from + 2)

        # Deactivate: every robot's plans stop, one hold per group of each; inputs go on, nothing more is sent.
        assert lifecycle.transition(Transition.TRANSITION_DEACTIVATE) and lifecycle.state() == "inactive"
        assert wait_until(lambda: one.counts() == {"waist": 3, "rest": 3}
                          and two.counts() == {"waist": 1, "rest": 1}, 10), (one.counts(), two.counts())
        sent = heard_all()
        feed(1.5)
        assert heard_all() == sent
        # Active again, then the process is stopped: its exit holds every robot once more.
        assert lifecycle.transition(Transition.TRANSITION_ACTIVATE)
        before = (one.plans(), two.plans())
        assert feed(60, until=lambda: one.plans() > before[0] + 2 and two.plans() > before[1] + 2)
        rc, output = child.stop()
        assert wait_until(lambda: one.counts() == {"waist": 4, "rest": 4}
                          and two.counts() == {"waist": 2, "rest": 2}, 10), (one.counts(), two.counts())
    finally:
        child.stop()
        spinner.close([r.node for r in robots.values()])
    assert rc == 0, output

    # The URDF's range clamps every robot's waist plans although the model's own values leave it (action_chunk
    # carries those); every group plan is slowed for right_waist's 0.001 rad/s.
    step_ns = round(1e9 / rate)
    slow, max_velocity = REST.index(SLOW), 0.001
    for robot in robots.values():
        waist = np.concatenate([points(m)[1][:, 0] for m in plans_of(robot.heard, "waist")])
        model = np.concatenate([points(m)[1][:, 0] for m in robot.heard.get("action_chunk")])
        assert np.abs(waist).max() <= 0.01 + 1e-12 and np.abs(model).max() > 0.01
        for waist_plan, rest_plan in zip(plans_of(robot.heard, "waist"), plans_of(robot.heard, "rest"), strict=True):
            offsets = [stamp_to_ns(p.time_from_start) for p in rest_plan.points]
            assert offsets[0] > step_ns and np.allclose(np.diff(offsets), offsets[0], rtol=1e-6), offsets
            assert waist_plan.header.stamp == rest_plan.header.stamp
            times, positions = points(rest_plan)
            speeds = np.abs(np.diff(positions[:, slow])) / (np.diff(times) / 1e9)
            assert max_velocity * (1 - 1e-6) <= speeds.max() <= max_velocity * (1 + 1e-6), (speeds, offsets)
        assert int(robot.values["limits_clamped"]) > 0 and int(robot.values["limits_slowed"]) > 0, robot.values
        assert robot.values["limits"] == "clamp", robot.values
    assert int(one.values["holds_sent"]) == 6 and int(two.values["holds_sent"]) == 2, (one.values, two.values)


def test_a_fleet_robots_implausible_states_and_non_finite_holds_never_reach_a_controller(ros_context, ros_env,
                                                                                        model_cache, tmp_path):
    """Issue 45 H2 and H3 for a fleet robot, as the VLA node's test of them (test_vla_node_safety.py): +10 rad waist
    states among good ones are dropped, so no plan or hold leaves the waist's range; a hold from a 1e308 gripper
    state (offset + 2.1123 * 1e308) is refused rather than sent as +inf."""
    topics, params = implausible_state_outputs(tmp_path)
    robot = FleetRobot(ros_context, "robot1")
    heard = Trajectories(robot.node, [topics["gripper"]])
    spinner = Spinner(ros_context, [robot.node])
    child = Child(["-m", "oxygen_ros.nodes.fleet_node", "--ros-args", "--params-file", str(params),
                   "-p", "robots:=[robot1]", "-p", f"joint_names:={list(ALOHA_JOINT_NAMES)}", "-p", "slo_ms:=5000.0",
                   "-p", "rate_hz:=10.0", "-p", "action_dt:=0.1", "-p", "max_state_age_s:=0.5",
                   "-p", "narrate_every:=0", "-p", "cpu_threads:=1", "-p", "status_rate_hz:=10.0"],
                  dict(ros_env, XDG_CACHE_HOME=str(model_cache)))
    good = [0.0] * len(ALOHA_JOINT_NAMES)
    jumped, huge = list(good), list(good)
    jumped[ALOHA_JOINT_NAMES.index(WAIST)] = 10.0
    huge[ALOHA_JOINT_NAMES.index(GRIPPER)] = 1e308

    def feed(seconds: float, until=None, state=None, joints: bool = True) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            stamp = robot.node.get_clock().now().nanoseconds
            for index, pub in enumerate(robot.sensors.image_pubs):
                pub.publish(robot.sensors.image_msg(index, stamp))
            if joints:
                robot.sensors.joint_pub.publish(robot.sensors.joint_msg(stamp, good if state is None else state))
            time.sleep(1 / 30)
            if until is not None and until():
                return True
        return until is None or until()

    try:
        assert feed(STARTUP_TIMEOUT_S, until=lambda: robot.plans() >= 3 or child.process.poll() is not None), \
            robot.values
        assert robot.plans() >= 3, child.stop()[1]
        child.note_shm()
        # H2: +10 rad states among good ones at 30 Hz, each 33 ms after a state at 0 (2 rad/s allows 0.07 rad)
        for _ in range(20):
            for state in (jumped, good):
                robot.sensors.joint_pub.publish(robot.sensors.joint_msg(robot.node.get_clock().now().nanoseconds,
                                                                        state))
                time.sleep(1 / 30)
        plans = robot.plans()
        assert feed(30, until=lambda: robot.plans() >= plans + 3), robot.values
        # H3: the gripper's state at 1e308 (no velocity limit on it: plausible), then no joint state at all
        feed(1.5, state=huge)
        assert feed(20, until=lambda: int(robot.values.get("holds_refused", 0)) >= 1, joints=False), robot.values
    finally:
        rc, log = child.stop()
        spinner.close([robot.node])
    assert rc == 0, log
    for group, topic in topics.items():
        for msg in robot.heard.get(topic) if topic in robot.heard.heard else heard.get(topic):
            for point in msg.points:
                assert np.isfinite(point.positions).all(), (group, list(point.positions))
                if group == "waist":  # plans and holds within the range, never the jumped state
                    assert -1.0 <= point.positions[0] <= 1.0, list(point.positions)
    assert any(is_hold(m) for m in robot.heard.get(topics["waist"]))
    assert "moved faster than its velocity limit" in log and "no hold sent to gripper" in log, log[-3000:]
