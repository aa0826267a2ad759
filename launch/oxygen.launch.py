"""Start the VLA node for one robot: `ros2 launch oxygen_ros oxygen.launch.py [namespace:=robot3]
[params_file:=...] [preset:=tiny|small|pi05] [checkpoint:=DIR tokenizer:=FILE] [use_sim_time:=true]`.

The parameter file (default: the installed config/aloha.yaml) describes the robot; preset, checkpoint and tokenizer
override the file only when given, so an empty argument never replaces a value the file sets. All the node's
topics are relative, so `namespace` puts a whole robot under one prefix and several robots can run side by side.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

ARGUMENTS = (
    ("namespace", "", "ROS namespace of the robot (empty: none)"),
    ("params_file", PathJoinSubstitution([FindPackageShare("oxygen_ros"), "config", "aloha.yaml"]),
     "VLA node parameter file (robot layout, rates, language policy)"),
    ("use_sim_time", "false", "use /clock (e.g. from `oxygen-ros replay --clock`) as the node's time"),
    ("preset", "", "model.preset override: tiny, small or pi05 (empty: as in params_file)"),
    ("checkpoint", "", "model.checkpoint override: a pi05 checkpoint folder (empty: as in params_file)"),
    ("tokenizer", "", "model.tokenizer override: SentencePiece file (empty: as in params_file)"),
)
OVERRIDES = {"preset": "model.preset", "checkpoint": "model.checkpoint", "tokenizer": "model.tokenizer"}


def vla_node(context):
    overrides = {"use_sim_time": LaunchConfiguration("use_sim_time").perform(context).lower() in ("true", "1")}
    for argument, parameter in OVERRIDES.items():
        value = LaunchConfiguration(argument).perform(context)
        if value:
            overrides[parameter] = value
    return [Node(
        package="oxygen_ros",
        executable="vla_node",
        namespace=LaunchConfiguration("namespace"),
        parameters=[LaunchConfiguration("params_file"), overrides],
        output="screen",
        emulate_tty=True,
    )]


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text) for name, default, text in ARGUMENTS]
        + [OpaqueFunction(function=vla_node)]
    )
