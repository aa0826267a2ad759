"""The VLA node's outputs for real controllers, over real DDS: joint groups on their own topics in robot units,
a hand-over policy shaping what is published, and a clock mismatch named with its fix."""

import re
import threading
import time

import numpy as np
import pytest
from test_vla_node_ros import (
    ALOHA,
    CAMERAS,
    REPO,
    STARTUP_TIMEOUT_S,
    Robot,
    Spinner,
    drive,
    start_node,
    wait_until,
)
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.control.trajectory_rules import ControllerSettings
from oxygen_ros.data.episode import ALOHA_JOINT_NAMES
from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.nodes.conversions import trajectory_refusal
from oxygen_ros.nodes.vla_node import main as vla_node_main

CONTROLLERS = REPO / "config" / "aloha_controllers.yaml"
GROUP_TOPICS = {"left_arm": "left_arm_controller/joint_trajectory",
                "right_arm": "right_arm_controller/joint_trajectory",
                "left_gripper": "left_gripper_controller/joint_trajectory",
                "right_gripper": "right_gripper_controller/joint_trajectory"}
CLOSED, OPEN = -0.6213, 1.4910  # the shipped file's gripper range (rad)
STEP_NS = 100_000_000
KINDS = ("vla_node", "fleet_node")


def points(msg: JointTrajectory) -> tuple[np.ndarray, np.ndarray]:
    """(absolute time of each point in ns, positions [n, joints])."""
    stamp = stamp_to_ns(msg.header.stamp)
    times = np.array([stamp + stamp_to_ns(p.time_from_start) for p in msg.points])
    return times, np.array([p.positions for p in msg.points])


class Trajectories:
    """Every JointTrajectory heard on the given topics of `node`, by topic."""

    def __init__(self, node, topics):
        self.lock = threading.Lock()
        self.node = node
        self.heard = {topic: [] for topic in topics}
        # id(msg) -> when it arrived: the middleware's reception time (system clock, as the node's stamps), not when
        # this process's executor got round to it (on a loaded machine that can be much later)
        self.received: dict[int, int] = {}
        for topic in topics:
            node.create_subscription(JointTrajectory, topic,
                                     lambda msg, info, t=topic: self._keep(t, msg, info["received_timestamp"]), 100)

    def _keep(self, topic: str, msg: JointTrajectory, received_ns: int) -> None:
        received_ns = received_ns or self.node.get_clock().now().nanoseconds  # 0: the middleware gives none
        with self.lock:
            self.heard[topic].append(msg)
            self.received[id(msg)] = received_ns

    def refusals(self) -> list[tuple[str, str]]:
        """(topic, why) for each message a joint_trajectory_controller with Jazzy's and Kilted's defaults, owning
        exactly the message's joints, would refuse when it arrived as it did here, "ends in the past" included (the
        node refuses a plan that has ended before it goes out, so only transport could make one late)."""
        with self.lock:
            return [(topic, why) for topic, messages in self.heard.items() for msg in messages
                    if (why := trajectory_refusal(msg, ControllerSettings(tuple(msg.joint_names)),
                                                  self.received[id(msg)])) is not None]

    def get(self, topic: str) -> list[JointTrajectory]:
        with self.lock:
            return list(self.heard[topic])


@pytest.mark.parametrize("kind", KINDS)
def test_groups_publish_their_joints_in_robot_units_and_temporal_ensemble_holds_the_oldest_prediction(
        ros_context, ros_env, model_cache, kind):
    """For the VLA node's robot and a fleet node's (the same groups, in its namespace)."""
    from test_vla_node_safety import sides, start

    robot, = sides(kind, ros_context, topics=["action_chunk", *GROUP_TOPICS.values()])
    heard = robot.heard
    spinner = Spinner(ros_context, [robot.node])
    # m = 50: the oldest prediction for a step outweighs the next by e^50, so once a step is planned, every later
    # plan repeats its value (newest_wins would replace it with the newer chunk's).
    child = start(kind, ros_env, model_cache, CONTROLLERS, rate=10.0,
                  extra=("-p", "output.handover:=temporal_ensemble", "-p", "output.temporal_ensemble_m:=50.0"))
    try:
        def enough() -> bool:
            robot.frame(None)  # the sensors' own joint state
            time.sleep(1 / 30)
            return all(len(heard.get(t)) >= 8 for t in heard.heard)

        assert wait_until(enough, STARTUP_TIMEOUT_S, child), ({t: len(m) for t, m in heard.heard.items()},
                                                               robot.values, child.stop()[1])
        child.note_shm()
        rc, output = child.stop()
    finally:
        child.stop()
        spinner.close([robot.node])
    assert rc == 0, output
    if kind == "vla_node":  # its start-up line
        assert "hand-over temporal_ensemble" in output and "left_arm -> /left_arm_controller/joint_trajectory" in \
            output

    chunks = heard.get("action_chunk")
    assert all(list(m.joint_names) == list(ALOHA_JOINT_NAMES) for m in chunks)
    by_stamp: dict[int, list[np.ndarray]] = {}
    for msg in chunks:
        by_stamp.setdefault(stamp_to_ns(msg.header.stamp), []).append(points(msg)[1])
    expected_joints = {
        "left_arm": ALOHA_JOINT_NAMES[:6], "right_arm": ALOHA_JOINT_NAMES[7:13],
        "left_gripper": (ALOHA_JOINT_NAMES[6],), "right_gripper": (ALOHA_JOINT_NAMES[13],)}
    for group, topic in GROUP_TOPICS.items():
        columns = [ALOHA_JOINT_NAMES.index(j) for j in expected_joints[group]]
        gripper = group.endswith("gripper")
        messages = heard.get(topic)
        # The node's exit holds every group once, after its last plan: one point at the measured positions (the
        # joint state, in the command's units) in the controller's units, grippers mapped like the plans.
        hold = messages[-1]
        assert stamp_to_ns(hold.header.stamp) == 0 and len(hold.points) == 1
        measured = np.array(robot.sensors.joint_msg(0).position)[columns]  # what the robot side publishes
        np.testing.assert_allclose(hold.points[0].positions,
                                   CLOSED + (OPEN - CLOSED) * measured if gripper else measured, atol=1e-12)
        for msg in messages:
            assert list(msg.joint_names) == list(expected_joints[group])
            if stamp_to_ns(msg.header.stamp) == 0:
                continue  # a hold, not a plan
            values = points(msg)[1]
            # The same plan as action_chunk's (same stamp), these joints only, grippers scaled to the robot's range.
            whole = [c[:, columns] for c in by_stamp.get(stamp_to_ns(msg.header.stamp), []) if len(c) == len(values)]
            robot_units = [CLOSED + (OPEN - CLOSED) * c if gripper else c for c in whole]
            assert any(np.allclose(values, r, atol=1e-9) for r in robot_units), (group, values, whole)
            if gripper:
                assert not any(np.allclose(values, c, atol=1e-3) for c in whole)  # really mapped

    # Temporal ensemble on the control grid: every point lies on one grid of 0.1 s steps, and where two plans
    # cover the same step they publish the same value (the oldest prediction's).
    all_times = np.concatenate([points(m)[0] for m in chunks])
    assert np.all((all_times - all_times[0]) % STEP_NS == 0)
    planned: dict[int, np.ndarray] = {}
    overlaps = 0
    for msg in sorted(chunks, key=lambda m: stamp_to_ns(m.header.stamp)):
        for t, value in zip(*points(msg), strict=True):
            if t in planned:
                overlaps += 1
                np.testing.assert_allclose(value, planned[t], atol=1e-9)
            planned[int(t)] = value
    assert overlaps >= 10
    assert len({v.tobytes() for v in planned.values()}) > 1  # the model does move
    assert heard.refusals() == []  # every plan and hold, on every topic


def test_frames_stamped_hours_off_the_node_clock_are_named_with_the_fix(ros_context, ros_env, model_cache):
    robot = Robot(ros_context)
    spinner = Spinner(ros_context, [robot.node])
    child = start_node(ros_env, model_cache, "-p", "control.rate_hz:=10.0", "-p", "control.max_image_age_s:=0.5")
    hours = 3 * 3600 * 10**9
    try:
        assert wait_until(lambda: robot.last_status() is not None, STARTUP_TIMEOUT_S, child), child.stop()[1]
        child.note_shm()
        robot.recovers(60, child)  # on the node's clock: it acts

        def replayed() -> bool:  # a bag recorded three hours ago, played without --clock
            robot.sensors.publish_frame(robot.node.get_clock().now().nanoseconds - hours)
            time.sleep(1 / 30)
            # the status and /diagnostics are two publications: wait until both say so
            return (robot.last_status().state == "clock_mismatch"
                    and "behind the node clock" in robot.diagnostics[-1].message)

        assert wait_until(replayed, 20, child), robot.last_values()
        diagnostics = robot.diagnostics[-1]
        for text in (diagnostics.message, robot.last_values()["clock_mismatch"]):
            # 3 h behind, however late the frame was handled on a loaded machine (10800.1 s)
            assert re.search(rf"{CAMERAS[0]} arrives stamped 10800\.\d s behind the node clock", text), text
            assert "`ros2 bag play --clock`" in text and "use_sim_time:=true" in text, text
        assert "newest image from" in diagnostics.message  # the skipped tick's own reason stays
        assert int(robot.last_values()["dropped_stale_frame"]) >= 1
        drive(robot, 0.5)
        robot.recovers(30, child)  # stamps on the node's clock again: it acts, the hint is gone
        assert wait_until(lambda: robot.last_values().get("clock_mismatch") == "none", 10, child)
        rc, output = child.stop()
    finally:
        child.stop()
        spinner.close([robot.node])
    assert rc == 0, output
    warnings = [line for line in output.splitlines() if "clock mismatch: " + CAMERAS[0] in line]
    assert len(warnings) == 1, output  # once per source and condition, not once per frame
    assert "play it with `ros2 bag play --clock` and start the node with use_sim_time:=true" in warnings[0]
    assert re.search(r"clock mismatch: joint_states arrives stamped 10800\.\d s behind", output), output
    assert f"clock mismatch over: {CAMERAS[0]}" in output
    assert "not acting (clock_mismatch)" in output


def test_bad_groups_are_one_clear_start_up_line(capfd, tmp_path, monkeypatch):
    # The node's own main() with the arguments ros2 run would pass; it stops before building the model.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    files = ["--ros-args", "--params-file", str(ALOHA), "--params-file", str(CONTROLLERS)]
    for override, message in (
            ("output.left_arm.joints:=[left_waist,left_thumb]",
             "output.left_arm.joints: ['left_thumb'] are not in joints.action_names"),
            ("output.right_gripper.joints:=[left_gripper]",
             "output.right_gripper.joints: left_gripper (also in left_gripper): a joint belongs to one group only"),
            ("output.groups:=[left_arm,spare]", "output.spare.joints is not set"),
            ("output.right_arm.topic:=left_arm_controller/joint_trajectory",
             "output.right_arm.topic 'left_arm_controller/joint_trajectory' is also group left_arm's"),
            ("output.right_arm.scale:=[1.0,2.0]", "output.right_arm.scale must be a finite number or a list of 6"),
            ("output.handover:=average", "output.handover must be one of newest_wins | temporal_ensemble | rtc"),
            ("output.left_arm.max_jump:=-1.0", "output.*.{lower, upper, max_velocity, max_jump}: max_jump must be "
                                               "> 0, not for ['left_waist', "),
            ("robot_description:=<robot", "robot_description is not a URDF that parses"),
            (("output.left_gripper.lower:=2.0", "output.left_gripper.upper:=1.0"),
             "output.*.{lower, upper, max_velocity, max_jump}: lower limit above upper for left_gripper (2 > 1)"),
            ("output.right_arm.max_velocity:=.nan", "output.right_arm.max_velocity must be a number (not NaN)"),
            ('robot_description:=<robot name="one_link"><link name="base"/></robot>',
             "robot_description (robot 'one_link') has no joints ['left_waist', ")):
        overrides = (override,) if isinstance(override, str) else override
        assert vla_node_main([*files, *(arg for value in overrides for arg in ("-p", value))]) == 1
        err = capfd.readouterr().err
        assert f"cannot start: {message}" in err and err.count("cannot start") == 1, err
        assert "Traceback" not in err
