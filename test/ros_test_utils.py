"""Helpers for tests that talk to other processes over real DDS."""

import re
import subprocess
import sys
import tempfile
import time

import rclpy
from rclpy.executors import SingleThreadedExecutor

from oxygen_ros.commands.processes import stop


def start_python(code: str, env: dict) -> subprocess.Popen:
    """Run Python code in a child process (the same interpreter and ROS environment as the test)."""
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


stop_process = stop  # SIGINT first (what Ctrl-C and ros2 launch send), SIGKILL if it does not exit in time

# Fast DDS's own log lines (`[RTPS_TRANSPORT_SHM Error] Failed init_port ...`): on a heavily loaded machine its
# shared-memory transport can time out taking a port's lock (two seconds) and says so on stderr, then goes on
# (eProsima/Fast-DDS#6117). They are the middleware's, not the node's.
_FASTDDS_LOG = re.compile(r"\[RTPS_[A-Z_]+ (Error|Warning|Info)\]")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Fast DDS colours its lines on a terminal and in a captured stderr alike


def node_lines(err: str) -> list[str]:
    """A node process's non-empty stderr lines, less Fast DDS's own (above)."""
    return [line for line in err.splitlines() if line.strip() and not _FASTDDS_LOG.search(_COLOUR.sub("", line))]


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


def listen_while_running(context, command: list[str], env: dict, topics: dict, timeout: float):
    """Run `command` while a node on `context` counts the messages it hears on `topics` ({name: type}, best effort,
    which also hears reliable publishers). Returns (the finished process with its output, {name: count})."""
    from rclpy.qos import qos_profile_sensor_data

    node = rclpy.create_node("test_listener", context=context)
    heard = dict.fromkeys(topics, 0)
    for name, msg_type in topics.items():
        node.create_subscription(msg_type, name, lambda _, n=name: heard.__setitem__(n, heard[n] + 1),
                                 qos_profile_sensor_data)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
        try:
            spin_until(node, lambda: process.poll() is not None, timeout)
        finally:
            stop(process)
            node.destroy_node()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read()), heard


__all__ = ["listen_while_running", "rclpy", "spin_until", "start_python", "stop_process"]
