"""Evaluate the VLA node on a recorded episode: the node (oxygen.launch.py, on simulated time) plus
`oxygen-ros replay BAG --clock`, which publishes the bag's topics and /clock with the bag's timing.

`ros2 launch oxygen_ros oxygen_replay.launch.py bag:=episode_bag [namespace:=robot3] [params_file:=...]
[preset:=...] [checkpoint:=... tokenizer:=...] [rate:=1.0]`. A bag from `oxygen-ros convert` has relative topic
names, so the replay runs in the same namespace as the node. Replay starts once the node subscribes to
joint_states (the node subscribes after its model is loaded), so no frame is published into the void.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription, OpaqueFunction
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

ARGUMENTS = (
    ("bag", None, "rosbag2 folder to replay (e.g. written by `oxygen-ros convert`)"),
    ("rate", "1.0", "playback speed factor"),
    ("namespace", "", "ROS namespace of the robot (empty: none)"),
    ("params_file", PathJoinSubstitution([FindPackageShare("oxygen_ros"), "config", "aloha.yaml"]),
     "VLA node parameter file"),
    ("preset", "", "model.preset override (empty: as in params_file)"),
    ("checkpoint", "", "model.checkpoint override (empty: as in params_file)"),
    ("tokenizer", "", "model.tokenizer override (empty: as in params_file)"),
)
FORWARDED = ("namespace", "params_file", "preset", "checkpoint", "tokenizer")


def replay(context):
    namespace = "/" + LaunchConfiguration("namespace").perform(context).strip("/")
    return [ExecuteProcess(
        cmd=["oxygen-ros", "replay", LaunchConfiguration("bag"), "--clock", "--rate", LaunchConfiguration("rate"),
             "--wait-for", "joint_states", "--ros-args", "-r", f"__ns:={namespace}"],
        name="replay",
        output="screen",
    )]


def generate_launch_description():
    declared = [DeclareLaunchArgument(name, description=text) if default is None
                else DeclareLaunchArgument(name, default_value=default, description=text)
                for name, default, text in ARGUMENTS]
    node = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([FindPackageShare("oxygen_ros"), "launch",
                                                            "oxygen.launch.py"])),
        launch_arguments=[(name, LaunchConfiguration(name)) for name in FORWARDED] + [("use_sim_time", "true")],
    )
    return LaunchDescription(declared + [node, OpaqueFunction(function=replay)])
