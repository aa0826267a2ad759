"""The live placement without ROS (`fleet/placement.py`, which the Ray pool's controller runs): robots stay where
they are unless they could not fit otherwise, a join is accepted with its server or refused with the reason, a leave frees its share, a lapsed
server's robots (only they) are re-placed, re-plans are rate-limited, and a restarted controller takes the
placement back from the servers' reports without moving anyone."""

import math

from oxygen_ros.fleet.placement import FleetPlacement, solve
from oxygen_ros.fleet.traffic import RobotSpec

LOAD = {"a": 0.3, "b": 0.2, "big": 0.6, "huge": 1.5, "hopeless": math.inf}


def spec(robot_id, model="a", rate=5.0, slo=0.1):
    return RobotSpec(robot_id, model, rate, slo)


def placement(servers=("s0", "s1", "s2"), load=None, **kwargs):
    load = load or LOAD
    return FleetPlacement(list(servers), ["a", "b", "big", "huge", "hopeless"], lambda r: load[r.model_id], **kwargs)


def test_joins_are_placed_with_their_models_and_a_leave_moves_nobody():
    fleet = placement()
    answers = []
    for i in range(12):  # 3.0 of load on 3 servers: full
        answers.append(fleet.join(spec(f"r{i}", "ab"[i % 2])))
        assert fleet.server_of[answers[-1].robot_id] == answers[-1].server and len(fleet.moved) <= 2
    assert all(a.accepted and a.server in fleet.servers and not a.reason for a in answers)
    assert [a.version for a in answers] == list(range(1, 13))
    assert all(fleet.server_load(s) <= 1.0 + 1e-9 for s in fleet.servers)
    before = dict(fleet.server_of)
    for robot in ("r0", "r5", "r6"):
        assert fleet.leave(robot) == ""
        assert fleet.moved == []
    assert fleet.server_of == {r: s for r, s in before.items() if r not in ("r0", "r5", "r6")}
    assert fleet.leave("r0") == "robot r0 is not in the fleet"


def test_a_join_goes_where_its_model_already_is():
    fleet = placement()
    first = fleet.join(spec("r1", "a")).server
    assert fleet.join(spec("r2", "a")).server == first  # one resident copy of a, not two
    other = fleet.join(spec("r3", "b")).server
    assert fleet.join(spec("r4", "b")).server == other


def test_others_move_only_where_the_newcomer_could_not_fit_otherwise():
    fleet = placement(servers=("s0", "s1"), load={"a": 0.5, "b": 0.5, "big": 0.9})
    fleet.join(spec("r1", "a"))
    fleet.join(spec("r2", "b"))
    assert fleet.server_of["r1"] != fleet.server_of["r2"]  # balanced, no shared model: one each
    answer = fleet.join(spec("r3", "big"))  # 0.9 fits only on an empty server: one robot must move
    assert answer.accepted and len(fleet.moved) == 1
    assert fleet.server_of["r1"] == fleet.server_of["r2"] != answer.server


def test_a_join_is_refused_with_the_reason_and_changes_nothing():
    fleet = placement(servers=("s0",))
    assert fleet.join(spec("r1", "big")).accepted
    version = fleet.version
    cases = {
        "unknown model 'zzz'": spec("r2", "zzz"),
        "duplicate robot id r1: already placed on s0": spec("r1", "a"),
        "not a valid namespace name": spec("2robots", "a"),
        "rate_hz must be a positive number": spec("r3", "a", rate=0.0),
        "slo_s must be a positive number": spec("r3", "a", slo=float("nan")),
        "no server can meet its SLO: 100 ms at 5 Hz on model hopeless cannot reach the target even alone":
            spec("r4", "hopeless"),
        "alone needs 1.50 of a server": spec("r5", "huge"),
        "does not fit at the target: it needs 0.60 of a server": spec("r6", "big"),
    }
    for reason, robot in cases.items():
        answer = fleet.join(robot)
        assert not answer.accepted and answer.server is None and reason in answer.reason, (reason, answer)
        assert answer.version == version
    assert fleet.version == version and set(fleet.robots) == {"r1"}
    fleet.server_down("s0")
    assert fleet.join(spec("r7", "a")).reason == "no live server"


def test_a_server_check_that_misses_the_target_sends_the_robot_elsewhere_or_refuses_it():
    def fits(robots):
        return f"{len(robots)} robots reach 0.90" if len(robots) > 2 else None

    fleet = placement(servers=("s0", "s1"), load={"a": 0.1}, fits=fits)
    servers = [fleet.join(spec(f"r{i}", "a")).server for i in range(4)]
    assert sorted(servers) == ["s0", "s0", "s1", "s1"]  # the MILP would keep one model on one server: the check
    answer = fleet.join(spec("r4", "a"))
    assert not answer.accepted and "does not fit at the target on s" in answer.reason
    assert "3 robots reach 0.90" in answer.reason


def test_a_lapsed_servers_robots_alone_are_re_placed_at_the_next_re_plan():
    fleet = placement(min_replan_interval_s=1.0)
    for i in range(6):
        fleet.join(spec(f"r{i}", "ab"[i % 2]))
    down = fleet.server_of["r0"]
    others = {r: s for r, s in fleet.server_of.items() if s != down}
    orphans = fleet.server_down(down)
    assert "r0" in orphans and all(r in fleet.unplaced for r in orphans)
    assert f"server {down} lapsed" in fleet.unplaced["r0"]
    assert fleet.tick(10.0)  # the first re-plan runs at once
    assert not fleet.unplaced and all(fleet.server_of[r] != down for r in orphans)
    assert {r: fleet.server_of[r] for r in others} == others  # nobody else moved
    assert fleet.server_down(down) == []  # already down: nothing


def test_re_plans_are_rate_limited_and_coalesced():
    fleet = placement(servers=("s0", "s1", "s2"), load={"a": 0.4}, min_replan_interval_s=2.0)
    for i in range(6):
        fleet.join(spec(f"r{i}", "a"))
    first, second = sorted({fleet.server_of[r] for r in fleet.server_of})[:2]
    fleet.server_down(first)
    assert fleet.tick(0.0) and fleet.replans == 1
    fleet.server_down(second)  # a second lapse within the interval waits
    assert fleet.replan_pending and not fleet.tick(1.0) and fleet.replans == 1
    assert fleet.tick(2.0) and fleet.replans == 2 and not fleet.replan_pending
    assert not fleet.tick(10.0)  # nothing pending: nothing runs


def test_robots_that_fit_nowhere_wait_with_the_reason_and_are_placed_when_a_server_returns():
    fleet = placement(servers=("s0", "s1"), load={"a": 0.5}, min_replan_interval_s=0.0)
    for i in range(4):
        fleet.join(spec(f"r{i}", "a"))
    down = fleet.server_of["r0"]
    fleet.server_down(down)
    fleet.tick(1.0)
    assert len(fleet.unplaced) == 2 and all("lapsed" in why for why in fleet.unplaced.values())
    assert down not in fleet.alive
    assert fleet.server_up(down) and not fleet.server_up(down)
    assert fleet.tick(2.0) and not fleet.unplaced and len(fleet.server_of) == 4


def test_a_restarted_controller_takes_the_placement_back_from_the_servers_without_moving_anyone():
    fleet = placement()
    for i in range(5):
        fleet.join(spec(f"r{i}", "ab"[i % 2], rate=2.0 + i, slo=0.1 + i / 100))
    # from the servers' own reports: the same placement, the newest report's version
    reports = {s: {"version": fleet.version, "robots": {r.robot_id: {"model_id": r.model_id, "rate_hz": r.rate_hz,
                                                                       "slo_s": r.slo_s} for r in fleet.robots_on(s)}}
               for s in fleet.servers}
    stale = fleet.robots_on(fleet.server_of["r1"])[0]
    other = next(s for s in fleet.servers if s != fleet.server_of["r1"])
    reports[other] = {**reports[other], "version": fleet.version - 3,
                      "robots": {**reports[other]["robots"], stale.robot_id: {"model_id": stale.model_id,
                                                                              "rate_hz": 1.0, "slo_s": 1.0}}}
    rebuilt = placement()
    rebuilt.restore_from_servers(reports)
    assert rebuilt.server_of == fleet.server_of and rebuilt.version == fleet.version
    assert rebuilt.robots == fleet.robots
    assert rebuilt.join(spec("r9", "a")).version == fleet.version + 1
    assert {r: s for r, s in rebuilt.server_of.items() if r != "r9"} == fleet.server_of


def test_the_milp_keeps_pinned_robots_and_leaves_out_optional_ones_that_do_not_fit():
    robots = [spec("p", "a"), spec("o1", "a"), spec("o2", "a")]
    loads = {"p": 0.6, "o1": 0.5, "o2": 0.3}
    solution = solve(robots, loads, ["s0", "s1"], 1.0, previous={"p": "s1"}, pinned={"p"}, optional={"o1", "o2"},
                     forbidden={("o1", "s0")})
    # o1 may not go on s0 and does not fit beside p on s1: it waits; o2 goes beside p (one copy of model a)
    assert solution.server_of == {"p": "s1", "o2": "s1"} and solution.unplaced == ["o1"]
    assert solve(robots, loads, ["s0"], 1.0) is None  # every robot required, one server: no placement
    assert solve([], {}, [], 1.0).server_of == {}
