"""The fleet's live placement, without ROS (the Ray pool's placement controller runs it, `scaleout/routing.py`):
which server serves which robot, kept current as robots join and leave and servers come and go.

A robot's load is its fraction of one server (`load_of(robot)`, e.g. `fleet.capacity.SloSafeLoads`:
1 / the robots like it one device serves at the target attainment in the simulator on the profile table); a
server holds at most `capacity` of load. Placement is a MILP over binary robot -> server choices (`solve`) with a
lexicographic objective: robots stay where they are (a move costs more than any number of resident models),
then fewest (model, server) pairs (a model's frames batch only with frames on the same server, and each pair is a
resident copy), then the lowest maximum load.

- `join`: accepted with its server, or refused with the reason: a bad robot id, rate or SLO, a duplicate id, an
  unknown model, an SLO no server can meet (the robot alone does not reach the target), or it does not fit at
  the target (no placement under `capacity`, even moving others; or `fits` says a server it would change misses
  the target). Others move only where the new robot could not fit without it.
- `leave`: the robot's share is free at once; nobody else moves.
- `server_down` (it stopped answering): only its robots are re-placed, every other robot stays pinned; those
  that fit nowhere wait as unplaced, with the reason, and are tried again at the next re-plan (a server back up,
  a robot leaving).
- Re-plans that place several robots (after a lapse, a server back, a leave with robots waiting) are coalesced and
  run at most once per `min_replan_interval_s` (`tick`); a join or leave is answered at once.
- Every change raises `version`; `restore_from_servers` takes the placement back from the servers' own reports (a
  restarted controller) without moving anyone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, milp

from .traffic import LinearRows, RobotSpec

ROBOT_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
"""A robot id is its ROS namespace: a letter, then letters, digits and underscores."""


@dataclass(frozen=True)
class JoinAnswer:
    robot_id: str
    accepted: bool
    server: str | None
    reason: str  # why it was refused; empty when accepted
    version: int


@dataclass
class Solution:
    server_of: dict[str, str]  # robot -> server, for every robot placed
    unplaced: list[str]  # optional robots left out


def solve(robots: Sequence[RobotSpec], loads: Mapping[str, float], servers: Sequence[str], capacity: float,
          previous: Mapping[str, str] | None = None, pinned: Iterable[str] = (), optional: Iterable[str] = (),
          forbidden: Iterable[tuple[str, str]] = (), time_limit_s: float = 5.0) -> Solution | None:
    """Place `robots` on `servers` (each server's load <= `capacity`); None when no placement exists.

    `previous` (robot -> server): moving a robot off its server costs more than any count of (model, server)
    pairs, so robots stay unless they could not all fit otherwise. `pinned` robots keep their previous server.
    `optional` robots may be left out (each one placed is worth more than any number of moves); every other
    robot must be placed. `forbidden`: (robot, server) pairs not allowed."""
    robots = list(robots)
    servers = list(servers)
    if not robots:
        return Solution({}, [])
    if not servers:
        return None
    previous = dict(previous or {})
    pinned, optional, forbidden = set(pinned), set(optional), set(forbidden)
    models = sorted({r.model_id for r in robots})
    n_r, n_s, n_m = len(robots), len(servers), len(models)
    col_x = lambda r, s: r * n_s + s  # noqa: E731
    col_y = lambda m, s: n_r * n_s + m * n_s + s  # noqa: E731
    n_vars = n_r * n_s + n_m * n_s + 1
    col_l = n_vars - 1
    w_move = float(n_m * n_s + 1)  # one move outweighs every pair there could be
    w_place = w_move * (n_r + 1)  # one more robot placed outweighs every move
    cost = np.zeros(n_vars)
    cost[n_r * n_s:col_l] = 1.0
    cost[col_l] = 0.5 / max(capacity, 1e-12)  # the load term stays below one pair
    lower, upper = np.zeros(n_vars), np.ones(n_vars)
    upper[col_l] = np.inf
    rows = LinearRows(n_vars)
    constrain = rows.add
    for r, robot in enumerate(robots):
        rid = robot.robot_id
        home = previous.get(rid)
        for s, server in enumerate(servers):
            if (rid, server) in forbidden:
                upper[col_x(r, s)] = 0.0
            if rid in pinned:
                if home not in servers:
                    raise ValueError(f"robot {rid} is pinned to {home!r}, which is not a live server")
                bound = 1.0 if server == home else 0.0
                lower[col_x(r, s)] = upper[col_x(r, s)] = bound
            if server == home:
                cost[col_x(r, s)] -= w_move
            if rid in optional:
                cost[col_x(r, s)] -= w_place
            constrain({col_x(r, s): 1.0, col_y(models.index(robot.model_id), s): -1.0}, -np.inf, 0.0)
        constrain({col_x(r, s): 1.0 for s in range(n_s)}, 0.0 if rid in optional else 1.0, 1.0)
    for s in range(n_s):
        load = {col_x(r, s): loads[robot.robot_id] for r, robot in enumerate(robots)}
        constrain(load, -np.inf, capacity + 1e-9)
        constrain({**load, col_l: -1.0}, -np.inf, 0.0)
    integrality = np.ones(n_vars)
    integrality[col_l] = 0
    result = milp(cost, integrality=integrality, bounds=Bounds(lower, upper),
                  constraints=rows.constraint(),
                  options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9})
    if result.x is None:
        return None
    x = np.rint(result.x[:n_r * n_s]).reshape(n_r, n_s)
    server_of, unplaced = {}, []
    for r, robot in enumerate(robots):
        chosen = np.flatnonzero(x[r] > 0.5)
        if chosen.size:
            server_of[robot.robot_id] = servers[int(chosen[0])]
        else:
            unplaced.append(robot.robot_id)
    return Solution(server_of, unplaced)


class FleetPlacement:
    """The controller's state and decisions (see the module). `fits(robots)` checks a server's robots at the
    target (e.g. the simulator on the table): None when they make it, else the reason; None: trust the loads.
    `clock`-free: every call that can re-plan takes `now`."""

    def __init__(self, servers: Sequence[str], models: Iterable[str], load_of: Callable[[RobotSpec], float],
                 fits: Callable[[Sequence[RobotSpec]], str | None] | None = None, capacity: float = 1.0,
                 min_replan_interval_s: float = 1.0, time_limit_s: float = 5.0):
        if not servers or len(set(servers)) != len(servers):
            raise ValueError("servers must be a non-empty list of distinct names")
        if not 0 < capacity <= 1.0:
            raise ValueError("capacity must be in (0, 1]")
        if min_replan_interval_s < 0:
            raise ValueError("min_replan_interval_s must be >= 0")
        self.servers = list(servers)
        self.models = set(models)
        self.load_of = load_of
        self.fits = fits
        self.capacity = capacity
        self.min_replan_interval_s = min_replan_interval_s
        self.time_limit_s = time_limit_s
        self.robots: dict[str, RobotSpec] = {}
        self.loads: dict[str, float] = {}
        self.server_of: dict[str, str] = {}
        self.unplaced: dict[str, str] = {}  # robot -> why it waits for a server
        self.alive: set[str] = set(servers)
        self.version = 0
        self.moved: list[str] = []  # robots the last change moved from one server to another
        self.replans = 0
        self._replan_wanted = False
        self._last_replan = -math.inf

    # ---- what is placed -------------------------------------------------------------------------------------------

    def robots_on(self, server: str) -> list[RobotSpec]:
        return [self.robots[r] for r, s in sorted(self.server_of.items()) if s == server]

    def server_load(self, server: str) -> float:
        return sum(self.loads[r.robot_id] for r in self.robots_on(server))

    # ---- robots ---------------------------------------------------------------------------------------------------

    def check_robot(self, robot: RobotSpec) -> str:
        """Why `robot` cannot join, or "" (everything but whether it fits)."""
        if not isinstance(robot.robot_id, str) or not ROBOT_ID.match(robot.robot_id):
            return (f"robot id {robot.robot_id!r} is not a valid namespace name (a letter, then letters, digits or "
                    "underscores)")
        if robot.robot_id in self.robots:
            where = self.server_of.get(robot.robot_id)
            return f"duplicate robot id {robot.robot_id}: already " + (f"placed on {where}" if where else "waiting")
        if robot.model_id not in self.models:
            return f"unknown model {robot.model_id!r} (served: {sorted(self.models)})"
        for name, value in (("rate_hz", robot.rate_hz), ("slo_s", robot.slo_s)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                return f"{name} must be a positive number, got {value!r}"
        return ""

    def join(self, robot: RobotSpec, avoid: Iterable[str] = ()) -> JoinAnswer:
        """Place `robot` now (see the module), on none of the servers in `avoid` (one that refused it); the
        placement is unchanged when it is refused."""
        reason = self.check_robot(robot)
        if reason:
            return JoinAnswer(str(robot.robot_id), False, None, reason, self.version)
        load = float(self.load_of(robot))
        if not math.isfinite(load) or load > self.capacity:
            alone = "cannot reach the target even alone on a server" if not math.isfinite(load) else \
                f"alone needs {load:.2f} of a server (capacity {self.capacity:g})"
            return self._refuse(robot, f"no server can meet its SLO: {1e3 * robot.slo_s:g} ms at {robot.rate_hz:g} "
                                       f"Hz on model {robot.model_id} {alone}")
        if not self.alive:
            return self._refuse(robot, "no live server")
        robots = [*self.placed_specs(), robot]
        loads = {**self.loads, robot.robot_id: load}
        placed = self._verified(robots, loads, newcomers={robot.robot_id},
                                forbidden={(robot.robot_id, server) for server in avoid})
        if isinstance(placed, str):
            return self._refuse(robot, placed)
        self.robots[robot.robot_id], self.loads[robot.robot_id] = robot, load
        self._apply(placed.server_of)
        return JoinAnswer(robot.robot_id, True, placed.server_of[robot.robot_id], "", self.version)

    def _refuse(self, robot: RobotSpec, reason: str) -> JoinAnswer:
        return JoinAnswer(robot.robot_id, False, None, reason, self.version)

    def placed_specs(self) -> list[RobotSpec]:
        return [self.robots[r] for r in sorted(self.server_of)]

    def leave(self, robot_id: str) -> str:
        """Remove a robot; "" or why not (it is not in the fleet). Nobody moves; robots waiting are tried again
        at the next re-plan."""
        if robot_id not in self.robots:
            return f"robot {robot_id} is not in the fleet"
        del self.robots[robot_id], self.loads[robot_id]
        self.server_of.pop(robot_id, None)
        self.unplaced.pop(robot_id, None)
        self.moved = []
        self.version += 1
        if self.unplaced:
            self._replan_wanted = True
        return ""

    # ---- servers --------------------------------------------------------------------------------------------------

    def server_down(self, server: str) -> list[str]:
        """`server` stopped answering: its robots wait for a re-plan (the others stay); returns them."""
        if server not in self.alive:
            return []
        self.alive.discard(server)
        orphans = [r for r, s in sorted(self.server_of.items()) if s == server]
        for robot_id in orphans:
            del self.server_of[robot_id]
            self.unplaced[robot_id] = f"server {server} lapsed; waiting for a server with room"
        if orphans:  # a server without robots going down changes no robot's placement: no new version
            self.moved = []
            self.version += 1
            self._replan_wanted = True
        return orphans

    def server_up(self, server: str) -> bool:
        """`server` answers (again); True when it was down. Nobody moves to it but the robots waiting."""
        if server not in self.servers:
            raise KeyError(f"unknown server {server!r} (servers: {self.servers})")
        if server in self.alive:
            return False
        self.alive.add(server)
        if self.unplaced:  # the re-plan that may place them raises the version
            self._replan_wanted = True
        return True

    # ---- re-plans -------------------------------------------------------------------------------------------------

    @property
    def replan_pending(self) -> bool:
        return self._replan_wanted

    def tick(self, now: float) -> bool:
        """Run the pending re-plan if `min_replan_interval_s` has passed since the last one; True if it ran."""
        if not self._replan_wanted or now - self._last_replan < self.min_replan_interval_s:
            return False
        self._replan_wanted = False
        self._last_replan = now
        self.replans += 1
        waiting = sorted(self.unplaced)
        robots = [*self.placed_specs(), *(self.robots[r] for r in waiting)]
        placed = self._verified(robots, self.loads, newcomers=set(waiting), pinned=set(self.server_of),
                                optional=set(waiting))
        if isinstance(placed, str):  # the placed robots alone always fit: they are pinned where they are
            raise RuntimeError(f"re-plan failed with every robot pinned: {placed}")
        before = dict(self.unplaced)
        self._apply(placed.server_of)
        for robot_id in placed.unplaced:
            self.unplaced[robot_id] = before[robot_id]
        return True

    def _verified(self, robots: list[RobotSpec], loads: Mapping[str, float], newcomers: set[str],
                  pinned: set[str] = frozenset(), optional: set[str] = frozenset(),
                  forbidden: set[tuple[str, str]] = frozenset()) -> Solution | str:
        """The MILP's placement (no robot on a `forbidden` server), each server whose robots changed checked with
        `fits`; a server that misses the target loses its heaviest new arrival (forbidden there too) and the MILP
        runs again. The reason when nothing is left to try."""
        forbidden = set(forbidden)
        alive = [s for s in self.servers if s in self.alive]
        last_miss = ""
        while True:
            solution = solve(robots, loads, alive, self.capacity, self.server_of, pinned, optional, forbidden,
                             self.time_limit_s)
            if solution is None:
                need = max(loads[r] for r in newcomers) if newcomers else 0.0
                free = max((self.capacity - self.server_load(s) for s in alive), default=0.0)
                return last_miss or (f"does not fit at the target: it needs {need:.2f} of a server and no placement "
                                     f"of the fleet has that free, even moving robots (most free now on one live "
                                     f"server: {free:.2f})")
            if self.fits is None:
                return solution
            failing = None
            for server in alive:
                mine = sorted(r for r, s in solution.server_of.items() if s == server)
                if mine != sorted(r.robot_id for r in self.robots_on(server)):
                    miss = self.fits([r for r in robots if r.robot_id in mine])
                    if miss:
                        failing, last_miss = server, f"does not fit at the target on {server}: {miss}"
                        break
            if failing is None:
                return solution
            arrivals = [r for r, s in solution.server_of.items() if s == failing and self.server_of.get(r) != failing]
            if not arrivals:
                return last_miss
            forbidden.add((max(arrivals, key=lambda r: (loads[r], r)), failing))

    def _apply(self, server_of: Mapping[str, str]) -> None:
        before = dict(self.server_of)
        self.moved = sorted(r for r, s in server_of.items() if r in before and before[r] != s)
        for robot_id, server in server_of.items():
            self.server_of[robot_id] = server
            self.unplaced.pop(robot_id, None)
        self.version += 1

    # ---- a restarted controller -----------------------------------------------------------------------------------

    def restore_from_servers(self, reports: Mapping[str, Mapping]) -> None:
        """Rebuild the placement from the servers' own reports (``{"version": v, "robots": {id:
        {"model_id", "rate_hz", "slo_s"}}}`` per server): every robot stays where it is served. A robot two servers
        report (one of them behind) goes with the server whose report is newest."""
        robots, server_of, newest = {}, {}, {}
        for server, report in sorted(reports.items(), key=lambda item: int(item[1].get("version", 0))):
            if server not in self.servers:
                continue
            for robot_id, spec in report.get("robots", {}).items():
                robots[robot_id] = RobotSpec(robot_id, spec["model_id"], float(spec["rate_hz"]), float(spec["slo_s"]))
                server_of[robot_id] = server
            newest[server] = int(report.get("version", 0))
        self._restore(robots, server_of, {}, max(newest.values(), default=0))

    def _restore(self, robots: dict[str, RobotSpec], server_of: dict[str, str], unplaced: dict[str, str],
                 version: int) -> None:
        unknown = sorted(set(server_of.values()) - set(self.servers))
        if unknown:
            raise ValueError(f"the reports name servers this placement does not have: {unknown}")
        self.robots = robots
        self.loads = {r: float(self.load_of(spec)) for r, spec in robots.items()}
        self.server_of = server_of
        self.unplaced = {r: unplaced.get(r, "waiting for a server") for r in robots if r not in server_of}
        self.version = version
        self.moved = []
        self._replan_wanted = bool(self.unplaced)
