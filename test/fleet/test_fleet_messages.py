"""The fleet controller's messages (JSON in std_msgs/String) read with clear errors, and the rate cap at arrival."""

import json

import pytest

from oxygen_ros.fleet.messages import (
    MessageError,
    Placed,
    encode,
    placed_on,
    read_assignment,
    read_heartbeat,
    read_join,
)
from oxygen_ros.fleet.placement import FleetPlacement
from oxygen_ros.fleet.rate_cap import RateCap
from oxygen_ros.fleet.server import ServedRobot
from oxygen_ros.fleet.traffic import RobotSpec


def test_a_published_assignment_reads_back_as_each_servers_robots():
    fleet = FleetPlacement(["gpu0", "gpu1"], ["a", "b"], lambda r: 0.4)
    for i, model in enumerate("aab"):
        fleet.join(RobotSpec(f"r{i}", model, 10.0 + i, 0.2))
    document = read_assignment(encode(fleet.document()))
    assert document["version"] == 3
    mine = {**placed_on(document, "gpu0"), **placed_on(document, "gpu1")}
    assert mine == {f"r{i}": Placed(ServedRobot(f"r{i}", m, 0.2), 10.0 + i) for i, m in enumerate("aab")}
    assert placed_on(document, "gpu7") == {}


@pytest.mark.parametrize("text,reason", [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"version": -1, "server_of": {}}), "version must be an integer"),
    (json.dumps({"version": 1}), "no server_of"),
    (json.dumps({"version": 1, "server_of": {"r": "g"}, "model_of": {}, "slo_of": {}, "rate_of": {}}),
     "model_of lacks robots ['r']"),
    (json.dumps({"version": 1, "server_of": {"r": "g"}, "model_of": {"r": "a"}, "slo_of": {"r": 0},
                 "rate_of": {"r": 5}}), "slo_of[r] must be a positive number"),
])
def test_a_bad_assignment_is_refused_with_the_reason(text, reason):
    with pytest.raises(MessageError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        read_assignment(text)


def test_join_and_leave_requests():
    join = read_join(json.dumps({"op": "join", "robot_id": "r1", "model_id": "a", "rate_hz": 5, "slo_s": 0.2}))
    assert join == {"op": "join", "robot_id": "r1", "model_id": "a", "rate_hz": 5.0, "slo_s": 0.2}
    assert read_join(json.dumps({"op": "leave", "robot_id": "r1"})) == {"op": "leave", "robot_id": "r1"}
    for data, reason in (({"op": "join", "robot_id": "r1", "model_id": "a", "rate_hz": True, "slo_s": 0.2},
                          "rate_hz must be a positive number"),
                         ({"op": "jump", "robot_id": "r1"}, "op must be"),
                         ({"op": "join", "model_id": "a"}, "robot_id must be"),
                         ({"op": "join", "robot_id": "r1", "rate_hz": 5, "slo_s": 0.2}, "model_id must be")):
        with pytest.raises(MessageError, match=reason):
            read_join(json.dumps(data))


def test_heartbeats_are_checked():
    beat = {"server": "gpu0", "version": 4, "robots": {"r1": {"model_id": "a", "rate_hz": 5.0, "slo_s": 0.2}}}
    assert read_heartbeat(json.dumps(beat)) == beat
    with pytest.raises(MessageError, match="r1: no model_id"):
        read_heartbeat(json.dumps({**beat, "robots": {"r1": {"rate_hz": 5.0}}}))
    with pytest.raises(MessageError, match="no server name"):
        read_heartbeat(json.dumps({"version": 1, "robots": {}}))


def test_the_rate_cap_keeps_a_jittered_robot_and_drops_what_exceeds_its_rate():
    cap = RateCap(10.0, burst=2.0)
    times = [0.0, 0.13, 0.19, 0.31, 0.40, 0.52]  # 10 Hz with jitter
    assert all(cap.admit(t) for t in times) and cap.dropped == 0
    flood = RateCap(10.0, burst=2.0)
    admitted = sum(flood.admit(i / 100) for i in range(100))  # 100 Hz for a second
    assert 10 <= admitted <= 12 and flood.dropped == 100 - admitted
    with pytest.raises(ValueError):
        RateCap(0.0)
    with pytest.raises(ValueError):
        RateCap(5.0, burst=0.5)
