"""Start the VLA node for one robot: `ros2 launch oxygen_ros oxygen.launch.py [namespace:=robot3]
[params_file:=a.yaml,b.yaml] [preset:=tiny|small|pi05] [checkpoint:=DIR|ORG/NAME tokenizer:=FILE|ORG/NAME]
[urdf:=robot.urdf] [use_sim_time:=true] [autostart:=true] [diagnostics_aggregator:=true] [viewer:=true]`.

This is the robot path, so the managed node starts unconfigured (`autostart:=false`): nothing commands the arm
until an operator or a lifecycle manager configures and activates it (`ros2 lifecycle set /vla_node configure`,
then `activate`; `deactivate` stops it and holds the arm). `autostart:=true` walks it to active at start, as the
demos and the simulator do (docs/safety.md).

The parameter files (default: the installed config/aloha.yaml; several separated by commas, later ones overriding
earlier ones, e.g. config/aloha.yaml,config/demo_tiny.yaml) describe the robot; preset, checkpoint and tokenizer
override them only when given, so an empty argument never replaces a value a file sets. `urdf` is a URDF file
whose text becomes the node's `robot_description` (when given): the joint limits of the output groups' joints that
the parameter files leave unset (docs/safety.md; a xacro file must be expanded to URDF first). All the node's topics are
relative, so `namespace` puts a whole robot under one prefix and several robots can run side by side.
`diagnostics_aggregator:=true` also starts diagnostic_aggregator with config/diagnostics_aggregator.yaml (when
that package is installed), so rqt_robot_monitor shows the node under /diagnostics_agg. `viewer:=true` is what an
owner watches: the node publishes chunk_markers (`visualization.markers`), RViz opens config/oxygen.rviz in the
robot's namespace, its fixed frame and camera images those of the parameter files (`visualization.frame_id`,
`cameras.topics`) unless `fixed_frame:=` / `camera_topics:=a,b` say otherwise and rqt config/oxygen.perspective (engine_status plots and the robot monitor, its topics moved
into the namespace), with the aggregator; a viewer that is not installed is named in the log and skipped.
"""

import tempfile

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, LogInfo, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from oxygen_ros.launch_helpers import (
    namespaced_perspective,
    parameter_files,
    robot_description,
    rviz_config,
    viewed_parameters,
)
from oxygen_ros.serving.params import read_file

ARGUMENTS = (
    ("namespace", "", "ROS namespace of the robot (empty: none)"),
    ("params_file", PathJoinSubstitution([FindPackageShare("oxygen_ros"), "config", "aloha.yaml"]),
     "VLA node parameter file(s), comma separated, later ones override earlier ones"),
    ("use_sim_time", "false", "use /clock (e.g. from `oxygen-ros replay --clock`) as the node's time"),
    ("autostart", "false", "configure and activate the node at start; false (a real robot): wait for the lifecycle "
                           "services"),
    ("preset", "", "model.preset override: tiny, small or pi05 (empty: as in params_file)"),
    ("checkpoint", "", "model.checkpoint override: a pi05 checkpoint folder or hub id (empty: as in params_file)"),
    ("tokenizer", "", "model.tokenizer override: a tokenizer file, folder or hub id (empty: as in params_file)"),
    ("urdf", "", "a URDF file: its text is the node's robot_description, the joint limits' source where the "
                 "parameter files give none (empty: as in params_file)"),
    ("diagnostics_aggregator", "false", "also start diagnostic_aggregator (if installed) for /diagnostics_agg"),
    ("viewer", "false", "also open RViz (config/oxygen.rviz) and rqt (config/oxygen.perspective), with the node's "
                        "chunk_markers and the aggregator"),
    ("fixed_frame", "", "RViz's fixed frame (empty: the parameter files' visualization.frame_id, else base_link)"),
    ("camera_topics", "", "camera topics RViz shows, comma separated (empty: the parameter files' cameras.topics)"),
)
OVERRIDES = {"preset": "model.preset", "checkpoint": "model.checkpoint", "tokenizer": "model.tokenizer"}


def truthy(context, name: str) -> bool:
    return LaunchConfiguration(name).perform(context).lower() in ("true", "1")


def vla_node(context):
    overrides = {"use_sim_time": truthy(context, "use_sim_time"), "autostart": truthy(context, "autostart")}
    if truthy(context, "viewer"):
        overrides["visualization.markers"] = True
    for argument, parameter in OVERRIDES.items():
        value = LaunchConfiguration(argument).perform(context)
        if value:
            overrides[parameter] = value
    if description := robot_description(LaunchConfiguration("urdf").perform(context)):
        overrides["robot_description"] = description
    return [Node(
        package="oxygen_ros",
        executable="vla_node",
        namespace=LaunchConfiguration("namespace"),
        parameters=[*parameter_files(LaunchConfiguration("params_file").perform(context)), overrides],
        output="screen",
        emulate_tty=True,
    )]


def missing(package: str, argument: str, what: str) -> list:
    """[] when `package` is installed, else the one log line that says what `argument` cannot start."""
    from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

    try:
        get_package_share_directory(package)
    except PackageNotFoundError:
        apt = package.replace("_", "-")
        return [LogInfo(msg=f"{argument}:=true but {package} is not installed (apt: ros-$ROS_DISTRO-{apt}); {what}")]
    return []


def aggregator(context):
    if not (truthy(context, "diagnostics_aggregator") or truthy(context, "viewer")):
        return []
    if skipped := missing("diagnostic_aggregator", "diagnostics_aggregator", "/diagnostics is still published"):
        return skipped
    return [Node(
        package="diagnostic_aggregator",
        executable="aggregator_node",
        parameters=[PathJoinSubstitution([FindPackageShare("oxygen_ros"), "config", "diagnostics_aggregator.yaml"]),
                    {"use_sim_time": truthy(context, "use_sim_time")}],
        output="screen",
    )]


def viewer(context):
    if not truthy(context, "viewer"):
        return []
    from ament_index_python.packages import get_package_share_directory

    config = f"{get_package_share_directory('oxygen_ros')}/config/"
    namespace = LaunchConfiguration("namespace").perform(context)
    files = parameter_files(LaunchConfiguration("params_file").perform(context))
    frame, cameras = viewed_parameters([read_file(path) for path in files])
    frame = LaunchConfiguration("fixed_frame").perform(context) or frame
    given = LaunchConfiguration("camera_topics").perform(context)
    cameras = [t.strip() for t in given.split(",") if t.strip()] if given else cameras
    with open(config + "oxygen.rviz") as shipped, \
            tempfile.NamedTemporaryFile("w", suffix=".rviz", delete=False) as rviz:
        rviz.write(rviz_config(shipped.read(), frame, cameras))
    with open(config + "oxygen.perspective") as shipped, \
            tempfile.NamedTemporaryFile("w", suffix=".perspective", delete=False) as perspective:
        perspective.write(namespaced_perspective(shipped.read(), namespace))
    clock = [{"use_sim_time": truthy(context, "use_sim_time")}]
    return (missing("rviz2", "viewer", "RViz not started") or [Node(
        package="rviz2", executable="rviz2", namespace=namespace, arguments=["-d", rviz.name],
        parameters=clock, output="screen")]) + (missing("rqt_gui", "viewer", "rqt not started") or [Node(
        package="rqt_gui", executable="rqt_gui", namespace=namespace,
        arguments=["--perspective-file", perspective.name], parameters=clock, output="screen")])


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=text) for name, default, text in ARGUMENTS]
        + [OpaqueFunction(function=vla_node), OpaqueFunction(function=aggregator), OpaqueFunction(function=viewer)]
    )
