"""The routing table of a replica pool: which replica serves which robot, at which placement epoch.

The decisions are the fleet placement's (`fleet.placement.FleetPlacement`, the one MILP, `placement.solve`), with
the replicas as its servers; this class only makes them safe to read while they are being made. Writers (a join, a
leave, a replica lost or back, a re-plan, a replica refusing a robot) take a lock and may run the MILP for seconds;
`route` never takes that lock: it reads the snapshot the last writer published (one dict, replaced whole), so
routing a request never waits for a placement.

A robot's **epoch** is the placement version at which it was put on its current replica; it changes only when the
robot moves (or joins again). Every chunk carries it, and the robot side keeps the newest (`fence.ChunkFence`): a
replica that lost the robot (partitioned, not yet told) answers with an older epoch, and its chunk is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..fleet.placement import FleetPlacement, JoinAnswer
from ..fleet.traffic import RobotSpec


@dataclass(frozen=True)
class Route:
    """Where a robot's requests go now: its replica and the epoch its chunks carry."""

    robot_id: str
    replica: str
    epoch: int
    model_id: str
    slo_s: float
    rate_hz: float


def robot_cap_load(max_robots_per_replica: int) -> Callable[[RobotSpec], float]:
    """A robot's load when a replica serves at most `max_robots_per_replica` robots, whatever their model."""
    if max_robots_per_replica < 1:
        raise ValueError("max_robots_per_replica must be >= 1")
    return lambda robot: 1.0 / max_robots_per_replica


class RoutingTable:
    def __init__(self, placement: FleetPlacement):
        self.placement = placement
        self._lock = threading.Lock()  # writers only
        self._avoid: dict[str, set[str]] = {}  # robot -> replicas that refused it
        self.refusals: dict[str, str] = {}  # robot -> why it was refused last (join or replica)
        self._routes: dict[str, Route] = {}
        self._lost: list[tuple[str, str, int]] = []  # (robot, replica it left, version then): replicas to tell
        self._lost_lock = threading.Lock()

    @property
    def replicas(self) -> list[str]:
        return list(self.placement.servers)

    # ---- readers (no lock) ----------------------------------------------------------------------------------------

    def route(self, robot_id: str) -> Route | None:
        """The robot's route, or None while it waits for a replica (or is not in the fleet)."""
        return self._routes.get(robot_id)

    def waiting(self, robot_id: str) -> str | None:
        """Why a robot in the fleet has no replica now; None when it has one or is not in the fleet."""
        return self.placement.unplaced.get(robot_id)

    def routes(self) -> dict[str, Route]:
        return dict(self._routes)

    def take_lost(self) -> list[tuple[str, str, int]]:
        """Every (robot, replica, version) since the last call where a robot left a replica (moved, left the
        fleet, or its replica was lost), so that the replica can let it go."""
        with self._lost_lock:
            lost, self._lost = self._lost, []
            return lost

    # ---- writers --------------------------------------------------------------------------------------------------

    def join(self, robot: RobotSpec) -> JoinAnswer:
        with self._lock:
            answer = self.placement.join(robot, self._avoid.get(robot.robot_id, ()))
            if not answer.accepted:
                self.refusals[str(robot.robot_id)] = answer.reason
            self._publish()
            return answer

    def leave(self, robot_id: str) -> str:
        with self._lock:
            reason = self.placement.leave(robot_id)
            self._avoid.pop(robot_id, None)
            self._publish()
            return reason

    def replica_down(self, replica: str) -> list[str]:
        """The replica stopped answering: its robots wait for the next re-plan (`tick`); returns them."""
        with self._lock:
            orphans = self.placement.server_down(replica)
            self._publish()
            return orphans

    def replica_up(self, replica: str) -> bool:
        with self._lock:
            back = self.placement.server_up(replica)
            self._publish()
            return back

    def tick(self, now: float) -> bool:
        """Run a pending re-plan (coalesced, `min_replan_interval_s`); True if it ran."""
        with self._lock:
            ran = self.placement.tick(now)
            if ran:
                self._publish()
            return ran

    def refused(self, robot_id: str, replica: str, epoch: int, reason: str) -> JoinAnswer | None:
        """`replica` refused the robot it was given at `epoch` (e.g. its model does not load there): the robot is
        placed again on another replica, or leaves the fleet with the reason. None when the report is stale (the
        robot has moved since, or left)."""
        with self._lock:
            route = self._routes.get(robot_id)
            if route is None or route.replica != replica or route.epoch != epoch:
                return None
            robot = self.placement.robots[robot_id]
            avoid = self._avoid.setdefault(robot_id, set())
            avoid.add(replica)
            self.placement.leave(robot_id)
            live = [s for s in self.placement.servers if s in self.placement.alive and s not in avoid]
            if live:
                answer = self.placement.join(robot, avoid)
            else:
                answer = JoinAnswer(robot_id, False, None, "", self.placement.version)
            if not answer.accepted:
                why = f"replica {replica} refused it ({reason})" + (f"; {answer.reason}" if answer.reason else
                                                                    "; no other live replica")
                answer = JoinAnswer(robot_id, False, None, why, answer.version)
                self.refusals[robot_id] = why
                self._avoid.pop(robot_id, None)
            self._publish()
            return answer

    def restore(self, reported: Iterable[Route]) -> None:
        """Take back the routes the replicas report (a restarted controller): every robot stays where it is served,
        at its epoch; a robot two replicas report (one not yet told it lost it) goes with its newest epoch. The
        placement's version continues from the newest epoch, so the next change makes a newer one."""
        newest: dict[str, Route] = {}
        for route in reported:
            if route.replica in self.placement.servers and \
                    (route.robot_id not in newest or route.epoch > newest[route.robot_id].epoch):
                newest[route.robot_id] = route
        reports: dict[str, dict] = {}
        for route in newest.values():
            report = reports.setdefault(route.replica, {"version": 0, "robots": {}})
            report["version"] = max(report["version"], route.epoch)
            report["robots"][route.robot_id] = {"model_id": route.model_id, "rate_hz": route.rate_hz,
                                                "slo_s": route.slo_s}
        with self._lock:
            self.placement.restore_from_servers(reports)
            self._routes = newest
            self._publish()

    def _publish(self) -> None:
        placement = self.placement
        routes = {}
        for robot_id, replica in placement.server_of.items():
            old = self._routes.get(robot_id)
            epoch = old.epoch if old is not None and old.replica == replica else placement.version
            robot = placement.robots[robot_id]
            routes[robot_id] = Route(robot_id, replica, epoch, robot.model_id, robot.slo_s, robot.rate_hz)
        gone = [(r, old.replica, placement.version) for r, old in self._routes.items()
                if r not in routes or routes[r].replica != old.replica]
        if gone:
            with self._lost_lock:
                self._lost += gone
        self._routes = routes  # one assignment: readers see the old table or the new one, whole


def make_table(replicas: Sequence[str], models: Iterable[str], max_robots_per_replica: int,
               min_replan_interval_s: float = 0.0) -> RoutingTable:
    """A table over `replicas` serving `models`, each replica holding at most `max_robots_per_replica` robots."""
    return RoutingTable(FleetPlacement(list(replicas), models, robot_cap_load(max_robots_per_replica),
                                       min_replan_interval_s=min_replan_interval_s))
