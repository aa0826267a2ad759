"""The openpi websocket server over the fleet server: each connection is a robot of the engine's runtime.

What `openpi-client`'s `WebsocketClientPolicy` expects (its `websocket_client_policy.py`, and openpi's own
`websocket_policy_server.py`): on connect the server sends its metadata (a msgpack-numpy dict); then each binary
message is an observation dict and each reply the policy's output dict, ``actions`` [horizon, action_dim] with
``policy_timing`` and ``server_timing`` (``infer_ms``, and from the second request ``prev_total_ms``, the previous
request's whole time including its send); an error is a text message, which the client raises as
``RuntimeError("Error in inference server: ...")``. Unlike openpi's server, which sends its traceback and closes the
connection, this one says what was wrong with the request and keeps serving the connection.

A thin layer, as the nodes are: the fleet server (`fleet.server.FleetServer`) holds one robot per client slot
(`max_clients` of them); a request becomes a frame of its connection's robot, due ``slo_s`` after it arrived, so
concurrent clients are batched across robots by the runtime's control thread and narration decodes in its language
worker. A reply holds what openpi's server returns for the embodiment (`Embodiment.openpi_actions`: deltas made
absolute and encoded back to the robot's convention, velocities left as velocities), plus the client's narrations
that finished since its previous reply. A frame whose deadline passes while it is queued is dropped by the runtime
and the client is told; a chunk computed late is still sent (marked ``deadline_missed``).

Refused before any model work, in the opening handshake: a connection without the API key when one is set (HTTP
401), and one past `max_clients` (HTTP 503, or a close with code 1013 when two arrive at once for the last slot).
A message over `max_message_bytes` closes its connection with code 1009 (the websockets library's limit, before
the message is read); one that decodes into too many objects is refused before it is built (`protocol.unpack`). A
connection that sends no message for `idle_timeout_s` is closed (code 1000), so that idle or vanished clients do not
hold their slots forever. Every bad request is logged once per client and kind, counted, and summarized when the
client leaves; nothing a client sends stops the server or another client.
"""

from __future__ import annotations

import hmac
import http
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.sync.server import ServerConnection, serve

from ..control.embodiment import Embodiment
from ..engine.runtime import ActionChunk, TextUpdate
from ..fleet.server import FleetServer
from ..model.rtc import Committed
from ..robots.command_path import LIMITS, CommandPath, Refusal
from ..robots.rtc_guide import Plain, RtcGuide, RtcSettings
from ..robots.session import RobotSession
from .protocol import ProtocolError, pack, unpack
from .requests import RequestError, RequestReader

log = logging.getLogger("oxygen_ros.serve")
HEALTH_PATH = "/healthz"  # openpi's server answers it with 200 OK, key or not
EXPIRY_POLL_S = 0.01  # past its deadline a request is either computing or dropped: the robot's counts say which
WAIT_SLICE_S = 0.25  # before it, a waiting connection looks at the server's stop this often


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (`OpenpiServer.port` says which)
    api_key: str | None = None
    max_message_bytes: int = 32 * 2**20
    action_dims: int | None = None  # reply width for a profile of any width (None: the request's state width)
    idle_timeout_s: float = 600.0  # a connection that sends no message this long is closed
    rtc: RtcSettings = RtcSettings()  # real-time chunking, for requests that ask for it (rtc_executed, rtc_delay)


@dataclass
class _Client:
    """One connection: its robot slot, its finished narrations not yet sent, its refusals."""

    robot_id: str
    peer: str
    path: CommandPath | None = None  # its replies' joint limits, when the server has them
    requests: int = 0
    refused: Counter = field(default_factory=Counter)
    narrations: list = field(default_factory=list)
    newest: dict | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    rtc: RtcGuide | None = None  # the chunk of its last reply, in the model's space: what real-time chunking guides to
    rtc_plain: str = ""  # why its last request that asked for real-time chunking was sampled plainly

    def add_narration(self, narration: dict) -> None:
        with self.lock:
            self.narrations.append(narration)
            self.newest = narration

    def take_narrations(self) -> tuple[list, dict | None]:
        with self.lock:
            taken, self.narrations = self.narrations, []
            return taken, self.newest


@dataclass
class _Pending:
    """A request in the runtime: travels as its frame's context to the chunk and to the narration."""

    client: _Client
    request: int
    done: threading.Event = field(default_factory=threading.Event)
    chunk: ActionChunk | None = None


class OpenpiServer:
    def __init__(self, fleet: FleetServer, session: RobotSession, reader: RequestReader, config: ServeConfig,
                 metadata: dict[str, Any], path_of: Callable[[], CommandPath] | None = None):
        """`fleet` hands its chunks and text to this server's `on_chunk` / `on_text` and holds one robot per client
        slot, all on one model, whose replies `session` makes; it is started and closed with this server.
        `path_of`: each connection's command path (joint limits on every reply), None: replies as computed."""
        self.fleet = fleet
        self.session = session
        self.path_of = path_of
        self.reader = reader
        self.embodiment: Embodiment = reader.embodiment
        self.config = config
        self.metadata = metadata
        self.refused: Counter = Counter()  # all clients: reason -> requests (or connections: server_full)
        self.rtc_plain: Counter = Counter()  # all clients: why a request that asked for real-time chunking was plain
        self.served = 0
        self._free = list(fleet.robots)
        self._slots_lock = threading.Lock()  # the free slots and the counts above: every connection's thread
        self._stopping = threading.Event()
        self._unauthorized_peers: Counter = Counter()
        self._ws = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> OpenpiServer:
        """Start the runtime, then listen (raises OSError when the address is taken)."""
        self.fleet.start()
        try:
            self._ws = serve(self._connection, self.config.host, self.config.port, compression=None,
                             max_size=self.config.max_message_bytes, process_request=self._process_request)
        except BaseException:
            self.fleet.close()
            raise
        self._thread = threading.Thread(target=self._ws.serve_forever, name="openpi-serve", daemon=True)
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        return self._ws.socket.getsockname()[1]

    @property
    def max_clients(self) -> int:
        return len(self.fleet.robots)

    def close(self) -> None:
        self._stopping.set()
        if self._ws is not None:
            self._ws.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.fleet.close()

    # ---- callbacks from the runtime's threads ---------------------------------------------------------------------

    def on_chunk(self, chunk: ActionChunk) -> None:
        pending: _Pending = chunk.context
        pending.chunk = chunk
        pending.done.set()

    def on_text(self, update: TextUpdate) -> None:
        if update.final:
            pending: _Pending = update.context
            pending.client.add_narration({"text": update.text, "tokens": update.num_tokens,
                                          "finish_reason": update.finish_reason or "", "request": pending.request})

    # ---- connections ----------------------------------------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request):
        """The opening handshake: health check, API key, client cap; None lets the connection open."""
        if request.path == HEALTH_PATH:
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        key = self.config.api_key
        if key is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Api-Key {key}".encode()):
                peer = _peer(connection)
                host = peer.rsplit(":", 1)[0]
                with self._slots_lock:
                    self._unauthorized_peers[host] += 1
                    first = self._unauthorized_peers[host] == 1
                if first:
                    log.warning(f"refused {peer}: {'wrong' if given else 'no'} API key (further refusals from this "
                                "host are counted, not logged)")
                return connection.respond(http.HTTPStatus.UNAUTHORIZED,
                                          "an API key is required: Authorization: Api-Key <key>\n")
        with self._slots_lock:
            full = not self._free
        if full:
            self._count_full(connection)
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      f"server full: {self.max_clients} clients connected (--max-clients)\n")
        return None

    def _count_full(self, connection: ServerConnection) -> None:
        with self._slots_lock:
            self.refused["server_full"] += 1
            first = self.refused["server_full"] == 1
        if first:
            log.warning(f"refused {_peer(connection)}: {self.max_clients} clients already connected (--max-clients; "
                        "further refusals are counted, not logged)")

    def _connection(self, ws: ServerConnection) -> None:
        with self._slots_lock:
            robot_id = self._free.pop(0) if self._free else None
        if robot_id is None:  # two connections raced for the last slot
            self._count_full(ws)
            ws.close(CloseCode.TRY_AGAIN_LATER, f"server full: {self.max_clients} clients connected")
            return
        # This thread's torch work (the request's preprocessing) on one thread: a thread team of its own would be
        # woken beside the control thread's for every operator (serve-bench, tiny preset, 4 clients: 57 requests/s
        # with a team per connection, 145 without; OpenMP keeps the count per thread, `oxygen_ros/openmp.py`).
        torch.set_num_threads(1)
        client = _Client(robot_id, _peer(ws), path=self.path_of() if self.path_of else None,
                         rtc=self._rtc_guide())
        log.info(f"client {client.peer} connected ({robot_id})")
        try:
            ws.send(pack(self.metadata))
            self._serve(ws, client)
        except ConnectionClosed:
            pass
        except Exception:  # a bug, never a client's doing: this connection ends, the server goes on
            log.exception(f"client {client.peer}: connection handler failed")
        finally:
            with self._slots_lock:
                self._free.append(robot_id)
            refused = f"; refused {dict(client.refused)}" if client.refused else ""
            log.info(f"client {client.peer} left ({robot_id}) after {client.requests} requests{refused}")

    def _rtc_guide(self) -> RtcGuide | None:
        """A connection's real-time chunking guide (None when the runtime has no real-time chunking settings): the
        client's previous reply is its executed chunk, executed whole (`rtc_executed` says how far)."""
        if self.fleet.runtime.config.rtc is None:
            return None
        model = self.fleet.model_config(next(iter(self.fleet.robots)))
        served = next(iter(self.fleet.runtime.served.values()))
        return RtcGuide(self.config.rtc.config(model.action_horizon), 1, model.action_horizon, model.action_horizon,
                        model.action_dim, self.embodiment, served.norm_stats)

    def _serve(self, ws: ServerConnection, client: _Client) -> None:
        previous_total_s = None
        while not self._stopping.is_set():
            try:
                message = ws.recv(timeout=self.config.idle_timeout_s)
            except TimeoutError:
                log.info(f"client {client.peer}: no message for {self.config.idle_timeout_s:g} s, closing the "
                         "connection (--idle-timeout-s)")
                ws.close(CloseCode.NORMAL_CLOSURE, f"idle for {self.config.idle_timeout_s:g} s")
                return
            except ConnectionClosed as closed:
                if closed.sent is not None and closed.sent.code == CloseCode.MESSAGE_TOO_BIG:
                    self._refuse(client, RequestError(
                        "too_big", f"a message over {self.config.max_message_bytes} bytes: connection closed"))
                return
            start = time.perf_counter()
            client.requests += 1
            try:
                reply = self._infer(client, message)
            except RequestError as err:
                self._refuse(client, err)
                ws.send(f"oxygen-ros serve refused the request ({err.reason}): {err}")
                continue
            timing = {"infer_ms": 1e3 * (time.perf_counter() - start)}
            if previous_total_s is not None:
                timing["prev_total_ms"] = 1e3 * previous_total_s
            reply["server_timing"] = timing
            ws.send(pack(reply))
            with self._slots_lock:
                self.served += 1
            previous_total_s = time.perf_counter() - start

    def _refuse(self, client: _Client, err: RequestError) -> None:
        client.refused[err.reason] += 1
        with self._slots_lock:
            self.refused[err.reason] += 1
        if client.refused[err.reason] == 1:
            log.warning(f"client {client.peer}: refused a request ({err.reason}): {err} (further ones of this kind "
                        "are counted and summarized when the client leaves)")

    # ---- one request ----------------------------------------------------------------------------------------------

    def _infer(self, client: _Client, message) -> dict:
        if isinstance(message, str):
            raise RequestError("text_message", "expected a binary msgpack message, got a text message")
        try:
            obs = unpack(message)
        except ProtocolError as err:
            raise RequestError("malformed", str(err)) from None
        request = self.reader.read(obs)
        pending = _Pending(client, client.requests - 1)
        noise = None if request.noise is None else torch.from_numpy(request.noise)
        committed = self._rtc_request(client, request)
        expired_before = self.fleet.robot_counts(client.robot_id).expired_in_queue
        try:
            queued = self.fleet.submit(client.robot_id, request.observation, request.narrate, time.time_ns(), 0.0,
                                       context=pending, noise=noise, committed=committed)
        except ValueError as err:
            raise RequestError("model_input", f"the model cannot take this observation: {err}") from None
        if not queued:
            raise RequestError("deadline", "the request arrived past its deadline")
        chunk = self._wait(client, pending, expired_before)
        if chunk.error is not None:
            raise RequestError("model_error", f"the model failed on this observation: "
                                              f"{type(chunk.error).__name__}: {chunk.error}")
        width = len(self.embodiment.kinds) if self.embodiment.kinds is not None else \
            self.config.action_dims or request.state.size
        try:
            actions = self.session.openpi_actions(chunk, request.state, width)
        except ValueError as err:
            raise RequestError("model_output", f"the model's chunk does not fit the embodiment: {err}") from None
        if not np.isfinite(actions).all():
            raise RequestError("nonfinite_actions", "the model's actions are not finite; none are sent")
        if client.path is not None:
            actions = _limited(client.path, actions, request.state)
        reply = {"actions": actions, "policy_timing": {"infer_ms": 1e3 * chunk.latency_s},
                 "deadline_missed": bool(chunk.missed)}
        if client.rtc is not None:  # the client executes this chunk now; a guided request hears that it was
            client.rtc.executing(chunk.actions, 0, request.observation.state)
            if request.rtc is not None:
                reply["rtc"] = "guided" if committed is not None else client.rtc_plain
        narrations, newest = client.take_narrations()
        if narrations:
            reply["narration"] = narrations
        if request.newest_narration and newest is not None:
            reply["newest_narration"] = newest
        return reply

    def _rtc_request(self, client: _Client, request) -> Committed | None:
        """The previous reply's chunk from `rtc_executed` on, with `rtc_delay`, for a request that asks for real-time
        chunking; None (plain) for one that does not, or whose numbers cannot be used: counted, logged once per
        client and kind, and named in the reply (`rtc`)."""
        if request.rtc is None or client.rtc is None:
            return None
        executed, delay = request.rtc
        guided = client.rtc.request_at(executed, delay, request.observation.state)
        if not isinstance(guided, Plain):
            return guided
        client.rtc_plain = f"plain ({guided.kind}): {guided.detail}"
        with self._slots_lock:
            self.rtc_plain[guided.kind] += 1
        if client.rtc.plain[guided.kind] == 1:
            log.warning(f"client {client.peer}: real-time chunking not applied ({guided.kind}): {guided.detail}; "
                        "the chunk is sampled plainly (further ones of this kind are counted)")
        return None

    def _wait(self, client: _Client, pending: _Pending, expired_before: int) -> ActionChunk:
        """The request's chunk; RequestError when its deadline passed in the queue (the runtime dropped it unserved,
        which only the robot's counts say) or the server is closing."""
        slo_s = self.fleet.robots[client.robot_id].slo_s
        deadline = time.perf_counter() + slo_s
        while not pending.done.wait(max(EXPIRY_POLL_S, min(WAIT_SLICE_S, deadline - time.perf_counter()))):
            if self._stopping.is_set():
                raise RequestError("closing", "the server is shutting down")
            if time.perf_counter() >= deadline and \
                    self.fleet.robot_counts(client.robot_id).expired_in_queue > expired_before:
                raise RequestError("expired", f"not computed within its {1e3 * slo_s:g} ms deadline (--slo-ms): "
                                              "the server is busy")
        return pending.chunk


def _limited(path: CommandPath, actions: np.ndarray, state: np.ndarray) -> np.ndarray:
    """A reply [H, action joints] through the client's command path (the joint limits, `max_jump` from the
    request's state): clamped, or RequestError when refused. An openpi reply has no time grid, so a plan the
    velocity limits would slow down is refused rather than sent faster than they allow."""
    if state.size != actions.shape[1]:
        raise RequestError("state_shape", f"joint limits need the state of each of the {actions.shape[1]} action "
                                          f"joints, got {state.size} values")
    now_ns = time.time_ns()
    result = path.command(actions, now_ns + path.step_ns, now_ns, state)
    if isinstance(result, Refusal):
        raise RequestError(result.kind, result.detail)
    if any(part.step_s != path.time_step_s for part in result.groups):
        raise RequestError(LIMITS, "plan refused (velocity limit): an openpi reply cannot be slowed down")
    return path.robot_positions(result).astype(actions.dtype)


def _peer(connection: ServerConnection) -> str:
    try:
        host, port = connection.remote_address[:2]
    except (TypeError, ValueError, OSError):
        return "?"
    return f"{host}:{port}"
