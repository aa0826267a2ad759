"""Serve a fleet of robots from this machine: `ros2 launch oxygen_ros fleet.launch.py [params_file:=...]
[assignment_file:=assignment.json gpu_index:=N]`.

One fleet_node per GPU; with several, give each launch the same assignment file (from `oxygen-ros fleet-assign`)
and its own gpu_index, and each node serves only the robots assigned to it. Robots need no change: their topics are
the same whichever node serves them.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

ARGUMENTS = (
    ("params_file", PathJoinSubstitution([FindPackageShare("oxygen_ros"), "config", "fleet.yaml"]),
     "fleet_node parameter file (models, robots, SLO, queue)"),
    ("assignment_file", "", "robot -> GPU assignment JSON (empty: serve every robot in params_file)"),
    ("gpu_index", "0", "which GPU of the assignment this node serves"),
)


def fleet_node(context):
    overrides = {"gpu_index": int(LaunchConfiguration("gpu_index").perform(context))}
    assignment = LaunchConfiguration("assignment_file").perform(context)
    if assignment:
        overrides["assignment_file"] = assignment
    return [Node(
        package="oxygen_ros",
        executable="fleet_node",
        name=f"fleet_node_{overrides['gpu_index']}",
        parameters=[LaunchConfiguration("params_file"), overrides],
        output="screen",
    )]


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text) for name, default, text in ARGUMENTS]
        + [OpaqueFunction(function=fleet_node)]
    )
