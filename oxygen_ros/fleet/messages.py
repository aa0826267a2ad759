"""The fleet controller's messages: their topics and the JSON each carries, read with a clear error.

Every message is a `std_msgs/String` holding one JSON object. Standard types instead of new interfaces: this
package's own messages are generated into the environment by its interface build, and a new `.msg` / `.srv` would
need that build again everywhere the nodes run; no standard service type carries a join's fields (robot, model,
rate, SLO) and its answer (accepted, server, reason), so joins are a request topic and an answer topic.

- `ASSIGNMENT` (latched: transient local, reliable, depth 1), controller -> nodes: ``{"version", "server_of":
  {robot: server}, "model_of", "slo_of", "rate_of", "unplaced": {robot: reason}, "servers": {server: {"alive",
  "load"}}}`` (`placement.FleetPlacement.document`).
- `HEARTBEAT`, each node -> controller, every ``heartbeat_period_s``: ``{"server", "version" (the assignment it
  applied), "robots": {robot: {"model_id", "rate_hz", "slo_s", "attainment", "frames", "over_rate"}}, "models":
  [loaded], "load" (the share of wall time its device ran jobs), "pending", "refused_unassigned",
  "stale_assignments"}``.
- `JOIN`, anyone -> controller: ``{"op": "join", "robot_id", "model_id", "rate_hz", "slo_s"}`` or ``{"op":
  "leave", "robot_id"}``; `JOIN_ANSWER`, controller -> anyone: ``{"op", "robot_id", "accepted", "server",
  "reason", "version"}``.
- `STATUS` (latched), controller -> anyone: the fleet-wide view (`fleet_controller`'s `status`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .specs import ServedRobot

ASSIGNMENT = "/fleet/assignment"
HEARTBEAT = "/fleet/heartbeat"
JOIN = "/fleet/join"
JOIN_ANSWER = "/fleet/join_answer"
STATUS = "/fleet/status"


class MessageError(ValueError):
    """A fleet message that is not what its topic carries."""


def decode(text: str) -> dict:
    """One JSON object, or MessageError."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError) as err:
        raise MessageError(f"not JSON: {err}") from None
    if not isinstance(data, dict):
        raise MessageError(f"not a JSON object: {type(data).__name__}")
    return data


def encode(data: Mapping) -> str:
    return json.dumps(data, sort_keys=True, allow_nan=False)


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise MessageError(f"{what} must be a positive number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Placed:
    """A robot a node serves, as the assignment gives it."""

    robot: ServedRobot
    rate_hz: float


def read_assignment(text: str) -> dict:
    """The controller's assignment, its fields checked (MessageError)."""
    data = decode(text)
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise MessageError(f"version must be an integer >= 0, got {version!r}")
    server_of = data.get("server_of")
    if not isinstance(server_of, dict):
        raise MessageError("no server_of object")
    for key in ("model_of", "slo_of", "rate_of"):
        table = data.get(key)
        if not isinstance(table, dict):
            raise MessageError(f"no {key} object")
        missing = sorted(set(server_of) - set(table))
        if missing:
            raise MessageError(f"{key} lacks robots {missing}")
    for robot_id in server_of:
        _number(data["slo_of"][robot_id], f"slo_of[{robot_id}]")
        _number(data["rate_of"][robot_id], f"rate_of[{robot_id}]")
    return data


def placed_on(assignment: Mapping, server: str) -> dict[str, Placed]:
    """The robots an assignment (`read_assignment`) places on `server`."""
    return {robot_id: Placed(ServedRobot(robot_id, str(assignment["model_of"][robot_id]),
                                         float(assignment["slo_of"][robot_id])),
                             float(assignment["rate_of"][robot_id]))
            for robot_id, where in sorted(assignment["server_of"].items()) if where == server}


def read_join(text: str) -> dict:
    """A join or leave request: ``{"op", "robot_id", ...}`` with its fields checked (MessageError); the robot id
    is echoed in the answer, so it is read first."""
    data = decode(text)
    op, robot_id = data.get("op"), data.get("robot_id")
    if not isinstance(robot_id, str) or not robot_id:
        raise MessageError(f"robot_id must be a non-empty string, got {robot_id!r}")
    if op == "leave":
        return {"op": op, "robot_id": robot_id}
    if op != "join":
        raise MessageError(f"op must be 'join' or 'leave', got {op!r}")
    model_id = data.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise MessageError(f"model_id must be a non-empty string, got {model_id!r}")
    return {"op": op, "robot_id": robot_id, "model_id": model_id,
            "rate_hz": _number(data.get("rate_hz"), "rate_hz"), "slo_s": _number(data.get("slo_s"), "slo_s")}


def read_heartbeat(text: str) -> dict:
    """A node's heartbeat, the fields the controller plans from checked (MessageError)."""
    data = decode(text)
    if not isinstance(data.get("server"), str):
        raise MessageError("no server name")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise MessageError(f"version must be an integer >= 0, got {version!r}")
    robots = data.get("robots")
    if not isinstance(robots, dict):
        raise MessageError("no robots object")
    for robot_id, spec in robots.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("model_id"), str):
            raise MessageError(f"robot {robot_id}: no model_id")
        _number(spec.get("rate_hz"), f"robots[{robot_id}].rate_hz")
        _number(spec.get("slo_s"), f"robots[{robot_id}].slo_s")
    return data
