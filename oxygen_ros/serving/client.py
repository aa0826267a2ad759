"""The robot side of openpi's websocket protocol: a robot whose engine runs elsewhere sends each frame there and gets
its chunk back, while its input checks and its command path (limits, holds, output groups, hand-over) stay on the
robot (the VLA node with ``engine.remote``, `docs/ray.md`).

The far side is a pool's ingress (`oxygen-ros fleet-ray`: ``ws://HOST:PORT/robots/<id>?model=..&rate_hz=..&slo_ms=..``),
`oxygen-ros serve`, or openpi's own server. The connection opens with the server's metadata; then each request is
the observation dict openpi's policy for the robot's embodiment reads (`openpi_observation`, what
`requests.RequestReader` reads back) and each answer a reply with ``actions`` [H, A] (what `Embodiment.openpi_actions`
makes) or a text error. A server whose metadata carries a placement ``epoch`` is a pool: every reply must then pass
the robot's fence (`fence.ChunkFence`: only the replica that owns the robot now may command it).

Every way a request can fail is one `RemoteError` with its kind: the server cannot be reached, its connection
closed, or no reply came within ``timeout_s`` (`UNREACHABLE`: the connection is dropped, so a late reply can never
answer a later request, and the next request opens a new one); the server refused the request in words
(`REFUSED`); the reply is not openpi's (`BAD_REPLY`); the fence dropped it (`FENCED`). Each is counted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from ..control.embodiment_math import OpenpiKeys
from .fence import PLACEMENT_KEY, ChunkFence
from .protocol import ProtocolError, pack, preview, unpack
from .requests import MAX_ERROR_CHARS, PROMPT_KEY

API_KEY_ENV = "OXYGEN_ROS_API_KEY"  # the API key a server requires and a client sends, when not given otherwise
UNREACHABLE, REFUSED, BAD_REPLY, FENCED = "pool_unreachable", "pool_refused", "bad_reply", "fenced"
MAX_REPLY_BYTES = 32 * 2**20


class RemoteError(Exception):
    """A request that brought no usable chunk: `kind` (UNREACHABLE, REFUSED, BAD_REPLY, FENCED) and why."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail[:MAX_ERROR_CHARS])
        self.kind = kind


@dataclass(frozen=True)
class RemoteChunk:
    """A reply the robot may act on: openpi's actions [H, A] (robot units, velocity dims as the model's numbers),
    the time from sending the frame to the reply, and the placement it came from (None from a single server)."""

    actions: np.ndarray
    latency_s: float
    placement: Mapping | None


def openpi_observation(keys: OpenpiKeys, images: Mapping[str, np.ndarray], state: np.ndarray, prompt: str) -> dict:
    """The observation openpi's policy for this robot reads, from images by model image key and the robot's state:
    the state split over the profile's state keys in order (a key of no fixed width takes the rest), each image
    under its key (channel first in a `chw` profile), and the prompt when there is one. An image key whose model
    key has no image is left out (the profile says which of those the policy masks)."""
    state = np.asarray(state, dtype=np.float64)
    observation, start = {}, 0
    for key, width in keys.state:
        end = state.size if width is None else start + width
        observation[key] = state[start:end]
        start = end
    for key, model_key in keys.images:
        if model_key in images:
            image = np.asarray(images[model_key])
            observation[key] = np.ascontiguousarray(image.transpose(2, 0, 1)) if keys.image_layout == "chw" else image
    if prompt:
        observation[PROMPT_KEY] = prompt
    return observation


class RemoteEngine:
    """One robot's connection to a remote engine (opened on the first request, and again after a failure)."""

    def __init__(self, url: str, api_key: str | None, keys: OpenpiKeys, action_dims: int, timeout_s: float):
        self.url, self.api_key, self.keys = url, api_key, keys
        self.action_dims, self.timeout_s = action_dims, timeout_s
        self.fence = ChunkFence()  # kept across connections: an owner seen once stays the newest
        self.pool: bool | None = None  # whether the server places robots (its metadata carries an epoch)
        self.metadata: dict | None = None
        self.failures: Counter = Counter()  # kind -> requests
        self.chunks = 0
        self.connections = 0
        self._ws: ClientConnection | None = None
        self._open = ExitStack()  # the connection's context: closing it closes the connection

    def close(self) -> None:
        self._open.close()
        self._ws = None

    def counts(self) -> dict[str, int | str]:
        """What engine_status and /diagnostics report of the remote engine."""
        return {"remote_chunks": self.chunks, "remote_connections": self.connections,
                **{f"remote_{kind}": self.failures[kind] for kind in (UNREACHABLE, REFUSED, BAD_REPLY, FENCED)},
                **{f"fence_{reason}": count for reason, count in sorted(self.fence.dropped.items())},
                "placement": "none" if self.fence.replica is None else f"{self.fence.replica}@{self.fence.epoch}"}

    def act(self, images: Mapping[str, np.ndarray], state: np.ndarray, prompt: str) -> RemoteChunk:
        """The chunk for one frame; RemoteError (counted) when there is none to act on."""
        try:
            return self._act(images, state, prompt)
        except RemoteError as err:
            self.failures[err.kind] += 1
            raise

    def _act(self, images, state, prompt) -> RemoteChunk:
        start = time.perf_counter()
        ws = self._ws if self._ws is not None else self._connect()
        try:
            ws.send(pack(openpi_observation(self.keys, images, state, prompt)))
            message = ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            self.close()
            raise RemoteError(UNREACHABLE, f"no reply within {self.timeout_s:g} s (engine.timeout_s); the "
                                           "connection is opened again for the next frame") from None
        except (ConnectionClosed, OSError) as err:
            self.close()
            raise RemoteError(UNREACHABLE, f"the connection to {self.url} closed: {_closed(err)}") from None
        latency_s = time.perf_counter() - start
        if isinstance(message, str):
            raise RemoteError(REFUSED, f"the engine refused the frame: {message}")
        try:
            reply = unpack(message)
        except ProtocolError as err:
            raise RemoteError(BAD_REPLY, f"the reply is not an openpi message: {err}") from None
        actions = reply.get("actions") if isinstance(reply, dict) else None
        if not isinstance(actions, np.ndarray) or actions.ndim != 2 or actions.dtype.kind not in "iuf" \
                or actions.shape[0] < 1 or actions.shape[1] < self.action_dims:
            got = preview(actions) if isinstance(reply, dict) else preview(reply)
            raise RemoteError(BAD_REPLY, f"the reply's actions must be an array [horizon, >= {self.action_dims}] of "
                                         f"numbers, got {got}")
        placement = reply.get(PLACEMENT_KEY)
        if self.pool and not self.fence.admit(reply):
            raise RemoteError(FENCED, f"a chunk from {_owner(placement)} dropped: the robot's owner is "
                                      f"{self.fence.replica} at epoch {self.fence.epoch}")
        self.chunks += 1
        return RemoteChunk(actions[:, :self.action_dims].astype(np.float64), latency_s,
                           placement if self.pool else None)

    def _connect(self) -> ClientConnection:
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        with ExitStack() as opening:
            try:
                ws = opening.enter_context(connect(self.url, additional_headers=headers, open_timeout=self.timeout_s,
                                                   compression=None, max_size=MAX_REPLY_BYTES,
                                                   close_timeout=self.timeout_s))
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as err:
                raise RemoteError(UNREACHABLE, f"cannot connect to {self.url}: {type(err).__name__}: {err}") from None
            try:
                metadata = unpack(ws.recv(timeout=self.timeout_s))
            except (TimeoutError, ConnectionClosed, OSError, ProtocolError) as err:
                raise RemoteError(UNREACHABLE, f"{self.url} sent no metadata: {_closed(err)}") from None
            self._open = opening.pop_all()  # kept open past this block
        self.metadata = metadata if isinstance(metadata, dict) else {}
        self.pool = isinstance(self.metadata.get("epoch"), int)
        self.connections += 1
        self._ws = ws
        return ws


def _closed(err: Exception) -> str:
    """Why a connection ended, with the server's close reason when it gave one (a refused join says why)."""
    if isinstance(err, ConnectionClosed) and err.rcvd is not None:
        return f"code {err.rcvd.code}" + (f": {err.rcvd.reason}" if err.rcvd.reason else "")
    if isinstance(err, TimeoutError):
        return "timed out"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _owner(placement) -> str:
    if isinstance(placement, Mapping):
        return f"replica {preview(placement.get('replica'))} at epoch {preview(placement.get('epoch'))}"
    return "a server that names no placement"
