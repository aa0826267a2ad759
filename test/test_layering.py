"""Only the ROS layer (oxygen_ros.nodes) may depend on rclpy or generated ROS interfaces.

The model, engine, fleet and data layers must be usable on a machine without ROS, so every one of their modules is
imported in a child process where `import rclpy` fails.
"""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "oxygen_ros"
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
    """Absolute names of the oxygen_ros modules a file imports (relative imports resolved)."""
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


SERVING = ["engine/*.py", "fleet/server.py", "fleet/stage_plan.py", "fleet/lockstep.py", "fleet/baselines.py",
           "fleet/device.py", "fleet/model_runner.py", "model/loading.py", "nodes/vla_node.py", "nodes/fleet_node.py",
           "serving/server.py", "serving/requests.py", "serving/protocol.py", "serving/serve_cli.py"]
NOT_FOR_SERVING = ("oxygen_ros.commands.cli", "oxygen_ros.evaluation.bench", "oxygen_ros.evaluation.fleet.simulator", "oxygen_ros.commands.fleet_sim",
                   "oxygen_ros.commands.fleet_bench", "oxygen_ros.commands.fleet_profile", "oxygen_ros.commands.demo",
                   "oxygen_ros.commands.sim_demo")


def test_the_engine_imports_neither_fleet_nor_bench():
    offenders = [f"{path.name}: {name}" for path in sorted((PACKAGE / "engine").glob("*.py"))
                 for name in _imports(path) if name.startswith(("oxygen_ros.fleet", "oxygen_ros.evaluation.bench"))]
    assert not offenders, offenders


def test_serving_code_imports_no_cli_simulator_or_benchmark():
    paths = sorted({path for pattern in SERVING for path in PACKAGE.glob(pattern)})
    assert len(paths) > 5
    offenders = [f"{path.relative_to(PACKAGE)}: {name}" for path in paths for name in _imports(path)
                 if name.startswith(NOT_FOR_SERVING)]
    assert not offenders, offenders
