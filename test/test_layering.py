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
