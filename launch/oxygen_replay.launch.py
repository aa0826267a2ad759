"""Evaluate the VLA node on a recorded episode: the node (oxygen.launch.py, on simulated time) plus
`oxygen-ros replay BAG --clock`, which publishes the bag's topics and /clock with the bag's timing.

`ros2 launch oxygen_ros oxygen_replay.launch.py bag:=episode_bag [namespace:=robot3] [params_file:=...]
[preset:=...] [checkpoint:=... tokenizer:=...] [rate:=1.0] [remappings:="FROM:=TO ..."] [viewer:=true]`. The
replay runs in the node's namespace: relative bag topics (as `oxygen-ros convert` writes them) land there as they
are, and absolute ones (`/joint_states`, `/robot1/camera/...`) are remapped into it, dropping the namespace they
share (/clock and other global topics stay global). `remappings` renames further bag topics for the replay, e.g.
`remappings:="/cam_high/image_raw:=camera/cam_high/image_raw"`, and wins over the automatic ones. Replay starts once
the node subscribes to the bag's joint-state topic, wherever the remappings take it (the node subscribes after its
model is loaded), so no frame is published into the void.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, IncludeLaunchDescription, OpaqueFunction
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

from oxygen_ros.data.bag import bag_topics
from oxygen_ros.launch_helpers import joint_state_topic, replay_ros_arguments

ARGUMENTS = (
    ("bag", None, "rosbag2 folder to replay (e.g. written by `oxygen-ros convert`)"),
    ("rate", "1.0", "playback speed factor"),
    ("namespace", "", "ROS namespace of the robot (empty: none)"),
    ("params_file", PathJoinSubstitution([FindPackageShare("oxygen_ros"), "config", "aloha.yaml"]),
     "VLA node parameter file(s), comma separated, later ones override earlier ones"),
    ("preset", "", "model.preset override (empty: as in params_file)"),
    ("checkpoint", "", "model.checkpoint override (empty: as in params_file)"),
    ("tokenizer", "", "model.tokenizer override (empty: as in params_file)"),
    ("remappings", "", "extra FROM:=TO remappings of bag topics for the replay, space separated"),
    ("viewer", "false", "also open RViz and rqt on the node (oxygen.launch.py's viewer)"),
)
FORWARDED = ("namespace", "params_file", "preset", "checkpoint", "tokenizer", "viewer")


def replay(context):
    bag = LaunchConfiguration("bag").perform(context)
    topics = [(info.name, info.msgtype) for info in bag_topics(bag)]
    ros_args = replay_ros_arguments(topics, LaunchConfiguration("namespace").perform(context),
                                    LaunchConfiguration("remappings").perform(context))
    return [ExecuteProcess(
        cmd=["oxygen-ros", "replay", bag, "--clock", "--rate", LaunchConfiguration("rate"),
             "--wait-for", joint_state_topic(topics), *ros_args],
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
        launch_arguments=[(name, LaunchConfiguration(name)) for name in FORWARDED]
        + [("use_sim_time", "true"), ("autostart", "true")],  # a bag, not a robot: act at once
    )
    return LaunchDescription(declared + [node, OpaqueFunction(function=replay)])
