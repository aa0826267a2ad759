"""The demo on a ROS 2 install: `ros2 launch oxygen_ros oxygen_demo.launch.py bag:=EPISODE_BAG out_bag:=RUN_BAG`.

Make the episode bag first (`oxygen-ros convert aloha episode_0.hdf5 EPISODE_BAG --task "..."`, or any recorded
ALOHA-layout bag). This starts the VLA node with the installed config/aloha.yaml plus config/demo_tiny.yaml (tiny
preset, random weights, simulated time), the recorder of its outputs, and the replay of the bag with /clock; then
`oxygen-ros report RUN_BAG --episode-bag EPISODE_BAG --out DIR`. `oxygen-ros demo` does all of it in one command.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

ARGUMENTS = (
    ("bag", None, "episode rosbag2 to replay (e.g. written by `oxygen-ros convert`)"),
    ("out_bag", "demo_run_bag", "rosbag2 folder the recorder writes (must not exist)"),
)
RECORDED_TOPICS = ["action_chunk", "narration", "engine_status", "/clock"]
NODE_OUTPUTS = RECORDED_TOPICS[:3]  # the node's topics: the replay waits until the recorder subscribes to them


def generate_launch_description():
    declared = [DeclareLaunchArgument(name, description=text) if default is None
                else DeclareLaunchArgument(name, default_value=default, description=text)
                for name, default, text in ARGUMENTS]
    config = PathJoinSubstitution([FindPackageShare("oxygen_ros"), "config"])
    node = Node(
        package="oxygen_ros",
        executable="vla_node",
        parameters=[PathJoinSubstitution([config, "aloha.yaml"]), PathJoinSubstitution([config, "demo_tiny.yaml"]),
                    {"use_sim_time": True, "autostart": True}],  # a recorded bag, not a robot: act at once
        output="screen",
    )
    record = ExecuteProcess(cmd=["oxygen-ros", "record", LaunchConfiguration("out_bag"), "--topics",
                                 *RECORDED_TOPICS], name="record", output="screen")
    replay = ExecuteProcess(cmd=["oxygen-ros", "replay", LaunchConfiguration("bag"), "--clock", "--wait-for",
                                 "joint_states", "--wait-for-subscribers", *NODE_OUTPUTS], name="replay",
                            output="screen")
    return LaunchDescription(declared + [record, node, replay])
