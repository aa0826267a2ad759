"""Stop signals on node processes: caught from the first line (even while torch and rclpy are still importing, even
when the parent ignored SIGINT), and more signals during shutdown never change the exit code 0."""

import signal
import subprocess
import time

from test_replay_node import Child
from test_vla_node_ros import ARMED, TINY

NODE_ARGS = ["--ros-args", *ARMED, *TINY]
ENTRIES = {  # how a node process is started: `python -m` and the console script's function
    "module": ["-m", "oxygen_ros.nodes.vla_node"],
    "console_script": ["-c", "import sys; from oxygen_ros.nodes.entry import vla_node; sys.exit(vla_node())"],
}


class NodeProcess(Child):
    """A node process whose output is read as it comes (`Child`), and that is never sent a signal it was not sent
    by the test: `finish` waits, then kills."""

    def finish(self, timeout: float) -> tuple[int | None, str]:
        """(exit code or None if it had to be killed, output)."""
        try:
            rc = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            rc = None
        self._reader.join(timeout=5)
        return rc, "".join(self.lines)


def test_a_stop_signal_while_importing_ends_the_process_cleanly(ros_env):
    """Both ways a node process starts, `python -m` with SIGINT as the parent left it and the console script's
    function with SIGINT ignored (a shell's background job), side by side, each told to stop while importing."""
    variants = [("module", False), ("console_script", True)]
    nodes = [NodeProcess([*ENTRIES[entry], *NODE_ARGS], ros_env, ignore) for entry, ignore in variants]
    time.sleep(0.5)  # the interpreters are up; torch and rclpy take seconds to import
    assert all(node.process.poll() is None for node in nodes)
    for node in nodes:
        node.process.send_signal(signal.SIGINT)
    for variant, node in zip(variants, nodes):
        rc, output = node.finish(timeout=120)
        assert rc == 0, (variant, output)
        assert "Traceback" not in output and "KeyboardInterrupt" not in output, (variant, output)
        assert "cameras {" not in output, (variant, output)  # told to stop before it was built: it never started


def test_more_signals_during_shutdown_still_exit_zero(ros_env):
    """A node told to stop by SIGINT, and one by SIGTERM, each sent SIGINT again and again while it shuts down (as
    `ros2 launch` escalates, and more): both exit 0."""
    firsts = (signal.SIGINT, signal.SIGTERM)
    nodes = [NodeProcess([*ENTRIES["module"], *NODE_ARGS], ros_env) for _ in firsts]
    for node in nodes:
        assert node.wait_for_lines(["cameras {"], 240), node.finish(1)[1]  # the node is built and spinning
    for node, first in zip(nodes, firsts):
        node.process.send_signal(first)
    deadline = time.monotonic() + 30
    while any(node.process.poll() is None for node in nodes) and time.monotonic() < deadline:
        time.sleep(0.02)
        for node in nodes:
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGINT)
    for first, node in zip(firsts, nodes):
        rc, output = node.finish(timeout=5)
        assert rc == 0, (first, output)
        assert "Traceback" not in output and "terminate called" not in output, (first, output)
