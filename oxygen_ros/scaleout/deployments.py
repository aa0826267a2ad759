"""The pool on Ray Serve: a placement controller actor, one Serve deployment per replica slot, a websocket ingress.

- `PlacementController`: a named, detached Ray actor (`CONTROLLER`, one per cluster by construction) owning the
  routing table (`routing.RoutingTable`: the fleet placement's MILP). Threaded: `route` reads the published table
  while a join's MILP runs on another of its threads, and its own watch thread probes every replica (`ping` through
  Serve, `probe_timeout_s`), marks one that leaves `probe_misses` probes in a row unanswered down (its robots wait
  for the re-plan, which the same thread runs, coalesced) and back up, and tells a replica that lost a robot (`release`).
- `FleetReplica`: the engine's multi-robot server on one device (`replica.ReplicaCore`), deployed once per slot
  (`replica0`, `replica1`, ...; one replica each): the slots are the placement's servers, and Ray places, health
  checks and restarts each slot's process.
- `FleetIngress`: openpi's websocket protocol behind Serve's HTTP proxy. A robot connects to
  ``/robots/<robot_id>?model=<id>&rate_hz=<hz>&slo_ms=<ms>`` (openpi-client: the whole URL as `host`); the connection
  is its join (refused: closed with code 1008 and the reason) and its end is the robot's leave. Each request
  follows the robot's route at that moment to its replica; a replica that fails or times out loses that chunk
  (the client gets a text error, as openpi's server sends one) and is probed; a replica that refuses the robot is
  reported, and the robot is placed again or told why not.
"""


import asyncio
import hmac
import logging
import threading
import time
from collections import Counter
from dataclasses import asdict

import ray
from fastapi import FastAPI, WebSocket
from ray import serve
from starlette.websockets import WebSocketDisconnect

from ..fleet.traffic import RobotSpec
from ..serving.protocol import pack
from .routing import Route, make_table

CONTROLLER, NAMESPACE, APP = "oxygen_ros_placement", "oxygen_ros", "oxygen_fleet"
POLICY_VIOLATION = 1008  # websocket close code: a refused join
CONTROLLER_TIMEOUT_S = 1.0  # a route or a leave waits this long for the controller
ACTIVE_S = 3.0  # a restarted controller takes back the robots that sent a request this recently
log = logging.getLogger("oxygen_ros.scaleout")


def replica_names(count: int) -> list[str]:
    return [f"replica{i}" for i in range(count)]


class PlacementController:
    """The routing table's owner (see the module); plain methods, made a Ray actor by `start_controller`."""

    def __init__(self, replicas: list[str], models: list[str], max_robots_per_replica: int,
                 probe_period_s: float = 0.5, probe_timeout_s: float = 1.0, probe_misses: int = 3, app: str = APP):
        self.table = make_table(replicas, models, max_robots_per_replica)
        self.app = app
        self.probe_period_s, self.probe_timeout_s = probe_period_s, probe_timeout_s
        # a replica is down after this many probes in a row went unanswered: one slow answer on a loaded host is not
        # a dead replica (marking it down would move its robots for nothing)
        self.probe_misses = probe_misses
        self._missed: Counter = Counter()  # replica -> probes unanswered in a row
        self.counts: Counter = Counter()
        self.events: list[tuple[float, str, str]] = []  # (wall time, replica, "down" | "up")
        self._releases: dict[tuple[str, str], int] = {}  # (robot, replica that lost it) -> the version then
        self._seen: set[str] = set()  # replicas that have answered once (one still starting is not down)
        if ray.get_runtime_context().was_current_actor_reconstructed:
            self._recover()
        threading.Thread(target=self._watch, name="placement-watch", daemon=True).start()

    def _recover(self, rounds: int = 10) -> None:
        """A restarted controller (its process died, Ray started it again): the routing table back from what the
        replicas serve, nobody moved. A replica that does not answer in `rounds` probes is left to the watch."""
        reported, heard = [], set()
        for _ in range(rounds):
            for replica in self.table.replicas:
                if replica in heard:
                    continue
                try:
                    routes = serve.get_deployment_handle(replica, self.app).report.remote(ACTIVE_S) \
                        .result(timeout_s=self.probe_timeout_s)
                except Exception:
                    continue
                heard.add(replica)
                reported += [Route(**route) for route in routes]
            if len(heard) == len(self.table.replicas):
                break
            time.sleep(self.probe_period_s)
        self.table.restore(reported)
        self._seen = heard
        self.counts["recovered_robots"] = len(self.table.routes())
        log.warning(f"placement controller restarted: {len(self.table.routes())} robots taken back from "
                    f"{sorted(heard)}")

    def join(self, robot_id: str, model_id: str, rate_hz: float, slo_s: float) -> dict:
        answer = self.table.join(RobotSpec(robot_id, model_id, rate_hz, slo_s))
        self.counts["joins" if answer.accepted else "refused_joins"] += 1
        return asdict(answer)

    def leave(self, robot_id: str) -> str:
        return self.table.leave(robot_id)

    def route(self, robot_id: str) -> dict | None:
        """The robot's route ({replica, epoch, model_id, slo_s}), or {"waiting": why}, or None (not in the fleet)."""
        route = self.table.route(robot_id)
        if route is not None:
            return asdict(route)
        why = self.table.waiting(robot_id)
        return None if why is None else {"waiting": why}

    def refused(self, robot_id: str, replica: str, epoch: int, reason: str) -> dict | None:
        self.counts["replica_refusals"] += 1
        answer = self.table.refused(robot_id, replica, epoch, reason)
        return None if answer is None else asdict(answer)

    def status(self) -> dict:
        placement = self.table.placement
        return {"version": placement.version, "routes": {r: asdict(v) for r, v in self.table.routes().items()},
                "waiting": dict(placement.unplaced), "alive": sorted(placement.alive & self._seen),
                "counts": dict(self.counts), "events": list(self.events)}

    # ---- the watch thread: health, re-plans, releases -------------------------------------------------------------

    def _watch(self) -> None:
        while True:
            for replica in self.table.replicas:
                alive = self._probe(replica)
                self._missed[replica] = 0 if alive else self._missed[replica] + 1
                if not alive and self._missed[replica] >= self.probe_misses and replica in self._seen \
                        and replica in self.table.placement.alive:
                    self.table.replica_down(replica)
                    self._event(replica, "down")
                elif alive and (self.table.replica_up(replica) or replica not in self._seen):
                    self._seen = self._seen | {replica}  # replaced whole: `status` reads it
                    self._event(replica, "up")
            self.table.tick(time.monotonic())
            self._release_moved()
            self.counts["watch_rounds"] += 1
            time.sleep(self.probe_period_s)

    def _event(self, replica: str, state: str) -> None:
        self.counts[f"replicas_{state}"] += 1
        self.events.append((time.time(), replica, state))
        log.warning(f"replica {replica} is {state}")

    def _probe(self, replica: str) -> bool:
        try:
            handle = serve.get_deployment_handle(replica, self.app)
            return handle.ping.remote().result(timeout_s=self.probe_timeout_s) == replica
        except Exception:  # a timeout, a dead actor, a deployment not there yet: not answering
            return False

    def _release_moved(self) -> None:
        """Tell each replica that lost a robot to let it go, again at every round until it has answered (best
        effort: a partitioned one never hears it, which is what the robot side's fence is for)."""
        for robot_id, replica, version in self.table.take_lost():
            self._releases[(robot_id, replica)] = version
        for (robot_id, replica), version in list(self._releases.items()):
            try:
                released = serve.get_deployment_handle(replica, self.app).release.remote(robot_id, version) \
                    .result(timeout_s=self.probe_timeout_s)
                self.counts["releases" if released else "releases_not_needed"] += 1
            except Exception:  # gone, partitioned or slow: tried again next round while it is alive
                self.counts["release_retries"] += 1
                if replica in self.table.placement.alive:
                    continue
            del self._releases[(robot_id, replica)]


def start_controller(replicas: list[str], models: list[str], max_robots_per_replica: int, options: dict | None = None,
                     **kwargs):
    """The cluster's controller actor: the running one if there is one (same name), else a new, detached one."""
    actor = ray.remote(PlacementController).options(
        name=CONTROLLER, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, max_concurrency=16,
        max_restarts=-1, num_cpus=0, **(options or {}))
    return actor.remote(replicas, models, max_robots_per_replica, **kwargs)


@serve.deployment(max_ongoing_requests=64, health_check_period_s=2.0, logging_config={"enable_access_log": False})
class FleetReplica:
    def __init__(self, name: str, models: list[str], embodiment: str, max_batch: int = 8, threads: int = 1):
        # The engine (torch) is imported here, in the replica's process only: the ingress and the controller, which
        # load this module too, run no model.
        import torch

        from ..control.embodiment import load_embodiment
        from ..engine.runtime import RuntimeConfig
        from ..engine.scheduler import SchedulerConfig
        from ..fleet.specs import ModelSpec
        from .replica import ReplicaCore

        torch.set_num_threads(threads)
        config = RuntimeConfig(SchedulerConfig(queue="esf", max_batch=max_batch), pool_slots=max_batch + 1,
                               stream_every=0)
        self.name = name
        self.core = ReplicaCore(name, [ModelSpec.parse(m) for m in models], load_embodiment(embodiment), config)

    def ping(self) -> str:
        return self.name

    # Off the replica's event loop, as `infer`: they wait for the core's lock, which a model being loaded holds
    # for seconds, and the loop must go on answering `ping`.
    async def release(self, robot_id: str, epoch: int) -> bool:
        return await asyncio.to_thread(self.core.release, robot_id, epoch)

    async def report(self, active_s: float) -> list[dict]:
        return [asdict(route) for route in await asyncio.to_thread(self.core.report, active_s)]

    async def infer(self, route: dict, message: bytes) -> dict:
        """{"reply": packed reply} or {"error": reason, "message": text}."""
        from ..serving.requests import RequestError

        try:
            reply = await asyncio.to_thread(self.core.infer, Route(**route), message)
        except RequestError as err:
            return {"error": err.reason, "message": str(err)}
        return {"reply": pack(reply)}


ingress_app = FastAPI()


@serve.deployment(max_ongoing_requests=1024)
@serve.ingress(ingress_app)
class FleetIngress:
    def __init__(self, replicas: dict, api_key: str | None = None, grace_s: float = 1.0):
        """`replicas`: slot name -> its deployment's handle."""
        self.replicas, self.api_key, self.grace_s = replicas, api_key, grace_s
        self.controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
        self.counts: Counter = Counter()
        self._last_route: dict[str, dict] = {}  # robot -> its route last heard, while the controller restarts
        self._joined: dict[str, tuple] = {}  # robot -> its join, made again for a controller that lost it

    @ingress_app.get("/healthz")
    def healthz(self) -> str:
        return "OK"

    @ingress_app.websocket("/robots/{robot_id}")
    async def robot(self, websocket: WebSocket, robot_id: str) -> None:
        await websocket.accept()
        reason = self._refused_handshake(websocket)
        answer = None
        if not reason:
            query = websocket.query_params
            try:
                rate_hz, slo_s = float(query.get("rate_hz", "")), float(query.get("slo_ms", "")) / 1e3
            except ValueError:
                reason = "rate_hz and slo_ms must be numbers in the URL's query"
            else:
                joined = (robot_id, query.get("model", ""), rate_hz, slo_s)
                try:
                    answer = await self.controller.join.remote(*joined)
                except ray.exceptions.RayError as err:
                    reason = f"the placement controller is not reachable ({type(err).__name__}); try again"
                else:
                    reason = "" if answer["accepted"] else f"join refused: {answer['reason']}"
                    self._joined[robot_id] = joined
        if reason:
            await websocket.close(POLICY_VIOLATION, reason[:120])  # a close reason has at most 123 bytes
            return
        await websocket.send_bytes(pack({"server": "oxygen-ros fleet-ray", "robot": robot_id,
                                         "replica": answer["server"], "epoch": answer["version"]}))
        try:
            await self._serve(websocket, robot_id)
        except WebSocketDisconnect:
            pass
        finally:
            self._last_route.pop(robot_id, None)
            self._joined.pop(robot_id, None)
            try:
                await asyncio.wait_for(self.controller.leave.remote(robot_id), CONTROLLER_TIMEOUT_S)
            except Exception:  # a controller restarting: it takes back what the replicas serve
                self.counts["leave_failed"] += 1

    def _refused_handshake(self, websocket: WebSocket) -> str:
        if self.api_key is None:
            return ""
        given = websocket.headers.get("authorization", "")
        return "" if hmac.compare_digest(given.encode(), f"Api-Key {self.api_key}".encode()) else \
            "an API key is required: Authorization: Api-Key <key>"

    async def _serve(self, websocket: WebSocket, robot_id: str) -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            if data is None:
                self.counts["text_message"] += 1
                await websocket.send_text("expected a binary msgpack message, got a text message")
                continue
            await websocket.send(await self._answer(robot_id, data))

    async def _join_again(self, robot_id: str) -> dict | None:
        """The robot's join, made again (a restarted controller did not take it back): its new route, or None."""
        self.counts["joined_again"] += 1
        try:
            answer = await asyncio.wait_for(self.controller.join.remote(*self._joined[robot_id]),
                                            CONTROLLER_TIMEOUT_S)
            route = await asyncio.wait_for(self.controller.route.remote(robot_id), CONTROLLER_TIMEOUT_S)
        except Exception:
            return None
        return route if answer["accepted"] else None

    @staticmethod
    def _text(text: str) -> dict:
        return {"type": "websocket.send", "text": text}

    async def _answer(self, robot_id: str, data: bytes) -> dict:
        """The websocket message answering one request: the replica's packed reply, or a text error."""
        try:
            route = await asyncio.wait_for(self.controller.route.remote(robot_id), CONTROLLER_TIMEOUT_S)
        except Exception:  # the controller is restarting: the route last heard (the replica checks its epoch)
            self.counts["route_from_cache"] += 1
            route = self._last_route.get(robot_id)
        if route is None and robot_id in self._joined:  # connected, unknown to a restarted controller
            route = await self._join_again(robot_id)
        if route is not None and "waiting" not in route:
            self._last_route[robot_id] = route
        if route is None or "waiting" in route:
            self.counts["no_route"] += 1
            return self._text(f"robot {robot_id} has no replica now: {route['waiting'] if route else 'not in the fleet'}")
        replica = route["replica"]
        handle = self.replicas[replica]
        try:
            result = await asyncio.wait_for(
                handle.infer.remote(route, data),
                timeout=route["slo_s"] + self.grace_s)
        except Exception as err:  # a dead or unreachable replica, or none answering in time: this chunk is lost
            self.counts["replica_failed"] += 1
            return self._text(f"replica {replica} failed on this request ({type(err).__name__}); the robot is "
                         "placed again if it is down")
        if "reply" in result:
            return {"type": "websocket.send", "bytes": result["reply"]}
        self.counts[result["error"]] += 1
        if result["error"] == "refused":
            answer = await self.controller.refused.remote(robot_id, replica, route["epoch"], result["message"])
            if answer is not None and not answer["accepted"]:
                return self._text(f"the pool cannot serve robot {robot_id}: {answer['reason']}")
        return self._text(f"replica {replica} refused the request ({result['error']}): {result['message']}")


def build_app(models: list[str], embodiment: str, replicas: int, api_key: str | None = None, max_batch: int = 8,
              threads: int = 1, replica_options: list[dict] | None = None, ingress_options: dict | None = None):
    """The Serve application (deploy it as `APP`): the ingress and one `FleetReplica` deployment per slot
    (`replica_options[i]`: Ray actor options of slot i, e.g. resources that pin it to a node)."""
    options = replica_options or [{}] * replicas
    slots = {name: FleetReplica.options(name=name, num_replicas=1,
                                        ray_actor_options={"num_cpus": threads, **options[i]})
             .bind(name, models, embodiment, max_batch, threads)
             for i, name in enumerate(replica_names(replicas))}
    return FleetIngress.options(ray_actor_options={"num_cpus": 0, **(ingress_options or {})}).bind(slots, api_key)
