"""The package's layers: only the ROS layer (oxygen_ros.nodes) depends on rclpy or generated ROS interfaces, no
module imports a layer above its own, there is no import circle, and serving code imports no command, simulator or
benchmark.

The model, engine, fleet and data layers must be usable on a machine without ROS, so every one of their modules is
imported in a child process where `import rclpy` fails.
"""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "oxygen_ros"
ROS_ONLY = {"nodes", "msg"}
FORBIDDEN = ("rclpy", "oxygen_ros.nodes", "oxygen_ros.msg", "sensor_msgs", "std_msgs", "trajectory_msgs")


def non_ros_modules() -> list[str]:
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = relative.parts
        if len(parts) > 1 and parts[1] in ROS_ONLY:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules.append(".".join(parts))
    return modules


def test_non_ros_layers_have_no_ros_imports_at_module_level():
    offenders = []
    for module in non_ros_modules():
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{module}: {name}" for name in names if name.startswith(FORBIDDEN)]
    assert not offenders, "ROS imports outside oxygen_ros.nodes:\n" + "\n".join(offenders)


def test_non_ros_layers_import_without_rclpy():
    modules = non_ros_modules()
    assert "oxygen_ros" in modules
    code = (
        "import sys\n"
        "for blocked in ('rclpy', 'rosidl_runtime_py', 'std_msgs', 'sensor_msgs'):\n"
        "    sys.modules[blocked] = None  # any import of it now raises ImportError\n"
        "import importlib\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "assert 'rclpy' not in sys.modules or sys.modules['rclpy'] is None\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def _imports(module_path: Path) -> list[str]:
    """Absolute names of the oxygen_ros modules a file imports anywhere in it (relative imports resolved)."""
    relative = module_path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(relative.parts[:-1])
    names = []
    for node in ast.walk(ast.parse(module_path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return [n for n in names if n.startswith("oxygen_ros")]


def module_graph() -> dict[str, set[str]]:
    """Every module of the package -> the package's modules it imports (a package's import names its
    `__init__`; `from x import name` names the module x.name where there is one)."""
    paths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {module: {name for name in _imports(path) if name in paths and name != module}
            for module, path in paths.items()}


# Each folder of the package at its level: a module imports its own folder and lower levels, nothing at its level
# or above. The modules at the package's root (its version, the command-line conventions, OpenMP's waits, the
# launch files' helpers) are level 0 and import nothing of the package.
LEVELS = {
    "model": 1, "control": 1,  # the network; from model actions to motion
    "engine": 2,  # scheduler, model runner, runtime
    "data": 3, "fleet": 3,  # episodes and bags (their reports use the engine's percentiles); serving many robots
    "sim": 4, "evaluation": 4,  # the simulator (it records episodes); benchmarks and the fleet simulator
    "robots": 4,  # what every commanded robot goes through: the command path, the state check
    "serving": 5,  # openpi's protocol: the server, and the robot side's client and fence
    "nodes": 6,  # ROS nodes (the robot client scores with evaluation's robot side; a remote engine is a client)
    "scaleout": 7,  # the fleet on Ray Serve: replicas of the fleet server behind openpi's protocol
    "commands": 8,  # the oxygen-ros command and the commands that are only that
}


def level(module: str) -> tuple[str, int]:
    parts = module.split(".")
    folder = parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else ""
    assert not folder or folder in LEVELS, f"oxygen_ros/{folder}/ has no level in LEVELS: place it"
    return folder, LEVELS.get(folder, 0)


def test_no_import_circles():
    """Tarjan's strongly connected components of the import graph: every one a single module."""
    graph, index, low, stack, on_stack, circles = module_graph(), {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert len(graph) > 100 and not circles, circles


def test_no_layer_imports_one_above_it():
    offenders = []
    for module, imported in sorted(module_graph().items()):
        folder, at = level(module)
        for other in sorted(imported):
            other_folder, other_at = level(other)
            if other_folder != folder and other_at >= at:
                offenders.append(f"{module} (level {at}) imports {other} (level {other_at})")
    assert not offenders, "\n".join(offenders)


# what serves a robot, and the serve command that builds it (its benchmark may import evaluation code)
SERVING = ["engine/*.py", "fleet/*.py", "model/loading.py", "nodes/vla_node.py", "nodes/fleet_node.py",
           "serving/*.py", "commands/serve.py"]
NOT_FOR_SERVING = ("oxygen_ros.commands", "oxygen_ros.evaluation")


def test_serving_code_imports_no_command_simulator_or_benchmark():
    paths = sorted({path for pattern in SERVING for path in PACKAGE.glob(pattern)})
    assert len(paths) > 30
    offenders = [f"{path.relative_to(PACKAGE)}: {name}" for path in paths for name in _imports(path)
                 if name.startswith(NOT_FOR_SERVING)]
    assert not offenders, offenders


def loaded_after_importing(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    """Which of `watched` (modules, or packages: their submodules count) a fresh process has loaded once it has
    imported `modules`."""
    code = ("import sys, importlib\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            f"watched = {watched!r}\n"
            "print(sorted({w for w in watched for name in sys.modules if name == w or name.startswith(w + '.')}))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return ast.literal_eval(result.stdout.strip().splitlines()[-1])


def test_the_nodes_without_a_model_start_without_torch_or_lerobots_format():
    """The replay, record and sim nodes run no model: importing them loads neither torch (two CPU-seconds per
    process) nor what LeRobot's format needs (pyarrow, PyAV; `oxygen_ros.data` imports its names on first use)."""
    nodes = ["oxygen_ros.nodes.replay_node", "oxygen_ros.nodes.record_node", "oxygen_ros.nodes.sim_node"]
    assert loaded_after_importing(nodes, ("torch", "transformers", "pyarrow", "av")) == []


def test_the_pools_routing_table_loads_without_torch_the_runtime_or_evaluation():
    """The pool's placement controller places robots and runs no model: its routing table over the fleet
    placement (`scaleout.routing`, `fleet.placement`) imports neither torch nor the engine's runtime, and nothing of
    `evaluation/` (which serves nothing)."""
    watched = ("torch", "transformers", "oxygen_ros.engine.runtime", "oxygen_ros.evaluation")
    assert loaded_after_importing(["oxygen_ros.scaleout.routing"], watched) == []


# The front ends receive and reply; the engine is built and driven from `robots/` (its parameters, `build_runtime` /
# `build_fleet`, a robot's session). The benchmark commands measure the engine itself, `train-tiny` trains and
# scores the model, and `sim-eval`'s in-process path runs the checkpoint directly (the upper bound its ROS and
# serve paths are compared with): they serve no robot.
FRONT_ENDS = ("nodes", "serving", "commands")
BENCHMARKS = ("commands/serve_bench.py", "commands/fleet_bench.py", "commands/train_tiny.py", "commands/sim_eval.py")
ENGINE_INSIDES = {"SchedulerConfig", "RuntimeConfig", "node_decode_policy", "ModelRunner", "FleetServer", "Runtime",
                  "Served"}
RUNNER_CALLS = {"prepare", "robot_actions", "prefill", "sample_actions"}  # the runner's work on a frame and a chunk


def test_no_front_end_builds_the_engine_or_calls_the_model_runner_itself():
    offenders = []
    paths = [p for folder in FRONT_ENDS for p in sorted((PACKAGE / folder).glob("*.py"))
             if str(p.relative_to(PACKAGE)) not in BENCHMARKS]
    assert len(paths) > 40
    for path in paths:
        where = path.relative_to(PACKAGE)
        offenders += [f"{where}: imports {name}" for name in _imports(path) if name.startswith(
            ("oxygen_ros.engine.model_runner", "oxygen_ros.engine.scheduler"))]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = node.func.id if isinstance(node.func, ast.Name) else \
                    node.func.attr if isinstance(node.func, ast.Attribute) else ""
                if called in ENGINE_INSIDES or (isinstance(node.func, ast.Attribute) and called in RUNNER_CALLS):
                    offenders.append(f"{where}:{node.lineno}: calls {called}")
    assert not offenders, "\n".join(offenders)


LIFECYCLE = ("on_configure", "on_activate", "on_deactivate", "on_cleanup", "on_shutdown", "on_error", "autostart",
             "close")


def test_the_managed_nodes_share_one_lifecycle_and_no_private_helper():
    """The VLA node and the fleet node run one lifecycle (`nodes/managed_node.py`: the transitions, autostart,
    the exit; each node's `main` is one call to its `main`) and no module imports another's private names (the fleet node once declared its output
    parameters with parameters.py's `_declare`, `_group_names` and `_Reader`)."""
    written = {}
    private = []
    for path in sorted((PACKAGE / "nodes").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                private += [f"{path.name}: {alias.name}" for alias in node.names if alias.name.startswith("_")]
        if path.stem in ("vla_node", "fleet_node", "managed_node"):
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef) and node.name in LIFECYCLE:
                    written.setdefault(node.name, []).append(path.stem)
    assert written == dict.fromkeys(LIFECYCLE, ["managed_node"]) and not private, (written, private)
