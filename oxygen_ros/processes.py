"""Starting and stopping the package's own nodes as child processes, for the demos (what a launch file does on a
full ROS 2 install: same executables, same parameter files)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def find_config(name: str) -> Path | None:
    """A parameter file from the source tree's config/ or an installed share/oxygen_ros/config/."""
    candidates = [PACKAGE_ROOT / "config" / name]
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if prefix:
            candidates.append(Path(prefix) / "share" / "oxygen_ros" / "config" / name)
    return next((path for path in candidates if path.is_file()), None)


def python_command(target: str) -> list[str]:
    """`python -m module` for a module name, `python file` for a path to a script."""
    return [sys.executable, target] if target.endswith(".py") else [sys.executable, "-m", target]


def child_env() -> dict:
    """This environment, unbuffered, with this checkout importable (children must run the same code)."""
    env = dict(os.environ)
    env.setdefault("MUJOCO_GL", "egl")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def stop(process: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGINT (what Ctrl-C and ros2 launch send), then SIGKILL if it does not exit in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
