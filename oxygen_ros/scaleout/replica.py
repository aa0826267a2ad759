"""One replica of the pool, without Ray: the engine's multi-robot server (`fleet.server.FleetServer`, unchanged,
`dynamic`) answering openpi requests of the robots the routing table gives it, each at its placement epoch.

A request comes with the route that sent it (`routing.Route`: its robot, the robot's model, SLO and rate, and the
epoch). The first request
of a robot at a newer epoch makes the replica its owner: the robot is added to the server and its model loaded
there if no robot used it yet (the placement decides which models a replica holds; a model that does not load is a
refusal, `refused`, which the routing table answers by placing the robot elsewhere). A request at an older epoch
than the replica has seen for that robot is refused (`stale_epoch`): the robot has moved. `release` is the
controller telling the replica a robot left it. Every reply carries ``placement: {epoch, replica}`` for the robot
side's fence (`fence.py`).

Requests are read as `oxygen-ros serve` reads them (`serving.requests.RequestReader`, one embodiment for the pool)
and answered with openpi's actions for that embodiment. Narration is not carried through the pool: a request's
``narrate`` is ignored.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from ..control.embodiment import Embodiment
from ..engine.runtime import ActionChunk, RuntimeConfig
from ..fleet.server import FleetServer, NotServed
from ..fleet.specs import ModelSpec, ServedRobot
from ..serving.fence import PLACEMENT_KEY
from ..serving.protocol import ProtocolError, unpack
from ..serving.requests import RequestError, RequestReader
from .routing import Route

WAIT_SLICE_S = 0.05


class _Pending:
    def __init__(self):
        self.done = threading.Event()
        self.chunk: ActionChunk | None = None


class ReplicaCore:
    def __init__(self, name: str, specs: Sequence[ModelSpec], embodiment: Embodiment, config: RuntimeConfig,
                 device: str = "cpu", max_pixels: int = 0, default_prompt: str = "", cpu_kernel: str = "off"):
        self.name = name
        self.embodiment = embodiment
        self.max_pixels, self.default_prompt = max_pixels, default_prompt
        self.fleet = FleetServer(list(specs), [], config, device=device, on_chunk=self._chunk_ready,
                                 publish_late=True, cpu_kernel=cpu_kernel, dynamic=True).start()
        self.owned: dict[str, Route] = {}  # robot -> the route it is served by here (its epoch: the newest seen)
        self.released: set[str] = set()  # robots let go whose frames may still be in flight
        self.refused: Counter = Counter()  # reason -> requests
        self.served = 0
        self._readers: dict[str, RequestReader] = {}
        self._last_request: dict[str, float] = {}  # robot -> when its latest request arrived
        self._lock = threading.Lock()

    def close(self) -> None:
        self.fleet.close()

    # ---- ownership ------------------------------------------------------------------------------------------------

    def _own(self, route: Route) -> None:
        with self._lock:
            mine = self.owned.get(route.robot_id)
            if mine is not None and route.epoch < mine.epoch:
                raise RequestError("stale_epoch", f"robot {route.robot_id} moved: replica {self.name} serves it at "
                                                  f"epoch {mine.epoch}, the request was routed at epoch {route.epoch}")
            if mine == route:
                return
            if route.robot_id in self.fleet.robots:
                self.fleet.remove_robot(route.robot_id)
            self._sweep()
            try:
                self.fleet.add_robot(ServedRobot(route.robot_id, route.model_id, route.slo_s))
            except (ValueError, RuntimeError, OSError) as err:
                raise RequestError("refused", f"replica {self.name} cannot serve robot {route.robot_id} on model "
                                              f"{route.model_id}: {err}") from None
            self.owned[route.robot_id] = route
            self.released.discard(route.robot_id)

    def release(self, robot_id: str, epoch: int) -> bool:
        """The robot was placed elsewhere at `epoch`: stop serving it unless this replica already owns it at that
        epoch or a newer one. True when it was let go."""
        with self._lock:
            mine = self.owned.get(robot_id)
            if mine is None or mine.epoch >= epoch:
                return False
            self.owned[robot_id] = replace(mine, epoch=epoch)  # any request routed before the move is now stale
            try:
                self.fleet.remove_robot(robot_id)
            except NotServed:
                pass
            self.released.add(robot_id)
            self._sweep()
            return True

    def _sweep(self) -> None:
        """Forget released robots whose frames are done, and unload models no robot needs (under the lock)."""
        for robot_id in [r for r in self.released if self.fleet.in_flight(r) == 0]:
            self.fleet.forget_robot(robot_id)
            self.released.discard(robot_id)
        self.fleet.unload_idle_models()

    def report(self, active_s: float) -> list[Route]:
        """The routes of the robots this replica serves that sent a request in the last `active_s` (what a
        restarted controller takes back: a robot gone quiet may have left while the controller was away, and one
        still there joins again through the ingress)."""
        since = time.perf_counter() - active_s
        with self._lock:
            return [self.owned[r] for r in sorted(self.fleet.robots) if self._last_request.get(r, -1.0) >= since]

    # ---- requests -------------------------------------------------------------------------------------------------

    def infer(self, route: Route, message: bytes) -> dict:
        """The reply to one openpi request (a dict to pack); RequestError (counted) for a refused one."""
        try:
            return self._infer(route, message)
        except RequestError as err:
            with self._lock:
                self.refused[err.reason] += 1
            raise

    def _infer(self, route: Route, message: bytes) -> dict:
        arrival = time.perf_counter()
        self._own(route)
        self._last_request[route.robot_id] = arrival
        robot_id, model_id, epoch = route.robot_id, route.model_id, route.epoch
        try:
            obs = unpack(message)
        except ProtocolError as err:
            raise RequestError("malformed", str(err)) from None
        request = self._reader(model_id).read(obs)
        pending = _Pending()
        before = self.fleet.robot_counts(robot_id).expired_in_queue
        try:
            inputs = self.fleet.runtime.prepare(request.observation, model_id)
            noise = None if request.noise is None else torch.from_numpy(request.noise)
            queued = self.fleet.submit_inputs(robot_id, inputs, False, time.time_ns(), 0.0, context=pending,
                                              arrival=arrival, noise=noise)
        except NotServed:
            raise RequestError("stale_epoch", f"robot {robot_id} was released by replica {self.name}") from None
        except ValueError as err:
            raise RequestError("model_input", f"the model cannot take this observation: {err}") from None
        if queued is None:
            raise RequestError("deadline", "the request arrived past its deadline")
        chunk = self._wait(robot_id, pending, before, arrival + route.slo_s)
        if chunk.error is not None:
            raise RequestError("model_error", f"the model failed: {type(chunk.error).__name__}: {chunk.error}")
        width = len(self.embodiment.kinds) if self.embodiment.kinds is not None else request.state.size
        try:
            actions = self.embodiment.openpi_actions(self.fleet.robot_actions(chunk, width), request.state)
        except ValueError as err:
            raise RequestError("model_output", f"the model's chunk does not fit the embodiment: {err}") from None
        if not np.isfinite(actions).all():
            raise RequestError("nonfinite_actions", "the model's actions are not finite; none are sent")
        with self._lock:
            self.served += 1
        return {"actions": actions, "policy_timing": {"infer_ms": 1e3 * chunk.latency_s},
                "deadline_missed": bool(chunk.missed), PLACEMENT_KEY: {"epoch": epoch, "replica": self.name}}

    def _reader(self, model_id: str) -> RequestReader:
        reader = self._readers.get(model_id)
        if reader is None:
            config = self.fleet.runtime.served[model_id].model.config
            reader = RequestReader(self.embodiment, (config.action_horizon, config.action_dim), self.max_pixels,
                                   self.default_prompt)
            self._readers[model_id] = reader
        return reader

    def _wait(self, robot_id: str, pending: _Pending, expired_before: int, deadline: float) -> ActionChunk:
        while not pending.done.wait(WAIT_SLICE_S):
            if time.perf_counter() >= deadline and \
                    self.fleet.robot_counts(robot_id).expired_in_queue > expired_before:
                raise RequestError("expired", f"not computed within the robot's SLO on replica {self.name}")
        return pending.chunk

    def _chunk_ready(self, chunk: ActionChunk) -> None:
        pending: _Pending = chunk.context
        pending.chunk = chunk
        pending.done.set()
