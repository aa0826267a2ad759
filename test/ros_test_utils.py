"""Helpers for tests that talk to other processes over real DDS."""

import subprocess
import sys
import time

import rclpy
from rclpy.executors import SingleThreadedExecutor

from oxygen_ros.processes import stop


def start_python(code: str, env: dict) -> subprocess.Popen:
    """Run Python code in a child process (the same interpreter and ROS environment as the test)."""
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


stop_process = stop  # SIGINT first (what Ctrl-C and ros2 launch send), SIGKILL if it does not exit in time


def spin_until(node, condition, timeout: float) -> bool:
    """Spin one node on a SingleThreadedExecutor until condition() holds or the timeout passes."""
    executor = SingleThreadedExecutor(context=node.context)
    executor.add_node(node)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if condition():
                return True
            executor.spin_once(timeout_sec=0.05)
        return condition()
    finally:
        executor.remove_node(node)
        executor.shutdown()


__all__ = ["rclpy", "spin_until", "start_python", "stop_process"]
