"""The fleet node as a member of a fleet placed live by the fleet controller (`nodes/fleet_controller.py`).

With ``assignment_topic`` set, the node starts with no robot and applies every assignment the controller
publishes, as the server named ``server_name`` (default ``gpu<gpu_index>``): a robot placed here gets its
subscriptions and publishers (its model loaded on its first robot); a robot no longer placed here loses its
subscriptions at once, its frames in flight still finish and are published, then its publishers go, and its model
is let go when no robot needs it. An assignment older than the one applied is refused (counted, logged), one that
cannot be read too. Every ``heartbeat_period_s`` while active the node publishes on ``/fleet/heartbeat`` the
version it applied, its robots (model, rate, SLO, attainment), its loaded models and its measured load (the share
of wall time its device ran jobs), which is how the controller knows it is alive. All of it runs on the executor
thread.
"""

from __future__ import annotations

import time

from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from oxygen_ros.control.embodiment import Embodiment, EmbodimentError, load_embodiment
from oxygen_ros.fleet import messages
from oxygen_ros.fleet.rate_cap import RateCap
from oxygen_ros.fleet.specs import ServedRobot

from .qos import LATCHED_QOS

HEARTBEAT_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
LOG_THROTTLE_S = 5.0


class FleetMember:
    """Mixed into `FleetNode` (which has the server, the robots' ports and `_add_robot`)."""

    def member_init(self) -> None:
        self._live_timer = None
        self.server_name = ""
        self.applied_version = -1
        self.stale_assignments = 0  # assignments older than the one applied
        self.bad_assignments = 0
        self.refused_robots: dict[str, tuple[ServedRobot, str]] = {}  # placed here, not servable: robot, reason
        self._load_mark = (time.monotonic(), 0.0)

    def join_controller(self) -> None:
        """At configure: take robots from the controller's assignments, send heartbeats."""
        p = self.params
        self.server_name = p["server_name"] or f"gpu{p['gpu_index']}"
        self.heartbeat_pub = self.create_publisher(String, messages.HEARTBEAT, HEARTBEAT_QOS)
        self.create_subscription(String, p["assignment_topic"], self._on_assignment, LATCHED_QOS)
        self._live_timer = self.create_timer(p["heartbeat_period_s"], self._live_tick)
        self.get_logger().info(f"server {self.server_name}: robots come from {p['assignment_topic']}")

    def _on_assignment(self, msg: String) -> None:
        try:
            document = messages.read_assignment(msg.data)
        except messages.MessageError as err:
            self.bad_assignments += 1
            self.get_logger().error(f"assignment refused: {err}", throttle_duration_sec=LOG_THROTTLE_S)
            return
        version = document["version"]
        if version < self.applied_version:
            self.stale_assignments += 1
            self.get_logger().warning(f"assignment version {version} refused: older than version "
                                      f"{self.applied_version}, which is applied")
            return
        if version == self.applied_version or self.server is None:
            return
        mine = messages.placed_on(document, self.server_name)
        for robot_id, port in list(self.ports.items()):
            placed = mine.get(robot_id)
            if placed is None or placed.robot != port.robot:
                self._drop_robot(robot_id)
            elif port.rate_cap is None or port.rate_cap.rate_hz != placed.rate_hz:
                port.rate_cap = RateCap(placed.rate_hz, self.params["rate_burst"])
        for robot_id, placed in mine.items():
            if robot_id not in self.ports and self.refused_robots.get(robot_id, (None,))[0] != placed.robot:
                self._take_robot(placed)
        self.applied_version = version
        self.get_logger().info(f"assignment version {version} applied: serving {sorted(self.ports)}, models "
                               f"{self.server.model_ids}")

    def _take_robot(self, placed: messages.Placed) -> None:
        robot = placed.robot
        try:
            embodiment = self._embodiment_of(robot.robot_id)
            loaded = self.server.add_robot(robot)
        except ValueError as err:
            self._refuse_robot(robot, str(err))
            return
        try:
            port = self._add_robot(robot, embodiment)
        except ValueError as err:
            self.server.remove_robot(robot.robot_id)
            self.server.forget_robot(robot.robot_id)
            self._refuse_robot(robot, str(err))
            return
        port.rate_cap = RateCap(placed.rate_hz, self.params["rate_burst"])
        self.refused_robots.pop(robot.robot_id, None)
        self.get_logger().info(f"{robot.robot_id}: served here (model {robot.model_id}"
                               + (", loaded for it" if loaded else "") + f", SLO {1e3 * robot.slo_s:g} ms, "
                               f"{placed.rate_hz:g} Hz)")

    def _refuse_robot(self, robot: ServedRobot, reason: str) -> None:
        self.refused_robots[robot.robot_id] = (robot, reason)
        self.get_logger().error(f"{robot.robot_id}: assigned here but not served: {reason}")

    def _embodiment_of(self, robot_id: str) -> Embodiment:
        """A robot's profile under the controller: the one of `embodiments`, or its entry beside `robots`."""
        names = self.params["embodiments"]
        if len(names) != 1:
            robots = [r.strip("/") for r in self.params["robots"]]
            if len(names) != len(robots) or robot_id not in robots:
                raise ValueError(f"no embodiment for robot {robot_id}: give one embodiment for all robots, or one "
                                 "per entry of robots")
            names = [names[robots.index(robot_id)]]
        try:
            return load_embodiment(names[0])
        except EmbodimentError as err:
            raise ValueError(f"embodiments: {err}") from None

    def _drop_robot(self, robot_id: str) -> None:
        """No more frames of `robot_id`; its publishers stay until its frames in flight are published."""
        port = self.ports.pop(robot_id)
        port.assigned = False
        for subscription in port.subscriptions:
            self.destroy_subscription(subscription)
        port.subscriptions = []
        self.server.remove_robot(robot_id)
        self.draining[robot_id] = port
        self.get_logger().info(f"{robot_id}: no longer served here; {self.server.in_flight(robot_id)} frames to "
                               "finish")

    def _live_tick(self) -> None:
        """Drained robots' publishers go, idle models are let go, and the heartbeat leaves."""
        if self.server is None:
            return
        for robot_id, port in list(self.draining.items()):
            if self.server.in_flight(robot_id) == 0 or robot_id in self.ports:
                with port.lock:
                    port.closed = True
                for publisher in port.publishers:
                    self.destroy_publisher(publisher)
                del self.draining[robot_id]
                if robot_id not in self.server.robots:
                    self.server.forget_robot(robot_id)
                self.get_logger().info(f"{robot_id}: drained, its topics are gone")
        for model_id in self.server.unload_idle_models():
            self.get_logger().info(f"model {model_id} unloaded: no robot here needs it")
        if self.lifecycle == "active":
            self.heartbeat_pub.publish(String(data=messages.encode(self.heartbeat())))

    def heartbeat(self) -> dict:
        now, busy = time.monotonic(), self.server.runtime.busy_s
        since, busy_before = self._load_mark
        self._load_mark = (now, busy)
        robots = {}
        for robot_id, port in self.ports.items():
            counts = self.server.robot_counts(robot_id)
            with port.lock:
                robots[robot_id] = {"model_id": port.robot.model_id, "slo_s": port.robot.slo_s,
                                    "rate_hz": port.rate_cap.rate_hz if port.rate_cap else self.params["rate_hz"],
                                    "attainment": counts.attainment, "frames": counts.on_time + counts.missed,
                                    "over_rate": port.over_rate}
        return {"server": self.server_name, "version": max(self.applied_version, 0), "robots": robots,
                "models": self.server.model_ids, "load": min(1.0, (busy - busy_before) / max(now - since, 1e-9)),
                "pending": self.server.runtime.frames_pending(), "draining": sorted(self.draining),
                "refused_unassigned": self.refused_unassigned, "stale_assignments": self.stale_assignments,
                "bad_assignments": self.bad_assignments,
                "refused_robots": {r: why for r, (_, why) in self.refused_robots.items()}}
