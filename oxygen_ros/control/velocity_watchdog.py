"""When velocity commands stop: which velocity groups to zero, and when.

A forward_command_controller (e.g. ros2_controllers' velocity controller) keeps applying its last command and has
no command timeout, so a velocity group whose commander crashes or stalls keeps moving. The watchdog node
(`oxygen_ros/nodes/velocity_watchdog.py`) watches each group's command topic and, once no command has come for
`timeout` ns, sends that group one command of zeros (as wide as its last command). A command of zeros does not
arm it again (the group stands still; the watchdog's own zeros come back on the topic it watches).
"""

from __future__ import annotations

from collections.abc import Sequence


class WatchdogError(ValueError):
    """Settings the watchdog cannot run with; the message says which and why."""


def check_timeout(timeout_s: float, control_period_s: float) -> None:
    """The timeout must exceed the commander's control period: a shorter one zeros a group between two healthy
    commands."""
    if not control_period_s > 0:
        raise WatchdogError(f"control_period_s must be positive, got {control_period_s}")
    if not timeout_s > control_period_s:
        raise WatchdogError(f"timeout_s {timeout_s} must be longer than the commander's control period "
                            f"control_period_s {control_period_s}: it would zero the group between two commands")


class VelocityWatchdog:
    """Per topic: the newest moving command's time and width; `due` says which topics to zero now, once each."""

    def __init__(self, timeout_ns: int):
        self.timeout_ns = int(timeout_ns)
        self.armed: dict[str, tuple[int, int]] = {}  # topic -> (time of the last non-zero command, its width)
        self.zeroed = 0  # zero commands sent, all topics together

    def command(self, topic: str, values: Sequence[float], now_ns: int) -> None:
        if any(v != 0.0 for v in values):
            self.armed[topic] = (int(now_ns), len(values))

    def due(self, now_ns: int) -> list[tuple[str, int]]:
        """(topic, width) for each group whose last moving command is older than the timeout; forgotten until it
        moves again."""
        late = [(topic, width) for topic, (seen, width) in self.armed.items() if now_ns - seen > self.timeout_ns]
        for topic, _ in late:
            del self.armed[topic]
        self.zeroed += len(late)
        return late
