"""The one command path (no ROS): a robot's absolute command -> each group's checked command, and the holds; and the
joint-state plausibility check that feeds it (issue 45 H2, H3)."""

import math
import warnings

import numpy as np

from oxygen_ros.control.joint_groups import JointGroup
from oxygen_ros.control.limits import CLAMP, REJECT, JointLimits
from oxygen_ros.robots.command_path import LIMITS, NONFINITE, OVERFLOW, PAST, Command, CommandPath, Refusal
from oxygen_ros.robots.state_check import StateCheck

INF = math.inf
STEP_NS = 100_000_000  # 0.1 s
ARM = JointGroup("arm", "arm_controller/joint_trajectory", ("a", "b"), (0, 1), (1.0, 1.0), (0.0, 0.0))
HAND = JointGroup("hand", "hand_controller/joint_trajectory", ("c",), (2,), (2.1123,), (-0.6213,))


def limits(lower=(-1.0, -INF, -INF), upper=(1.0, INF, INF), max_velocity=(2.0, INF, INF),
           max_jump=(INF, INF, INF)) -> JointLimits:
    return JointLimits(("a", "b", "c"), *(np.array(v, dtype=float) for v in (lower, upper, max_velocity,
                                                                                 max_jump)))


def path(lim: JointLimits | None, policy: str = CLAMP) -> CommandPath:
    return CommandPath((ARM, HAND), ("position", "position"), lim, policy, ("a", "b", "c"), ("a", "b", "c"), 0.1,
                       False, "newest_wins")


def test_a_chunk_is_checked_then_split_into_the_groups_units():
    p = path(limits())
    chunk = np.array([[0.5, 3.0, 0.0], [1.5, 3.0, 1.0]])  # a leaves its range at the second point
    command = p.command(chunk, STEP_NS, 0, np.array([0.4, 3.0, 0.0]))
    assert isinstance(command, Command) and p.limits_clamped == 1
    np.testing.assert_allclose(command.groups[0].positions, [[0.5, 3.0], [1.0, 3.0]])
    np.testing.assert_allclose(command.groups[1].positions, [[-0.6213], [1.491]])  # offset + scale * command
    np.testing.assert_allclose(command.positions, chunk)  # action_chunk: the robot's command as computed
    refused = path(limits(), REJECT).command(chunk, STEP_NS, 0, np.zeros(3))
    assert isinstance(refused, Refusal) and (refused.kind, refused.limit) == (LIMITS, "range")
    bad = p.command(np.array([[0.0, math.nan, 0.0]]), STEP_NS, 0, np.zeros(3))
    assert isinstance(bad, Refusal) and bad.kind == NONFINITE and "joints b" in bad.detail
    huge = p.command(np.array([[0.0, 0.0, 1e308]]), STEP_NS, 0, np.zeros(3))  # 2.1123 * 1e308 overflows
    assert isinstance(huge, Refusal) and huge.kind == OVERFLOW and p.nonfinite_chunks == 1 and p.overflows == 1


def test_the_jump_limit_is_measured_from_the_state_given():
    p = path(limits(max_jump=(0.5, INF, INF)))
    chunk = np.array([[0.2, 0.0, 0.0]])
    assert isinstance(p.command(chunk, STEP_NS, 0, np.array([0.0, 0.0, 0.0])), Command)
    far = p.command(chunk, STEP_NS, 0, np.array([0.9, 0.0, 0.0]))
    assert isinstance(far, Refusal) and far.limit == "jump" and p.limits_rejected == {"a": 1}


def test_a_plan_that_ends_before_it_goes_out_is_refused_and_counted():
    """Frames up to 1 s old under load made plans that had ended when published (a joint_trajectory_controller
    refuses a trajectory that ends in the past): refused and counted instead, in every hand-over."""
    for handover in ("newest_wins", "temporal_ensemble"):
        p = CommandPath((ARM, HAND), ("position", "position"), limits(), CLAMP, ("a", "b", "c"), ("a", "b", "c"),
                        0.1, False, handover)
        chunk = np.zeros((8, 3))  # points at first, first + 0.1 s, ... first + 0.7 s
        last_ns = STEP_NS + 7 * STEP_NS
        assert isinstance(p.command(chunk, STEP_NS, last_ns, np.zeros(3)), Command)  # the last point still ahead
        p.start()
        late = p.command(chunk, STEP_NS, last_ns + 1, np.zeros(3))
        if handover == "newest_wins":  # the hand-over itself refuses a chunk with every point past (`unused`)
            assert isinstance(late, Refusal) and late.kind == PAST and p.plans_past == 1, late
            assert "ended 0 ms before it could go out" in late.detail and p.counts()["plans_past"] == 1
        else:
            assert isinstance(late, Refusal) and p.plans_past + p.chunks_unused == 1, late


def test_a_jump_checked_state_that_overflows_in_the_controllers_units_is_refused_without_a_warning():
    """A 1e308 hand state (no velocity limit on it: plausible) is 2.1123 * 1e308 in the controller's units: the
    jump check refuses the plan quietly (numpy's overflow RuntimeWarning was printed from `_limited`)."""
    p = path(limits(max_jump=(INF, INF, 0.5)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refused = p.command(np.zeros((2, 3)), STEP_NS, 0, np.array([0.0, 0.0, 1e308]))
    assert isinstance(refused, Refusal) and refused.limit == "jump" and p.limits_rejected == {"c": 1}


def test_holds_are_clamped_into_the_range_and_refused_when_not_finite():
    """Issue 45 H2/H3: a hold at a state outside the limits was sent as is; a hold from a 1e308 gripper state
    (offset + 2.1123 * 1e308) was +inf."""
    p = path(limits())
    assert p.stop("stale_state", np.zeros(3)) == []  # nothing commanded yet: nothing to hold
    p.command(np.zeros((2, 3)), STEP_NS, 0, np.zeros(3))
    holds = p.stop("stale_state", np.array([9.0, 0.5, 1e308]))
    assert [h.group for h in holds] == [0, 1] and p.stop("again", np.zeros(3)) == []  # one hold per stop
    np.testing.assert_allclose(holds[0].positions, [1.0, 0.5])  # a clamped to its upper limit
    assert holds[1].positions is None and "c is not finite" in holds[1].refused
    assert (p.holds_sent, p.holds_clamped, p.holds_refused, p.last_hold_reason) == (1, 1, 1, "stale_state")
    bounded = path(limits(lower=(-1.0, -INF, -1.0), upper=(1.0, INF, 2.0)))
    bounded.command(np.zeros((1, 3)), STEP_NS, 0, np.zeros(3))
    hand = bounded.stop("deactivated", np.array([0.0, 0.0, 1e308]))[1]
    assert hand.refused == "" and hand.positions.tolist() == [2.0]  # a range makes it finite
    for hold in holds + [hand]:
        assert hold.positions is None or np.isfinite(hold.positions).all()


def test_a_state_that_moved_faster_than_the_velocity_limit_is_implausible():
    check = StateCheck((ARM, HAND), limits(max_velocity=(2.0, INF, 4.2246)), ("a", "b", "c"))
    assert check.check(np.array([0.0, 0.0, 0.0]), 1_000_000_000, 0) is None
    assert check.check(np.array([0.015, 5.0, 0.0]), 1_010_000_000, 0) is None  # 1.5/s; b has no velocity limit
    why = check.check(np.array([10.0, 0.0, 0.0]), 1_020_000_000, 0)
    assert why is not None and "a 9.985 in 0.01 s (limit 2/s)" in why
    # the hand's 4.2246/s in controller units is 2/s in the state's (scale 2.1123)
    assert check.check(np.array([0.015, 0.0, 0.1]), 1_030_000_000, 0) is not None
    assert check.check(np.array([0.015, 0.0, 0.03]), 1_030_000_000, 0) is None
    np.testing.assert_array_equal(check.last, [0.015, 0.0, 0.03])  # the last plausible state
    # a robot really elsewhere is accepted once the limit could have carried it there
    assert check.check(np.array([5.0, 0.0, 0.03]), 4_030_000_000, 0) is None
    unstamped = StateCheck((ARM, HAND), limits(), ("a", "b", "c"))  # stamps zero: arrival times count
    assert unstamped.check(np.zeros(3), 0, 0) is None
    assert unstamped.check(np.array([1.0, 0, 0]), 0, 100_000_000) is not None
    assert unstamped.check(np.array([0.1, 0, 0]), 0, 100_000_000) is None
    free = StateCheck((ARM, HAND), None, ("a", "b", "c"))  # no limits: every finite state is plausible
    assert free.check(np.zeros(3), 0, 0) is None and free.check(np.full(3, 1e308), 0, 0) is None
