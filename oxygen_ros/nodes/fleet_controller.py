"""Fleet controller node: owns the placement of robots on the fleet's servers (one `fleet_node` each) and keeps it
current as robots join and leave and servers come and go.

The placement is `fleet.placement.FleetPlacement` (no ROS): a robot's load is its SLO-safe share of a server from
the profile table (`fleet.capacity.SloSafeLoads`: the simulator on the table, with the table's measured
co-run slowdown, `fleet.co_run`), and a server about to change is checked in the simulator at the target
(`DeviceCheck`). Topics (`fleet.messages`: JSON in std_msgs/String, and why no new interface):

- ``/fleet/join`` in, ``/fleet/join_answer`` out: a join is answered accepted with its server, or refused with
  the reason; a leave frees the robot's share. Requests the node cannot read are answered with the reason
  (counted).
- ``/fleet/heartbeat`` in: a server whose heartbeat is older than ``heartbeat_timeout_s`` is down and only its
  robots are re-placed (re-plans at most once per ``min_replan_interval_s``); one heard again is up.
- ``/fleet/assignment`` out (latched, with a version that every change raises): each node applies its part.
- ``/fleet/status`` out (latched, on every change and at ``status_rate_hz``): per robot its server, state and
  reason, SLO attainment (from the heartbeats); per server alive, planned load, measured load, robots and models.

Start-up: until every server has been heard from, at most ``recover_s``, the controller only listens. A newer assignment heard on the latched topic (another
controller's) is taken as it is; else the servers' heartbeats are (each reports its robots and the version it
applied), so a restarted controller takes the fleet back without moving anyone. Durability lives in the writer:
the latched copy of a controller that died is gone with it, which is why the heartbeats carry enough to rebuild
the placement (a server heard only later that serves robots at the placement's version has them adopted where
they are). Until then joins are answered "recovering". Then the robots of ``fleet_file`` (``{"robots": [...]}``
as `fleet-assign` reads) join.

Parameters: ``servers`` (server names, e.g. gpu0, gpu1: each fleet_node's ``server_name``), ``models`` (the model
ids the fleet serves: ``id`` or ``id=source[:seed]``), ``profile_file`` (required: the table every server plans
from), ``design``, ``guard``, ``target`` (SLO attainment, 0.98), ``capacity`` (a server's load limit, 1.0),
``max_robots_per_server`` (the bisection's upper end), ``load_seeds``, ``load_duration_s``, ``check_servers`` (the
simulator check, true), ``heartbeat_timeout_s``, ``min_replan_interval_s``, ``recover_s``, ``fleet_file``,
``status_rate_hz``, ``metrics_port`` (0: none; else the status as Prometheus metrics on that port, every
interface, `fleet.metrics`).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("fleet_controller"))

import json
import time
from collections.abc import Sequence
from pathlib import Path

from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from oxygen_ros.fleet import messages
from oxygen_ros.fleet.capacity import DeviceCheck, SloSafeLoads
from oxygen_ros.fleet.co_run import planning_guard, planning_interference
from oxygen_ros.fleet.designs import DESIGNS
from oxygen_ros.fleet.metrics import serve_metrics
from oxygen_ros.fleet.placement import FleetPlacement
from oxygen_ros.fleet.profile_table import ProfileTable
from oxygen_ros.fleet.simulator import SimConfig
from oxygen_ros.fleet.specs import ModelSpec
from oxygen_ros.fleet.traffic import RobotSpec

from .lifecycle import ros_process, spinning
from .qos import LATCHED_QOS

NODE_NAME = "fleet_controller"
RELIABLE = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
DEFAULTS = {
    "servers": ["gpu0"],
    "models": ["a"],
    "profile_file": "",
    "design": "monolithic",  # designs.DEFAULT_DESIGN
    "guard": 1.1,  # co_run.DEFAULT_GUARD
    "target": 0.98,  # capacity.TARGET
    "capacity": 1.0,
    "max_robots_per_server": 64,
    "load_seeds": 2,
    "load_duration_s": 3.0,
    "check_servers": True,
    "heartbeat_timeout_s": 2.0,
    "min_replan_interval_s": 0.5,
    "recover_s": 3.0,
    "fleet_file": "",
    "status_rate_hz": 1.0,
    "metrics_port": 0,
}
MAX_REFUSALS_SHOWN = 20


def placement_from(p: dict) -> FleetPlacement:
    """The placement the parameters describe (ValueError on a bad one)."""
    if not p["profile_file"]:
        raise ValueError("profile_file is required: the table every server plans from")
    if p["design"] not in DESIGNS:
        raise ValueError(f"design must be one of {DESIGNS}, got {p['design']!r}")
    if not 0 < p["target"] <= 1:
        raise ValueError("target must be in (0, 1]")
    lut = ProfileTable.load(p["profile_file"])
    models = [ModelSpec.parse(text).model_id for text in p["models"]]
    missing = sorted(set(models) - set(lut.models()))
    if missing:
        raise ValueError(f"the profile table has no entries for models {missing}")
    config = SimConfig(design=p["design"], guard=planning_guard(lut, p["guard"]), interference=planning_interference(lut),
                       duration_s=p["load_duration_s"])
    seeds = range(p["load_seeds"])
    loads = SloSafeLoads(lut, config, seeds=seeds, high=p["max_robots_per_server"], target=p["target"])
    check = DeviceCheck(lut, config, seeds=seeds, target=p["target"]) if p["check_servers"] else None
    return FleetPlacement(list(p["servers"]), models, loads, check, capacity=p["capacity"],
                          min_replan_interval_s=p["min_replan_interval_s"])


class FleetController(Node):
    def __init__(self, context=None):
        super().__init__(NODE_NAME, context=context)
        self.params = {name: self.declare_parameter(name, value).value for name, value in DEFAULTS.items()}
        if not 0 <= self.params["metrics_port"] <= 65535:
            raise ValueError(f"metrics_port must be 0 (none) or a port, got {self.params['metrics_port']}")
        self.placement = placement_from(self.params)
        self.started = time.monotonic()
        self.ready = False
        self.heard: dict[str, dict] = {}  # server -> its latest heartbeat
        self.last_beat: dict[str, float] = {}
        self.latched: dict | None = None  # the newest assignment heard from another writer while recovering
        self.refused: dict[str, str] = {}  # the latest refusals, robot -> reason
        self.bad_requests = 0
        self.bad_heartbeats = 0
        self._published_version = -1
        self.latest_status: dict | None = None  # what the metrics read: replaced whole on each publish
        self.metrics = None
        self.assignment_pub = self.create_publisher(String, messages.ASSIGNMENT, LATCHED_QOS)
        self.status_pub = self.create_publisher(String, messages.STATUS, LATCHED_QOS)
        self.answer_pub = self.create_publisher(String, messages.JOIN_ANSWER, RELIABLE)
        self.create_subscription(String, messages.ASSIGNMENT, self._on_assignment, LATCHED_QOS)
        self.create_subscription(String, messages.HEARTBEAT, self._on_heartbeat, RELIABLE)
        self.create_subscription(String, messages.JOIN, self._on_join, RELIABLE)
        self.create_timer(0.1, self._tick)
        self.create_timer(1.0 / self.params["status_rate_hz"], self._publish_status)
        if self.params["metrics_port"]:
            self.metrics = serve_metrics(self.params["metrics_port"], lambda: self.latest_status)
            self.get_logger().info(f"Prometheus metrics on port {self.metrics.server_port}")
        self.get_logger().info(f"fleet controller for servers {self.placement.servers}, models "
                               f"{sorted(self.placement.models)}, design {self.params['design']}: recovering for "
                               f"{self.params['recover_s']:g} s")

    # ---- inputs ---------------------------------------------------------------------------------------------------

    def _on_assignment(self, msg: String) -> None:
        if self.ready:
            return  # ours, or a stale copy: the placement is this node's from now on
        try:
            document = messages.read_assignment(msg.data)
        except messages.MessageError as err:
            self.get_logger().warning(f"unreadable assignment while recovering: {err}")
            return
        if self.latched is None or document["version"] > self.latched["version"]:
            self.latched = document

    def _on_heartbeat(self, msg: String) -> None:
        try:
            beat = messages.read_heartbeat(msg.data)
        except messages.MessageError as err:
            self.bad_heartbeats += 1
            self.get_logger().warning(f"dropped heartbeat: {err}", throttle_duration_sec=5.0)
            return
        server = beat["server"]
        if server not in self.placement.servers:
            self.bad_heartbeats += 1
            self.get_logger().warning(f"heartbeat of unknown server {server!r}", throttle_duration_sec=5.0)
            return
        self.heard[server] = beat
        self.last_beat[server] = time.monotonic()
        if not self.ready:
            return
        if self.placement.server_up(server):
            self.get_logger().info(f"server {server} is up")
        adopted = self.placement.adopt(server, beat)
        if adopted:
            self.get_logger().warning(f"server {server} serves {adopted}, unknown here: adopted where they are")
        self._publish()

    def _on_join(self, msg: String) -> None:
        try:
            request = messages.read_join(msg.data)
        except messages.MessageError as err:
            self.bad_requests += 1
            robot_id = _robot_id_of(msg.data)
            self._answer({"op": "join", "robot_id": robot_id, "accepted": False, "server": None,
                          "reason": f"bad request: {err}", "version": self.placement.version})
            return
        if not self.ready:
            self._answer({**request, "accepted": False, "server": None,
                          "reason": "the controller is recovering the fleet's placement; ask again",
                          "version": self.placement.version})
            return
        if request["op"] == "leave":
            reason = self.placement.leave(request["robot_id"])
            self._answer({"op": "leave", "robot_id": request["robot_id"], "accepted": not reason, "server": None,
                          "reason": reason, "version": self.placement.version})
            if not reason:
                self.get_logger().info(f"{request['robot_id']} left")
            self._publish()
            return
        self._join(RobotSpec(request["robot_id"], request["model_id"], request["rate_hz"], request["slo_s"]))

    def _join(self, robot: RobotSpec) -> None:
        answer = self.placement.join(robot)
        if answer.accepted:
            self.refused.pop(robot.robot_id, None)
            self.get_logger().info(f"{robot.robot_id} joined on {answer.server} (version {answer.version}, "
                                   f"moved {self.placement.moved})")
        else:
            self.refused[robot.robot_id] = answer.reason
            while len(self.refused) > MAX_REFUSALS_SHOWN:
                self.refused.pop(next(iter(self.refused)))
            self.get_logger().warning(f"{robot.robot_id} refused: {answer.reason}")
        self._answer({"op": "join", "robot_id": answer.robot_id, "accepted": answer.accepted,
                      "server": answer.server, "reason": answer.reason, "version": answer.version})
        self._publish()

    def _answer(self, answer: dict) -> None:
        self.answer_pub.publish(String(data=messages.encode(answer)))

    # ---- time -----------------------------------------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        if not self.ready:
            if set(self.heard) == set(self.placement.servers) or now - self.started >= self.params["recover_s"]:
                self._recover()
            return
        for server in sorted(self.placement.alive):
            if now - self.last_beat.get(server, self.started) > self.params["heartbeat_timeout_s"]:
                orphans = self.placement.server_down(server)
                self.get_logger().warning(f"server {server}'s heartbeat lapsed: re-placing {orphans}")
        if self.placement.tick(now):
            self.get_logger().info(f"re-planned (version {self.placement.version}); waiting: "
                                   f"{sorted(self.placement.unplaced)}")
        self._publish()

    def _recover(self) -> None:
        placement = self.placement
        if self.latched is not None:
            placement.restore(self.latched)
            source = f"the latched assignment (version {self.latched['version']})"
        elif any(beat["robots"] for beat in self.heard.values()):
            placement.restore_from_servers(self.heard)
            source = f"the heartbeats of {sorted(self.heard)}"
        else:
            source = "nothing (a new fleet)"
        if placement.restore_warnings:
            self.get_logger().warning(f"restored robots of models not in 'models': {placement.restore_warnings}")
        for server in placement.servers:  # servers not heard from are down until their first heartbeat
            if server not in self.heard:
                placement.server_down(server)
        self.ready = True
        self.get_logger().info(f"recovered from {source}: version {placement.version}, {len(placement.server_of)} "
                               f"robots placed, live servers {sorted(placement.alive)}")
        self._publish(force=True)
        if self.params["fleet_file"]:
            for robot in json.loads(Path(self.params["fleet_file"]).read_text())["robots"]:
                if robot["robot_id"] not in placement.robots:
                    self._join(RobotSpec(robot["robot_id"], robot["model_id"], float(robot["rate_hz"]),
                                         float(robot["slo_s"])))

    # ---- outputs --------------------------------------------------------------------------------------------------

    def _publish(self, force: bool = False) -> None:
        if not self.ready or (self.placement.version == self._published_version and not force):
            return
        self._published_version = self.placement.version
        self.assignment_pub.publish(String(data=messages.encode(self.placement.document())))
        self._publish_status()

    def status(self) -> dict:
        """The fleet-wide view: robots (server, state, reason, attainment), servers (alive, planned and measured
        load, robots, models), the latest refusals and the counts of bad input."""
        now = time.monotonic()
        placement = self.placement
        robots = {}
        for robot_id, spec in sorted(placement.robots.items()):
            server = placement.server_of.get(robot_id)
            reported = self.heard.get(server, {}).get("robots", {}).get(robot_id, {}) if server else {}
            robots[robot_id] = {"server": server, "model_id": spec.model_id, "rate_hz": spec.rate_hz,
                                "slo_s": spec.slo_s, "state": "placed" if server else "waiting",
                                "reason": placement.unplaced.get(robot_id, ""),
                                "attainment": reported.get("attainment"), "served": bool(reported)}
        servers = {}
        for server in placement.servers:
            beat = self.heard.get(server, {})
            servers[server] = {"alive": server in placement.alive, "planned_load": placement.server_load(server),
                               "measured_load": beat.get("load"), "robots": [r.robot_id for r in
                                                                             placement.robots_on(server)],
                               "models": beat.get("models", []), "applied_version": beat.get("version"),
                               "heartbeat_age_s": now - self.last_beat[server] if server in self.last_beat else None}
        return {"version": placement.version, "ready": self.ready, "robots": robots, "servers": servers,
                "refused": dict(self.refused), "replans": placement.replans, "moved": placement.moved,
                "bad_requests": self.bad_requests, "bad_heartbeats": self.bad_heartbeats}

    def _publish_status(self) -> None:
        self.latest_status = self.status()
        self.status_pub.publish(String(data=messages.encode(self.latest_status)))

    def destroy_node(self) -> None:
        if self.metrics is not None:
            self.metrics.shutdown()
            self.metrics.server_close()
            self.metrics = None
        super().destroy_node()


def _robot_id_of(text: str) -> str:
    try:
        value = json.loads(text).get("robot_id", "")
    except (json.JSONDecodeError, AttributeError, TypeError):
        return ""
    return value if isinstance(value, str) else ""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with ros_process(NODE_NAME, argv) as (context, stop):
        try:
            node = FleetController(context=context)
        except (ValueError, OSError, KeyError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        with spinning(node, stop) as spinner:
            stop.wait()
        if spinner.failure is not None:
            print(f"error: fleet controller failed: {spinner.failure!r}", file=sys.stderr)
            return 1
        return 0
