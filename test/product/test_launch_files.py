"""The launch files, read as source (launch and launch_ros are not installable here): everything they name exists.

Package and executable names must match package.xml, setup.py and CMakeLists.txt; every LaunchConfiguration must
be declared; parameter overrides must be parameters the node declares; the default parameter file, the included
launch file and the replay command's options must exist. `ros2 launch` itself is exercised on a ROS 2 install by
test/launch/test_vla_node_launch.py.
"""

import ast
import re
from pathlib import Path

import pytest
import yaml

from oxygen_ros.nodes.fleet_parameters import DEFAULTS as FLEET_DEFAULTS
from oxygen_ros.nodes.parameters import SPECS
from oxygen_ros.nodes.replay_node import build_parser as replay_parser

REPO = Path(__file__).resolve().parents[2]
NODE_PARAMETERS = {spec.name for spec in SPECS} | {"use_sim_time"}


def parse(relative: str) -> ast.Module:
    return ast.parse((REPO / relative).read_text())


def calls(tree: ast.AST, name: str) -> list[ast.Call]:
    def called(func):
        return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None

    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and called(n.func) == name]


def keyword(call: ast.Call, name: str) -> ast.AST:
    return next(k.value for k in call.keywords if k.arg == name)


def constant_strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def assigned(tree: ast.Module, name: str) -> ast.AST:
    return next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == name)


def declared_arguments(tree: ast.Module) -> set[str]:
    """Names of the ARGUMENTS table (each entry: name, default, description), all passed to DeclareLaunchArgument."""
    assert calls(tree, "DeclareLaunchArgument")
    return {entry.elts[0].value for entry in assigned(tree, "ARGUMENTS").elts}


def launch_configurations(tree: ast.Module) -> set[str]:
    """Literal LaunchConfiguration names (the others loop over OVERRIDES or FORWARDED, checked separately)."""
    return {c.args[0].value for c in calls(tree, "LaunchConfiguration") if isinstance(c.args[0], ast.Constant)}


def package_name() -> str:
    return re.search(r"<name>(\w+)</name>", (REPO / "package.xml").read_text()).group(1)


def installed_executables() -> tuple[set[str], set[str]]:
    setup = parse("setup.py")
    from_setup = {e.value for e in assigned(setup, "NODE_EXECUTABLES").elts}
    cmake = re.search(r"set\(OXYGEN_ROS_NODE_EXECUTABLES ([\w ]+)\)", (REPO / "CMakeLists.txt").read_text())
    return from_setup, set(cmake.group(1).split())


def installed_share_folders() -> set[str]:
    match = re.search(r"install\(DIRECTORY ([\w ]+) DESTINATION share/\$\{PROJECT_NAME\}\)",
                      (REPO / "CMakeLists.txt").read_text())
    return set(match.group(1).split())


def our_node(tree: ast.AST) -> ast.Call:
    """The one Node action of this package in a launch file (others, e.g. the diagnostics aggregator, aside)."""
    (node,) = [n for n in calls(tree, "Node") if keyword(n, "package").value == package_name()]
    return node


def share_path(call: ast.Call) -> Path:
    """PathJoinSubstitution([FindPackageShare("oxygen_ros"), "a", "b"]) -> REPO/a/b (the source of share/...)."""
    parts = call.args[0].elts
    assert calls(parts[0], "FindPackageShare") and parts[0].args[0].value == package_name()
    assert parts[1].value in installed_share_folders(), f"{parts[1].value}/ is not installed to share/"
    return REPO.joinpath(*(p.value for p in parts[1:]))


@pytest.mark.parametrize("launch_file", ["launch/oxygen.launch.py", "test/launch/test_vla_node_launch.py"])
def test_vla_node_is_started_by_its_installed_name(launch_file):
    tree = parse(launch_file)
    node = our_node(tree)
    assert keyword(node, "package").value == package_name() == "oxygen_ros"
    executable = keyword(node, "executable").value
    from_setup, from_cmake = installed_executables()
    assert executable == "vla_node" and executable in from_setup and executable in from_cmake
    entry = "generate_test_description" if launch_file.startswith("test/") else "generate_launch_description"
    assert entry in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_oxygen_launch_arguments_overrides_and_default_parameter_file():
    tree = parse("launch/oxygen.launch.py")
    declared = declared_arguments(tree)
    assert declared == {"namespace", "params_file", "use_sim_time", "autostart", "preset", "checkpoint", "tokenizer",
                        "urdf", "diagnostics_aggregator", "viewer", "fixed_frame", "camera_topics"}
    # the robot path: the managed node waits for an operator or a lifecycle manager unless told otherwise
    assert next(e.elts[1].value for e in assigned(tree, "ARGUMENTS").elts if e.elts[0].value == "autostart") == "false"
    assert "autostart" in constant_strings(tree) and "autostart" in NODE_PARAMETERS
    overrides = ast.literal_eval(assigned(tree, "OVERRIDES"))
    assert launch_configurations(tree) | set(overrides) <= declared
    assert set(overrides.values()) <= NODE_PARAMETERS and "use_sim_time" in constant_strings(tree)
    node = our_node(tree)
    # every parameter file given (comma separated, in order), then the overrides
    files, _ = keyword(node, "parameters").elts
    assert isinstance(files, ast.Starred) and calls(files, "parameter_files")
    assert calls(keyword(node, "namespace"), "LaunchConfiguration")[0].args[0].value == "namespace"
    (default_params,) = calls(assigned(tree, "ARGUMENTS"), "PathJoinSubstitution")
    assert share_path(default_params) == REPO / "config" / "aloha.yaml" and share_path(default_params).is_file()
    # urdf:=FILE: the file's text (launch_helpers.robot_description) as the node's robot_description, only when
    # given (its default is empty, like the other overrides')
    (read,) = calls(tree, "robot_description")
    assert calls(read, "LaunchConfiguration")[0].args[0].value == "urdf"
    assert next(e.elts[1].value for e in assigned(tree, "ARGUMENTS").elts if e.elts[0].value == "urdf") == ""
    imported = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "oxygen_ros.launch_helpers"
                for a in n.names}
    assert "robot_description" in imported
    stored = [n for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)
              and ast.unparse(n.value) == "overrides" and ast.unparse(n.slice) == "'robot_description'"]
    assert len(stored) == 1 and "robot_description" in NODE_PARAMETERS


def test_oxygen_launch_starts_the_diagnostics_aggregator_with_the_shipped_analyzers():
    tree = parse("launch/oxygen.launch.py")
    (aggregator,) = [n for n in calls(tree, "Node") if keyword(n, "package").value == "diagnostic_aggregator"]
    assert keyword(aggregator, "executable").value == "aggregator_node"
    (analyzers,) = calls(keyword(aggregator, "parameters"), "PathJoinSubstitution")
    path = share_path(analyzers)
    assert path == REPO / "config" / "diagnostics_aggregator.yaml"
    config = yaml.safe_load(path.read_text())["analyzers"]["ros__parameters"]
    (analyzer,) = [v for v in config.values() if isinstance(v, dict)]
    assert analyzer["type"] == "diagnostic_aggregator/GenericAnalyzer"
    # the analyzer matches the status name the node publishes
    (pattern,) = analyzer["contains"]
    source = (REPO / "oxygen_ros" / "nodes" / "vla_node.py").read_text()
    assert 'name = f"{self.get_fully_qualified_name()}: vla engine"' in source and pattern == ": vla engine"


def test_oxygen_launch_viewer_opens_the_shipped_rviz_and_rqt_files_with_the_markers_on():
    tree = parse("launch/oxygen.launch.py")
    packages = {keyword(n, "package").value for n in calls(tree, "Node")}
    assert packages - {"oxygen_ros", "diagnostic_aggregator"} == {"rviz2", "rqt_gui"}
    named = {s for s in constant_strings(tree) if s.startswith("oxygen.")}  # shipped files, read from config/
    assert named == {"oxygen.perspective", "oxygen.rviz"}
    assert all((REPO / "config" / name).is_file() for name in named) and "config" in installed_share_folders()
    assert "visualization.markers" in constant_strings(tree) and "visualization.markers" in NODE_PARAMETERS
    # RViz's fixed frame and cameras: the parameter files' (launch_helpers.viewed_parameters), or the arguments
    assert calls(tree, "rviz_config") and calls(tree, "viewed_parameters")
    assert {"fixed_frame", "camera_topics"} <= launch_configurations(tree)


def test_replay_launch_includes_the_node_launch_and_runs_replay_with_clock():
    tree = parse("launch/oxygen_replay.launch.py")
    declared = declared_arguments(tree)
    assert {"bag", "rate", "namespace", "params_file", "preset", "checkpoint"} <= declared
    assert launch_configurations(tree) <= declared
    forwarded = set(ast.literal_eval(assigned(tree, "FORWARDED")))
    assert forwarded <= declared & declared_arguments(parse("launch/oxygen.launch.py"))
    (include,) = calls(tree, "IncludeLaunchDescription")
    (included,) = calls(include, "PathJoinSubstitution")
    assert share_path(included) == REPO / "launch" / "oxygen.launch.py"
    pairs = [tuple(constant_strings(t)) for t in ast.walk(keyword(include, "launch_arguments"))
             if isinstance(t, ast.Tuple)]
    assert ("use_sim_time", "true") in pairs and ("autostart", "true") in pairs
    (process,) = calls(tree, "ExecuteProcess")
    cmd = keyword(process, "cmd")
    words = [e.value for e in cmd.elts if isinstance(e, ast.Constant)]
    assert words[:2] == ["oxygen-ros", "replay"]
    assert "oxygen-ros = oxygen_ros.commands.cli:main" in constant_strings(parse("setup.py"))
    assert '"replay": ("oxygen_ros.nodes.replay_node"' in (REPO / "oxygen_ros" / "commands" / "cli.py").read_text()
    options = {o for action in replay_parser()._actions for o in action.option_strings}
    assert {w for w in words if w.startswith("--") and w != "--ros-args"} <= options
    assert {"--clock", "--wait-for"} <= set(words)


def test_launch_test_parameters_are_node_parameters_and_the_config_is_installed():
    tree = parse("test/launch/test_vla_node_launch.py")
    node = our_node(tree)
    params_file, overrides = keyword(node, "parameters").elts
    assert {key.value for key in overrides.keys} <= NODE_PARAMETERS
    assert isinstance(params_file, ast.Name)
    (path,) = [c for c in calls(tree, "join") if calls(c, "get_package_share_directory")]
    assert [path.args[0].args[0].value] + [a.value for a in path.args[1:]] == [package_name(), "config", "aloha.yaml"]
    assert "config" in installed_share_folders()
    decorators = {ast.unparse(d) for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)
                  for d in n.decorator_list}
    assert {"pytest.mark.launch_test", "launch_testing.post_shutdown_test()"} <= decorators
    assert calls(tree, "assertExitCodes") and calls(tree, "ReadyToTest")


def flatten(tree: dict, prefix: str = "") -> set[str]:
    names = set()
    for key, value in tree.items():
        names |= flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
    return names


def test_demo_launch_matches_the_demo_command_and_its_parameter_files_are_node_parameters():
    import yaml

    from oxygen_ros.commands.demo import NODE_OUTPUTS, PARAMETER_FILES, RECORDED_TOPICS
    from oxygen_ros.nodes.record_node import build_parser as record_parser

    tree = parse("launch/oxygen_demo.launch.py")
    (node,) = calls(tree, "Node")
    assert keyword(node, "executable").value == "vla_node" and keyword(node, "package").value == package_name()
    config_names = [c.value for c in ast.walk(keyword(node, "parameters"))
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.endswith(".yaml")]
    assert tuple(config_names) == PARAMETER_FILES
    for name in PARAMETER_FILES:
        parameters = yaml.safe_load((REPO / "config" / name).read_text())["/**"]["ros__parameters"]
        assert flatten(parameters) <= NODE_PARAMETERS, name
    assert ast.literal_eval(assigned(tree, "RECORDED_TOPICS")) == list(RECORDED_TOPICS)
    assert list(RECORDED_TOPICS[:3]) == list(NODE_OUTPUTS)  # what the launch file's replay waits to be recorded
    assert launch_configurations(tree) <= declared_arguments(tree)
    options = {"record": {o for a in record_parser()._actions for o in a.option_strings},
               "replay": {o for a in replay_parser()._actions for o in a.option_strings}}
    for process in calls(tree, "ExecuteProcess"):
        words = [e.value for e in keyword(process, "cmd").elts if isinstance(e, ast.Constant)]
        assert words[0] == "oxygen-ros" and words[1] in options
        assert {w for w in words if w.startswith("--")} <= options[words[1]]


def test_fleet_launch_starts_a_fleet_node_with_the_installed_parameter_file():
    import yaml

    tree = parse("launch/fleet.launch.py")
    nodes = calls(tree, "Node")
    executables = {keyword(node, "executable").value for node in nodes}
    from_setup, from_cmake = installed_executables()
    assert executables == {"fleet_node"} and executables <= from_setup & from_cmake
    assert all(keyword(node, "package").value == package_name() for node in nodes)
    assert launch_configurations(tree) <= declared_arguments(tree) == {"params_file", "profile_file",
                                                                       "assignment_file", "gpu_index"}
    (default_params,) = calls(assigned(tree, "ARGUMENTS"), "PathJoinSubstitution")
    config = share_path(default_params)
    assert config == REPO / "config" / "fleet.yaml"
    # every key of the shipped file is a parameter the node declares, with the same type as its default
    shipped = yaml.safe_load(config.read_text())
    assert set(shipped) == {"/**"}
    parameters = shipped["/**"]["ros__parameters"]
    assert set(parameters) == set(FLEET_DEFAULTS)
    assert all(type(parameters[k]) is type(v) for k, v in FLEET_DEFAULTS.items()), "a type differs from the node's"
    assert len(parameters["robots"]) == len(parameters["robot_models"])
    # the parameters the launch file sets are declared by the node
    source = (REPO / "launch" / "fleet.launch.py").read_text()
    assert {"gpu_index", "profile_file", "assignment_file"} <= {name for name in FLEET_DEFAULTS if f'"{name}"' in source}


def test_launch_tests_are_importable_by_plain_pytest():
    """A module name with an extra dot (x.launch.py) cannot be imported, so pytest with launch_testing's plugin
    would fail on it; the files must also match what CMakeLists registers with add_launch_test."""
    files = sorted((REPO / "test" / "launch").glob("test_*"))
    assert files
    for path in files:
        assert path.suffix == ".py" and path.stem.isidentifier(), path.name
    assert 'file(GLOB launch_tests "test/launch/test_*.py")' in (REPO / "CMakeLists.txt").read_text()
