"""Serve a fleet of robots from this machine.

- `ros2 launch oxygen_ros fleet.launch.py gpus:=0,1,2 profile_file:=lut.json [params_file:=...]`: the fleet
  controller and one fleet_node per GPU listed (server gpu<i> on GPU i); robots join on /fleet/join and are placed
  live, re-placed when a server's heartbeat lapses (docs/fleet.md).
- `ros2 launch oxygen_ros fleet.launch.py [params_file:=...] [assignment_file:=assignment.json gpu_index:=N]`: one
  fleet_node serving the robots of params_file, or its GPU's robots of an assignment file (oxygen-ros fleet-assign);
  launch it once per GPU with the same file.

Robots need no change: their topics are the same whichever node serves them.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

ARGUMENTS = (
    ("params_file", PathJoinSubstitution([FindPackageShare("oxygen_ros"), "config", "fleet.yaml"]),
     "fleet_node (and fleet_controller) parameter file (models, robots, SLO, queue)"),
    ("gpus", "", "GPUs to serve, e.g. 0,1,2: the fleet controller and one fleet_node each (empty: one fleet_node)"),
    ("profile_file", "", "profile table (oxygen-ros fleet-profile) the controller and the nodes plan from"),
    ("assignment_file", "", "one fleet_node: robot -> GPU assignment JSON (empty: serve every robot in params_file)"),
    ("gpu_index", "0", "one fleet_node: which GPU of the assignment this node serves"),
    ("metrics_port", "", "with gpus: the controller's Prometheus metrics on this port (0: none; empty: params_file's)"),
)
ASSIGNMENT_TOPIC = "/fleet/assignment"


def gpu_list(text: str) -> list[int]:
    try:
        gpus = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"gpus must be comma-separated GPU indices, got {text!r}") from None
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        raise ValueError(f"gpus must be distinct indices >= 0, got {text!r}")
    return gpus


def fleet_node(name: str, overrides: dict) -> Node:
    return Node(package="oxygen_ros", executable="fleet_node", name=name,
                parameters=[LaunchConfiguration("params_file"), overrides], output="screen")


def fleet_nodes(context):
    gpus = gpu_list(LaunchConfiguration("gpus").perform(context))
    profile = LaunchConfiguration("profile_file").perform(context)
    shared = {"profile_file": profile} if profile else {}
    if not gpus:
        overrides = {"gpu_index": int(LaunchConfiguration("gpu_index").perform(context)), **shared}
        assignment = LaunchConfiguration("assignment_file").perform(context)
        if assignment:
            overrides["assignment_file"] = assignment
        return [fleet_node(f"fleet_node_{overrides['gpu_index']}", overrides)]
    port = LaunchConfiguration("metrics_port").perform(context)
    metrics = {"metrics_port": int(port)} if port else {}
    controller = Node(package="oxygen_ros", executable="fleet_controller", name="fleet_controller",
                      parameters=[LaunchConfiguration("params_file"),
                                  {"servers": [f"gpu{g}" for g in gpus], **metrics, **shared}], output="screen")
    return [controller] + [
        fleet_node(f"fleet_node_{g}", {"gpu_index": g, "server_name": f"gpu{g}", "assignment_topic": ASSIGNMENT_TOPIC,
                                        **shared})
        for g in gpus]


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text) for name, default, text in ARGUMENTS]
        + [OpaqueFunction(function=fleet_nodes)]
    )
