"""An ALOHA whose joint_state_broadcaster publishes the grippers in rad under its own joint names, over real DDS:
with `joints.state_rename` and `joints.state_convert` the model gets openpi's `_decode_state` of ALOHA's normalized
state, and the gripper holds are the measured joint angles, inside the joints' range without clamping. Without the
conversion the same robot's open gripper would be held past its open limit (clamped, counted). Each walk runs for
the VLA node's robot and for a fleet node's robot (namespace `arm`, its units and gripper limits its own
`per_robot.arm.*` parameters, its URDF from `/arm/robot_description`)."""

import time
from pathlib import Path

import numpy as np
import pytest
import rclpy
from rclpy.lifecycle import TransitionCallbackReturn
from test_replay_node import Child
from test_vla_node_ros import ARMED, Spinner, wait_until
from test_vla_node_safety import is_hold
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.nodes.latency_probe import SensorPublisher

from ros_test_utils import node_lines

REPO = Path(__file__).resolve().parents[2]
JOINTS = ["left_waist", "left_shoulder", "left_elbow", "left_forearm_roll", "left_wrist_angle", "left_wrist_rotate",
          "left_gripper", "right_waist", "right_shoulder", "right_elbow", "right_forearm_roll", "right_wrist_angle",
          "right_wrist_rotate", "right_gripper"]
# What the broadcaster calls two of them (renamed back by joints.state_rename).
TOPIC_NAMES = ["left/waist" if j == "left_waist" else "right/waist" if j == "right_waist" else j for j in JOINTS]
CLOSE, OPEN = -0.6213, 1.4910  # ALOHA's PUPPET_GRIPPER_JOINT_CLOSE / _OPEN (openpi examples/aloha_real/constants.py)
MEASURED = np.array([0.1, -0.4, 0.6, 0.05, -0.2, 0.3, 1.49, -0.1, -0.5, 0.7, -0.05, 0.25, -0.3, 0.2])
GRIPPERS = {"left_gripper": 6, "right_gripper": 13}
UNITS = ["-p", "joints.state_rename:=[left/waist=left_waist, right/waist=right_waist]",
         "-p", "joints.state_convert:=[left_gripper=aloha_gripper, right_gripper=aloha_gripper]"]


def openpi_decode_state(state: np.ndarray) -> np.ndarray:
    """openpi `src/openpi/policies/aloha_policy.py` `_decode_state` with adapt_to_pi (lines 104-137, 181-187 at
    15a9616), written out: flip, then each gripper's normalized position -> pi's normalized angle."""
    state = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1]) * state
    linear = state[[6, 13]] * (0.05800 - 0.01844) + 0.01844
    angle = np.arcsin(np.clip((0.022**2 + linear**2 - 0.036**2) / (2 * 0.022 * linear), -1.0, 1.0))
    state[[6, 13]] = (angle - 0.5476) / (1.6296 - 0.5476)
    return state


KINDS = ("vla_node", "fleet_node")
ROBOT = "arm"  # the fleet node's robot (its namespace)


def own(kind: str, args: list[str]) -> list[str]:
    """`-p name:=value` overrides as the node takes them for its robot: the fleet node's as the robot's own."""
    prefix = f"per_robot.{ROBOT}." if kind == "fleet_node" else ""
    return [f"{prefix}{arg}" if previous == "-p" else arg for previous, arg in zip(["", *args[:-1]], args, strict=True)]


def node_args(*extra, kind: str = "vla_node") -> list[str]:
    limits = [arg for g in GRIPPERS for arg in ("-p", f"output.{g}.lower:={CLOSE}", "-p", f"output.{g}.upper:={OPEN}")]
    controllers = ["--params-file", str(REPO / "config" / "aloha_controllers.yaml")]
    if kind == "fleet_node":  # one robot of the tiny model, its profile aloha, its joints given
        return ["--ros-args", *controllers, "-p", "autostart:=false", "-p", f"robots:=[{ROBOT}]",
                "-p", "models:=['a=tiny:0']", "-p", "robot_models:=[a]", "-p", "embodiments:=[aloha]",
                "-p", f"joint_names:=[{','.join(JOINTS)}]", "-p", "slo_ms:=5000.0", "-p", "narrate_every:=0",
                "-p", "cpu_threads:=1", "-p", "cpu_kernel:=off", *own(kind, [*limits, *extra])]
    return ["--ros-args", *ARMED, *controllers,
            "-p", "model.preset:=tiny", "-p", "model.dtype:=float32", "-p", "model.cpu_kernel:=off",
            "-p", "cameras.topics:=[a,b]", "-p", "cameras.keys:=[base_0_rgb,left_wrist_0_rgb]",
            "-p", "cameras.compressed:=false", "-p", "control.horizon:=4", "-p", "control.rate_hz:=10.0",
            "-p", "control.max_image_age_s:=0.0", "-p", "control.max_state_age_s:=0.0", *limits, *extra]


def start(kind: str, context):
    """The node of `kind` in this process, and its robot's command path once configured (by name)."""
    from oxygen_ros.nodes.fleet_node import FleetNode
    from oxygen_ros.nodes.vla_node import VlaNode

    if kind == "vla_node":
        return VlaNode(context=context), lambda node: node.path
    return FleetNode(context=context), lambda node: node.ports[ROBOT].path


def run_robot(ros_domain_id, extra: list[str], kind: str) -> tuple[list[np.ndarray], dict[str, list], object]:
    """The node (`kind`) armed on a robot publishing MEASURED under TOPIC_NAMES: the states the model got, the
    gripper holds heard after the node is deactivated once it has commanded, and the robot's command path."""
    context = rclpy.Context()
    rclpy.init(args=[kind, *node_args(*extra, kind=kind)], context=context, domain_id=ros_domain_id)
    node, path_of = start(kind, context)
    if kind == "vla_node":
        robot = rclpy.create_node("robot", context=context)
        sensors = SensorPublisher(robot, ["a", "b"], TOPIC_NAMES)
    else:  # the fleet robot's topics in its namespace, its cameras named by its model's image keys
        robot = rclpy.create_node("robot", namespace=ROBOT, context=context)
        sensors = SensorPublisher(robot, ["camera/base_0_rgb/image_raw", "camera/left_wrist_0_rgb/image_raw"],
                                  TOPIC_NAMES)
    heard: dict[str, list] = {g: [] for g in GRIPPERS}
    for group in GRIPPERS:
        robot.create_subscription(JointTrajectory, f"{group}_controller/joint_trajectory",
                                  lambda msg, g=group: heard[g].append(msg), 100)
    model_states = []
    from oxygen_ros.robots.session import RobotSession

    observe = RobotSession.observation

    def spy(session, images, state):  # the state the model gets: the session's observation, in the model's space
        observation, fitted = observe(session, images, state)
        model_states.append(np.array(observation.state))
        return observation, fitted

    RobotSession.observation = spy
    spinner = Spinner(context, [node, robot])
    try:
        assert node.autostart(), node.failure
        deadline = time.monotonic() + 120
        while not any(not is_hold(m) for m in heard["left_gripper"]) and time.monotonic() < deadline:
            stamp = robot.get_clock().now().nanoseconds
            for index, pub in enumerate(sensors.image_pubs):
                pub.publish(sensors.image_msg(index, stamp))
            sensors.joint_pub.publish(sensors.joint_msg(stamp, MEASURED))
            time.sleep(0.05)
        assert model_states, "the node never acted"
        node.trigger_deactivate()
        assert wait_until(lambda: all(any(is_hold(m) for m in heard[g]) for g in GRIPPERS), 30), heard
        holds = {g: [m for m in heard[g] if is_hold(m)] for g in GRIPPERS}
        return model_states, holds, path_of(node)
    finally:
        RobotSession.observation = observe
        node.close()
        spinner.close([node, robot])
        context.try_shutdown()
        context.destroy()


@pytest.mark.parametrize("kind", KINDS)
def test_grippers_in_rad_reach_the_model_as_openpi_decodes_them_and_hold_inside_their_range(ros_domain_id, kind):
    model_states, holds, path = run_robot(ros_domain_id, UNITS, kind)
    normalized = MEASURED.copy()
    for index in GRIPPERS.values():  # ALOHA's PUPPET_GRIPPER_JOINT_NORMALIZE_FN (constants.py lines 42-44)
        normalized[index] = (MEASURED[index] - CLOSE) / (OPEN - CLOSE)
    np.testing.assert_allclose(model_states[-1], openpi_decode_state(normalized), rtol=1e-12, atol=1e-12)
    for group, index in GRIPPERS.items():
        position = holds[group][-1].points[0].positions[0]
        assert CLOSE <= position <= OPEN
        np.testing.assert_allclose(position, MEASURED[index], atol=1e-9)  # the measured joint angle itself
    assert path.holds_clamped == 0


@pytest.mark.parametrize("kind", KINDS)
def test_without_the_conversion_the_open_gripper_would_be_held_past_its_limit(ros_domain_id, kind):
    model_states, holds, path = run_robot(ros_domain_id, UNITS[:2], kind)  # renamed, not converted
    assert holds["left_gripper"][-1].points[0].positions[0] == pytest.approx(OPEN)  # clamped from -0.62 + 2.11 x 1.49
    assert path.holds_clamped >= 1
    np.testing.assert_allclose(model_states[-1], openpi_decode_state(MEASURED))  # radians taken as positions


@pytest.mark.parametrize("extra,message", [
    (["-p", "joints.state_convert:=['left_gripper=linear:0.5:0']"],
     "joints.state_convert 'left_gripper=linear:0.5:0' is not invertible (state = 0.5 + 0 x measured)"),
    (["-p", "joints.state_convert:=['left_gripper=range:1:1']"], "joints.state_convert 'left_gripper=range:1:1' is not "
                                                              "invertible"),
    (["-p", "joints.state_convert:=[left_gripper=cubic]"], "joints.state_convert 'left_gripper=cubic': expected one "
                                                          "of aloha_gripper | range:LOW:HIGH | linear:OFFSET:SCALE"),
    (["-p", "joints.state_rename:=[x=nowhere]"], "joints.state_rename 'x=nowhere': 'nowhere' is not in "
                                                 "joints.state_names"),
    (["-p", "joints.state_rename:=[left_gripper=right_gripper]"],
     "joints.state_rename: ['left_gripper'] would be read for two state joints"),
])
def test_a_conversion_or_rename_that_cannot_work_is_one_start_up_line(extra, message, ros_env):
    child = Child(["-m", "oxygen_ros.nodes.vla_node", *node_args(*extra)], ros_env)  # a node that starts is stopped
    code, output = child.wait(timeout=120.0)
    assert code == 1, output
    assert f"cannot start: {message}" in output, output
    assert "Traceback" not in output and len(node_lines(output)) == 1, output



@pytest.mark.parametrize("kind", KINDS)
def test_limits_come_from_the_latched_robot_description_topic(ros_domain_id, kind):
    from std_msgs.msg import String
    from test_vla_node_safety import urdf

    from oxygen_ros.nodes.qos import LATCHED_QOS

    context = rclpy.Context()
    rclpy.init(args=[kind, *node_args("-p", "robot_description_wait_s:=30.0", kind=kind)], context=context,
               domain_id=ros_domain_id)
    # as robot_state_publisher does, in the robot's namespace: once, latched, before the node starts
    publisher = rclpy.create_node("robot_state_publisher", namespace=ROBOT if kind == "fleet_node" else "",
                                  context=context)
    try:
        publisher.create_publisher(String, "robot_description", LATCHED_QOS).publish(
            String(data=urdf({"left_gripper": (-0.5, 1.25, 2.0), "right_waist": (-3.0, 3.0, 4.0)})))
        node, path_of = start(kind, context)
        try:
            if kind == "fleet_node":  # the fleet node reads a robot's URDF as it adds the robot
                assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS, node.failure
            limits = path_of(node).limits
            left, waist = limits.joints.index("left_gripper"), limits.joints.index("right_waist")
            # the gripper group's own lower/upper parameters win over the URDF; its velocity comes from the URDF
            assert (limits.lower[left], limits.upper[left], limits.max_velocity[left]) == (CLOSE, OPEN, 2.0)
            assert (limits.lower[waist], limits.upper[waist], limits.max_velocity[waist]) == (-3.0, 3.0, 4.0)
        finally:
            node.close()
            node.destroy_node()
    finally:
        publisher.destroy_node()
        context.try_shutdown()
        context.destroy()


@pytest.mark.parametrize("kind, robot", [("vla_node", ""), ("fleet_node", f"robot {ROBOT}: ")])
def test_no_robot_description_on_the_topic_is_one_start_up_line(ros_env, kind, robot):
    args = node_args("-p", "robot_description_wait_s:=1.0", kind=kind)
    if kind == "fleet_node":
        args += ["-p", "autostart:=true"]
    child = Child(["-m", f"oxygen_ros.nodes.{kind}", *args], ros_env)
    code, output = child.wait(timeout=120.0)
    assert code == 1, output
    topic = f"/{ROBOT}/robot_description" if kind == "fleet_node" else "/robot_description"
    assert f"cannot start: {robot}robot_description_wait_s: no robot_description on {topic} within 1 s" in output
    assert len(node_lines(output)) == 1, output
