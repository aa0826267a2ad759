"""The pool's routing table, the robot side's fence and one replica, without Ray: the placement's MILP decides, a
route is read without waiting for a placement, epochs change only when a robot moves, a replica refusing a robot
re-places it, and chunks of a replica that no longer owns a robot are dropped (at the replica and at the robot)."""

import threading
import time

import numpy as np
import pytest

from oxygen_ros.commands.bench_client import droid_request
from oxygen_ros.control.embodiment import load_embodiment
from oxygen_ros.engine.runtime import RuntimeConfig
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.fleet.specs import ModelSpec
from oxygen_ros.fleet.traffic import RobotSpec
from oxygen_ros.scaleout.replica import ReplicaCore
from oxygen_ros.scaleout.routing import Route, make_table
from oxygen_ros.serving.fence import ChunkFence
from oxygen_ros.serving.protocol import pack
from oxygen_ros.serving.requests import RequestError


def robot(name: str, model: str = "a") -> RobotSpec:
    return RobotSpec(name, model, 5.0, 0.5)


def test_robots_are_placed_by_the_milp_and_move_only_when_their_replica_is_lost():
    table = make_table(["replica0", "replica1"], ["a", "b"], max_robots_per_replica=2)
    for name, model in (("r1", "a"), ("r2", "a"), ("r3", "b")):
        assert table.join(robot(name, model)).accepted
    routes = table.routes()
    # fewest (model, replica) pairs: the two robots of model a share a replica, model b gets the other
    assert routes["r1"].replica == routes["r2"].replica != routes["r3"].replica
    assert table.join(robot("r4", "b")).accepted
    refused = table.join(robot("r5", "a"))
    assert refused.accepted is False and "does not fit" in refused.reason
    assert table.join(robot("r6", "zzz")).reason.startswith("unknown model")
    lost = routes["r3"].replica
    assert table.replica_down(lost) == ["r3", "r4"]
    assert table.route("r3") is None and "lapsed" in table.waiting("r3")
    assert table.tick(time.monotonic())  # the re-plan: nowhere to go (the other replica is full)
    assert table.route("r3") is None and table.route("r4") is None
    assert table.leave("r2") == ""
    assert table.tick(time.monotonic() + 10)
    moved = [table.route(r) for r in ("r3", "r4") if table.route(r) is not None]
    assert len(moved) == 1 and moved[0].replica != lost and moved[0].epoch > routes["r3"].epoch
    assert table.route("r1") == routes["r1"]  # nobody else moved: same replica, same epoch
    # the replicas to tell: r2 left one, r3 and r4 lost theirs
    assert sorted((robot, replica) for robot, replica, _ in table.take_lost()) == \
        sorted([("r2", routes["r2"].replica), ("r3", lost), ("r4", lost)])
    assert table.take_lost() == []


def test_a_route_is_read_while_a_placement_holds_the_table():
    table = make_table(["replica0"], ["a"], max_robots_per_replica=4)
    table.join(robot("r1"))
    release, holding, timed_out = threading.Event(), threading.Event(), []
    real_join = table.placement.join

    def slow_join(*args, **kwargs):  # a MILP at its time limit, holding the table's lock
        holding.set()
        if not release.wait(60):
            timed_out.append(True)
        return real_join(*args, **kwargs)

    table.placement.join = slow_join
    joining = threading.Thread(target=table.join, args=(robot("r2"),))
    joining.start()
    assert holding.wait(60)
    try:
        route = table.route("r1")  # a route that waited for the lock would return only once the join gave up
    finally:
        release.set()
        joining.join(60)
    assert route.replica == "replica0" and not timed_out
    assert table.route("r2").replica == "replica0"


def test_a_robot_a_replica_refuses_is_placed_elsewhere_or_refused_with_the_reason():
    table = make_table(["replica0", "replica1"], ["a"], max_robots_per_replica=4)
    table.join(robot("r1"))
    first = table.route("r1")
    assert table.refused("r1", first.replica, first.epoch - 1, "old news") is None  # stale report: ignored
    answer = table.refused("r1", first.replica, first.epoch, "model a does not load")
    second = table.route("r1")
    assert answer.accepted and second.replica != first.replica and second.epoch > first.epoch
    answer = table.refused("r1", second.replica, second.epoch, "model a does not load")
    assert not answer.accepted and table.route("r1") is None
    assert "refused it (model a does not load)" in answer.reason and "no other live replica" in answer.reason
    assert "r1" not in table.placement.robots


def test_a_restarted_table_takes_the_replicas_routes_back_and_nobody_moves():
    table = make_table(["replica0", "replica1"], ["a", "b"], max_robots_per_replica=2)
    for name, model in (("r1", "a"), ("r2", "b"), ("r3", "a")):
        table.join(robot(name, model))
    served = table.routes()
    moved_late = Route("r2", served["r1"].replica, served["r2"].epoch - 1, "b", 0.5, 5.0)  # not yet told it lost r2
    fresh = make_table(["replica0", "replica1"], ["a", "b"], max_robots_per_replica=2)
    fresh.restore([*served.values(), moved_late])
    assert fresh.routes() == served  # same replicas, same epochs
    assert fresh.take_lost() == []
    assert fresh.join(robot("r4", "b")).version > max(route.epoch for route in served.values())
    assert {r: route for r, route in fresh.routes().items() if r != "r4"} == served


def test_the_fence_drops_chunks_of_a_replica_that_no_longer_owns_the_robot():
    fence = ChunkFence()
    chunk = lambda epoch, replica: {"actions": np.zeros((2, 2)), "placement": {"epoch": epoch, "replica": replica}}  # noqa: E731
    assert fence.admit(chunk(3, "replica0"))
    assert fence.admit(chunk(5, "replica1"))  # moved
    assert not fence.admit(chunk(3, "replica0"))  # the old owner, late or partitioned
    assert not fence.admit(chunk(5, "replica0"))  # same epoch, another replica
    assert not fence.admit({"actions": np.zeros((2, 2))})  # unfenced
    assert fence.admit(chunk(5, "replica1"))
    assert dict(fence.dropped) == {"stale_epoch": 1, "other_replica": 1, "unfenced": 1}


@pytest.fixture(scope="module")
def replica():
    config = RuntimeConfig(SchedulerConfig(queue="esf", max_batch=2), pool_slots=3, stream_every=0)
    core = ReplicaCore("replica0", [ModelSpec("a", "tiny", 0)], load_embodiment("droid"), config)
    yield core
    core.close()


def test_a_replica_answers_at_the_robots_epoch_and_refuses_older_routes_and_unknown_models(replica):
    message = pack(droid_request(0, size=32))
    route = lambda robot_id, model, epoch: Route(robot_id, "replica0", epoch, model, 5.0, 5.0)  # noqa: E731
    reply = replica.infer(route("r1", "a", 4), message)
    assert reply["placement"] == {"epoch": 4, "replica": "replica0"}
    assert reply["actions"].shape[0] == 8 and np.isfinite(reply["actions"]).all()
    assert replica.report(active_s=600) == [route("r1", "a", 4)]
    assert replica.report(active_s=0) == []  # no request since now
    with pytest.raises(RequestError) as stale:
        replica.infer(route("r1", "a", 3), message)
    assert stale.value.reason == "stale_epoch"
    with pytest.raises(RequestError) as unknown:
        replica.infer(route("r2", "zzz", 4), message)
    assert unknown.value.reason == "refused" and "not served here" in str(unknown.value)
    assert replica.release("r1", 6) and replica.report(active_s=600) == []
    with pytest.raises(RequestError) as released:
        replica.infer(route("r1", "a", 4), message)  # routed before the move
    assert released.value.reason == "stale_epoch"
    assert replica.infer(route("r1", "a", 7), message)["placement"]["epoch"] == 7  # back, at a newer epoch
    assert replica.refused == {"stale_epoch": 2, "refused": 1}
