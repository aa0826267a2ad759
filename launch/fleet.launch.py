"""Serve a fleet of robots from this machine.

- `ros2 launch oxygen_ros fleet.launch.py [params_file:=...] [profile_file:=lut.json]`: one fleet_node serving the
  robots of params_file (docs/fleet.md).
- `... assignment_file:=assignment.json gpu_index:=N`: the node serves its GPU's robots of an assignment file
  (oxygen-ros fleet-assign); launch it once per GPU with the same file.

Robots need no change: their topics are the same whichever node serves them. A fleet that outgrows one machine runs
on Ray Serve instead (`oxygen-ros fleet-ray`, docs/ray.md).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

ARGUMENTS = (
    ("params_file", PathJoinSubstitution([FindPackageShare("oxygen_ros"), "config", "fleet.yaml"]),
     "fleet_node parameter file (models, robots, SLO, queue)"),
    ("profile_file", "", "profile table (oxygen-ros fleet-profile) a stage split plans from"),
    ("assignment_file", "", "robot -> GPU assignment JSON (empty: serve every robot in params_file)"),
    ("gpu_index", "0", "which GPU of the assignment this node serves"),
)


def fleet_nodes(context):
    overrides = {"gpu_index": int(LaunchConfiguration("gpu_index").perform(context))}
    for name in ("profile_file", "assignment_file"):
        value = LaunchConfiguration(name).perform(context)
        if value:
            overrides[name] = value
    return [Node(package="oxygen_ros", executable="fleet_node", name=f"fleet_node_{overrides['gpu_index']}",
                 parameters=[LaunchConfiguration("params_file"), overrides], output="screen")]


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text) for name, default, text in ARGUMENTS]
        + [OpaqueFunction(function=fleet_nodes)]
    )
