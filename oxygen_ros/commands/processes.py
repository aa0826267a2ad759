"""Starting and stopping the package's own nodes as child processes, for the demos (what a launch file does on a
full ROS 2 install: same executables, same parameter files)."""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


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


def _fastdds_port_free(domain: int) -> bool:
    """Whether the unicast discovery port of participant 0 on `domain` is free on this machine (Fast DDS' and
    Cyclone DDS' default port mapping, 7410 + 250 * domain): no DDS participant here uses that domain yet."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("127.0.0.1", 7410 + 250 * domain))
        except OSError:
            return False
    return True


# ROS 2's domain_coordinator (how launch_testing and colcon's tests keep their runs apart) reserves domain d by
# holding TCP port COORDINATOR_PORT_BASE + d bound; a test may hold it before its first participant exists.
COORDINATOR_PORT_BASE = 32768
_reservations: list[socket.socket] = []  # the domains this process took, held until it exits


def _reserve(domain: int) -> bool:
    """Take `domain` the way domain_coordinator does, for the rest of this process; False when another holds it."""
    reservation = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        reservation.bind(("", COORDINATOR_PORT_BASE + domain))
    except OSError:
        reservation.close()
        return False
    _reservations.append(reservation)
    return True


def free_domain_id(avoid: int | None = None) -> int:
    """A ROS_DOMAIN_ID in 1..100 (the range safe on Linux) that no DDS participant on this machine uses and no test
    run has reserved (domain_coordinator's convention), reserved so in turn until this process exits."""
    for domain in random.sample(range(1, 101), 100):
        if domain != avoid and _fastdds_port_free(domain) and _reserve(domain):
            return domain
    raise RuntimeError("no free ROS_DOMAIN_ID in 1..100 on this machine")


def isolate_ros(env: dict) -> tuple[dict, int]:
    """`env` moved onto a free DDS domain with localhost-only discovery, so demo nodes neither reach nor hear a
    robot's network; returns the environment and the domain."""
    current = env.get("ROS_DOMAIN_ID", "")
    domain = free_domain_id(avoid=int(current) if current.isdigit() else 0)
    env = dict(env, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    env.pop("ROS_STATIC_PEERS", None)
    return env, domain


def add_user_domain_argument(parser: argparse.ArgumentParser) -> None:
    """`--user-domain`, the switch `demo_env` takes: this shell's ROS domain instead of an isolated one."""
    parser.add_argument("--user-domain", action="store_true",
                        help="run on this shell's ROS_DOMAIN_ID and discovery settings instead of an isolated, "
                        "localhost-only domain (other nodes on it then see the run's topics)")


def demo_env(user_domain: bool, command: str) -> dict:
    """The children's environment of a demo: isolated (the default) or the user's own domain; says which."""
    env = child_env()
    if user_domain:
        print(f"{command}: on this shell's DDS domain {env.get('ROS_DOMAIN_ID', '0')} (--user-domain): other "
              "nodes on it see the demo's topics", flush=True)
        return env
    env, domain = isolate_ros(env)
    print(f"{command}: on an isolated DDS domain, ROS_DOMAIN_ID={domain}, localhost-only discovery "
          "(--user-domain runs on this shell's domain instead)", flush=True)
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


def wait_for_exit(waited: dict[str, subprocess.Popen], watched: dict[str, subprocess.Popen], timeout_s: float
                  ) -> str | None:
    """Wait until every process in `waited` has exited; None then, else why waiting stopped: a process in `watched`
    (which must outlive them) exited first ("NAME exited with status N"), or `timeout_s` passed ("timed out after
    N s")."""
    deadline = time.monotonic() + timeout_s
    while any(process.poll() is None for process in waited.values()):
        for name, process in watched.items():
            if process.poll() is not None:
                return f"{name} exited with status {process.returncode}"
        if time.monotonic() > deadline:
            return f"timed out after {timeout_s:.0f} s"
        time.sleep(0.2)
    return None
