"""The fleet node's configure in this process (its serving over DDS is test_fleet_node's): a robot's embodiment
that does not fit what its model's checkpoint was trained in stops the configure with the reason unless
`embodiment_override`; an `embodiments` list that is neither one for all nor one per robot is refused; the decode
policy parameters reach the scheduler; the VLA node's output parameters give every robot its groups (in its
namespace) and limits, and groups that do not fit the robots' joints, or a group topic outside the robots'
namespaces, stop the configure with the reason; a robot's own `per_robot.<robot>.*` values (limits, policy, joints,
groups, state units) override the node's for it alone, and a bad one stops the configure naming the robot."""

import pytest
import rclpy
from rclpy.lifecycle import TransitionCallbackReturn
from test_vla_node_checkpoint_startup import checkpoint

from oxygen_ros.nodes.fleet_node import FleetNode


@pytest.fixture
def configured(ros_domain_id):
    """configure(*overrides) -> (the node, the configure's result); every node made is destroyed afterwards."""
    made = []

    def configure(*overrides: str):
        context = rclpy.Context()
        args = ["fleet_node", "--ros-args", "-p", "autostart:=false", "-p", "narrate_every:=0"]
        for override in overrides:
            args += ["-p", override]
        rclpy.init(args=args, context=context, domain_id=ros_domain_id)
        node = FleetNode(context=context)
        made.append((node, context))
        return node, node.trigger_configure()

    yield configure
    for node, context in made:
        node.close()
        node.destroy_node()
        context.try_shutdown()
        context.destroy()


def test_an_embodiment_the_checkpoint_was_not_trained_in_stops_the_configure_unless_overridden(tmp_path,
                                                                                               configured):
    folder = checkpoint(tmp_path / "ckpt")  # marked as trained in the aloha embodiment
    node, result = configured(f"models:=['a={folder}']", "robots:=[arm]", "robot_models:=[a]",
                              "embodiments:=[droid]")
    assert result == TransitionCallbackReturn.FAILURE and node.server is None and node.lifecycle == "unconfigured"
    assert node.failure.startswith("embodiment droid of robot arm does not fit model a: ") and \
        "embodiment_override" in node.failure, node.failure

    node, result = configured(f"models:=['a={folder}']", "robots:=[arm]", "robot_models:=[a]",
                              "embodiments:=[aloha]")
    assert result == TransitionCallbackReturn.SUCCESS and node.ports["arm"].embodiment.name == "aloha"

    node, result = configured(f"models:=['a={folder}']", "robots:=[arm]", "robot_models:=[a]",
                              "embodiments:=[droid]", "embodiment_override:=true")
    assert result == TransitionCallbackReturn.SUCCESS and node.ports["arm"].embodiment.name == "droid"


def test_embodiments_are_one_for_all_or_one_per_robot(configured):
    node, result = configured("robots:=[r1,r2,r3]", "robot_models:=[a,a,a]", "embodiments:=[absolute,droid]")
    assert result == TransitionCallbackReturn.FAILURE
    assert node.failure == "embodiments has 2 entries for 3 robots: give one for all or one per robot", node.failure

    node, result = configured("robots:=[r1,r2]", "robot_models:=[a,a]", "embodiments:=[absolute,droid]")
    assert result == TransitionCallbackReturn.SUCCESS
    assert {r: p.embodiment.name for r, p in node.ports.items()} == {"r1": "absolute", "r2": "droid"}


@pytest.mark.parametrize("tokens_per_frame, floor, adaptive, steps", [(0, 3, True, 3), (2, 3, False, 0)])
def test_the_decode_policy_parameters_reach_the_scheduler(configured, tokens_per_frame, floor, adaptive, steps):
    node, result = configured(f"tokens_per_frame:={tokens_per_frame}", f"min_steps_per_frame:={floor}",
                              "max_new_tokens:=16")
    assert result == TransitionCallbackReturn.SUCCESS
    config = node.server.runtime.scheduler.config
    assert config.adaptive_k is adaptive and config.min_steps_per_frame == steps
    assert config.tokens_per_frame == (tokens_per_frame or 16)


def test_output_groups_and_limits_reach_every_robot_or_stop_the_configure(configured):
    joints = "joint_names:=[j0,j1,j2]"
    node, result = configured("robots:=[r1,r2]", "robot_models:=[a,a]", joints, "output.groups:=[arm]",
                              "output.arm.joints:=[j0,j1]", "output.arm.upper:=0.5", "limits.policy:=reject")
    assert result == TransitionCallbackReturn.SUCCESS, node.failure
    for robot, port in node.ports.items():
        assert [g.joints for g in port.path.groups] == [("j0", "j1")] and port.path.policy == "reject"
        assert list(port.path.limits.upper) == [0.5, 0.5]
        assert [p.topic_name for p in port.group_pubs] == [f"/{robot}/arm_controller/joint_trajectory"]

    node, result = configured("robots:=[r1]", "robot_models:=[a]", joints, "output.groups:=[arm]",
                              "output.arm.joints:=[j0,j9]")
    assert result == TransitionCallbackReturn.FAILURE and "robot r1: " in node.failure and "j9" in node.failure, \
        node.failure

    node, result = configured("robots:=[r1]", "robot_models:=[a]", joints, "output.groups:=[arm]",
                              "output.arm.joints:=[j0]", "output.arm.topic:=/arm/joint_trajectory")
    assert result == TransitionCallbackReturn.FAILURE
    assert node.failure == "robot r1: output.arm.topic must be relative: each robot's goes in its namespace", \
        node.failure


def test_each_robot_may_have_its_own_limits_joints_groups_and_state_units(configured):
    """`per_robot.<robot>.<parameter>` overrides the node's value for that robot alone: r2 its arm's upper limit,
    its policy and its joints' units; r3 its own joints and groups; r1 keeps the node's."""
    node, result = configured(
        "robots:=[r1,r2,r3]", "robot_models:=[a,a,a]", "joint_names:=[j0,j1,j2]", "output.groups:=[arm]",
        "output.arm.joints:=[j0,j1]", "output.arm.upper:=0.5", "output.arm.max_jump:=0.3", "limits.policy:=reject",
        "per_robot.r2.output.arm.upper:=[0.2, 0.4]", "per_robot.r2.limits.policy:=clamp",
        "per_robot.r2.joints.state_rename:=['arm/j0=j0']", "per_robot.r2.joints.state_convert:=['j1=linear:1.0:2.0']",
        "per_robot.r3.joint_names:=[k0,k1,k2,k3]", "per_robot.r3.output.groups:=[left,right]",
        "per_robot.r3.output.left.joints:=[k0,k1]", "per_robot.r3.output.right.joints:=[k2,k3]",
        "per_robot.r3.output.right.lower:=-0.1")
    assert result == TransitionCallbackReturn.SUCCESS, node.failure
    one, two, three = (node.ports[r] for r in ("r1", "r2", "r3"))
    assert (one.path.policy, list(one.path.limits.upper), list(one.path.limits.max_jump)) == \
        ("reject", [0.5, 0.5], [0.3, 0.3])
    assert (two.path.policy, list(two.path.limits.upper), list(two.path.limits.max_jump)) == \
        ("clamp", [0.2, 0.4], [0.3, 0.3])  # its own upper limits; the node's max_jump
    assert one.inputs.units.topic_names == ("j0", "j1", "j2") and one.inputs.units.scale == (1.0, 1.0, 1.0)
    assert two.inputs.units.topic_names == ("arm/j0", "j1", "j2")
    assert (two.inputs.units.offset, two.inputs.units.scale) == ((0.0, 1.0, 0.0), (1.0, 2.0, 1.0))
    assert three.joint_names == ("k0", "k1", "k2", "k3")
    assert [(g.name, g.joints) for g in three.path.groups] == [("left", ("k0", "k1")), ("right", ("k2", "k3"))]
    assert list(three.path.limits.lower) == [float("-inf")] * 2 + [-0.1] * 2
    assert [p.topic_name for p in three.group_pubs] == ["/r3/left_controller/joint_trajectory",
                                                       "/r3/right_controller/joint_trajectory"]


@pytest.mark.parametrize("override, line", [
    ("per_robot.r2.limits.policy:=stop", "robot r2: limits.policy must be one of clamp | reject, got 'stop'"),
    ("per_robot.r2.joints.state_convert:=['j1=linear:0.5:0']", "robot r2: joints.state_convert 'j1=linear:0.5:0' is "
                                                             "not invertible"),
    ("per_robot.r2.output.arm.joints:=[j0,j7]", "robot r2: output.arm.joints: ['j7'] are not in"),
])
def test_a_robots_own_bad_value_stops_the_configure_naming_the_robot(configured, override, line):
    node, result = configured("robots:=[r1,r2]", "robot_models:=[a,a]", "joint_names:=[j0,j1,j2]",
                              "output.groups:=[arm]", "output.arm.joints:=[j0,j1]", override)
    assert result == TransitionCallbackReturn.FAILURE and node.failure.startswith(line), node.failure
