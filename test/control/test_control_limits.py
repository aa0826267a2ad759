"""Joint limits on a plan in robot units (no ROS): ranges clamped or refused, a too fast plan slowed or refused, a
first point far from the measured state refused under both policies; limits from parameters and from a URDF."""

import math

import numpy as np
import pytest
from test_vla_node_units import group_values

from oxygen_ros.control.limits import CLAMP, REJECT, JointLimits, Limited, Rejected, apply_limits, first_ahead
from oxygen_ros.nodes.parameters import ParameterError, read_parameters

INF = math.inf
URDF = """<robot name="two_arms">
  <link name="base"/><link name="l1"/><link name="l2"/><link name="l3"/>
  <joint name="a" type="revolute"><parent link="base"/><child link="l1"/>
    <limit lower="-1.5" upper="1.25" velocity="2.0" effort="10"/></joint>
  <joint name="b" type="prismatic"><parent link="l1"/><child link="l2"/>
    <limit lower="0" upper="0.04" velocity="0.1" effort="5"/></joint>
  <joint name="c" type="continuous"><parent link="l2"/><child link="l3"/><limit velocity="3.0" effort="1"/></joint>
  <ros2_control name="hw" type="system"/>
</robot>"""


def limits(**fields) -> JointLimits:
    base = dict(lower=[-1.0, -INF], upper=[1.0, INF], max_velocity=[2.0, INF], max_jump=[0.5, INF])
    base.update(fields)
    return JointLimits(("a", "b"), *(np.array(base[k], dtype=float) for k in ("lower", "upper", "max_velocity",
                                                                               "max_jump")))


def test_positions_are_clamped_or_the_plan_refused():
    plan = np.array([[0.2, 5.0], [1.1, 6.0], [1.3, 7.0]])  # a leaves its range (upper 1.0); b has none
    measured = np.array([0.1, 5.0])
    clamped = apply_limits(plan, limits(max_velocity=[INF, INF]), measured, 0.1, 0, CLAMP)
    assert isinstance(clamped, Limited) and clamped.clamped == ("a",) and clamped.time_scale == 1.0
    np.testing.assert_allclose(clamped.values, [[0.2, 5.0], [1.0, 6.0], [1.0, 7.0]])
    rejected = apply_limits(plan, limits(max_velocity=[INF, INF]), measured, 0.1, 0, REJECT)
    assert isinstance(rejected, Rejected) and (rejected.limit, rejected.joints) == ("range", ("a",))
    assert "a 1.3 above 1" in rejected.detail
    inside = apply_limits(plan[:1], limits(), measured, 0.1, 0, REJECT)
    assert isinstance(inside, Limited) and inside.clamped == () and np.array_equal(inside.values, plan[:1])


def test_a_too_fast_plan_is_slowed_by_stretching_its_time_grid_or_refused():
    plan = np.array([[0.0, 0.0], [0.3, 9.0], [0.4, 9.5]])  # a moves 0.3 in one 0.1 s step: 3/s, limit 2/s
    slowed = apply_limits(plan, limits(), np.zeros(2), 0.1, 0, CLAMP)
    assert isinstance(slowed, Limited) and slowed.time_scale == pytest.approx(1.5)
    np.testing.assert_array_equal(slowed.values, plan)  # the path is kept, only its times stretch
    assert apply_limits(plan * [2 / 3, 1], limits(), np.zeros(2), 0.1, 0, CLAMP).time_scale == 1.0  # at the limit
    rejected = apply_limits(plan, limits(), np.zeros(2), 0.1, 0, REJECT)
    assert isinstance(rejected, Rejected) and (rejected.limit, rejected.joints) == ("velocity", ("a",))
    assert "a 3/s over 2/s" in rejected.detail


def test_a_first_point_far_from_the_measured_state_is_refused_under_both_policies():
    plan = np.array([[0.0, 0.0], [0.9, 0.0], [0.9, 0.0]])
    measured = np.array([0.8, 40.0])  # b is far too, but has no jump limit
    for policy in (CLAMP, REJECT):
        assert isinstance(apply_limits(plan, limits(max_velocity=[INF, INF]), measured, 0.1, 1, policy), Limited)
        refused = apply_limits(plan, limits(max_velocity=[INF, INF]), measured, 0.1, 0, policy)  # 0.8 from 0.0
        assert isinstance(refused, Rejected) and (refused.limit, refused.joints) == ("jump", ("a",)), refused
    # the first point to execute is the first not yet past when the plan goes out
    assert [first_ahead(1000, 100, now, 5) for now in (900, 1000, 1001, 1100, 1350, 9999)] == [0, 0, 1, 1, 4, 4]


def test_bad_limits_are_refused():
    for fields, message in ((dict(lower=[2.0, -INF]), r"lower limit above upper for a \(2 > 1\)"),
                            (dict(upper=[math.nan, INF]), r"upper is NaN for \['a'\]"),
                            (dict(max_velocity=[0.0, INF]), r"max_velocity must be > 0, not for \['a'\]"),
                            (dict(max_jump=[1.0]), "max_jump has 1 values for 2 joints")):
        with pytest.raises(ValueError, match=message):
            limits(**fields)


def test_limits_and_holds_come_from_the_parameters_and_the_urdf():
    params = read_parameters(group_values({"arm": {"joints": ["a", "b"], "upper": [1.0, 0.03], "max_jump": 0.2},
                                           "wrist": {"joints": ["c"], "hold": "empty"}},
                                          robot_description=URDF, limits__policy="reject"))
    assert params.holds == ("position", "empty") and params.limit_policy == "reject"
    lim = params.limits
    assert lim.joints == ("a", "b", "c")
    np.testing.assert_array_equal(lim.lower, [-1.5, 0.0, -INF])  # from the URDF; c is continuous
    np.testing.assert_array_equal(lim.upper, [1.0, 0.03, INF])  # the parameters win over the URDF
    np.testing.assert_array_equal(lim.max_velocity, [2.0, 0.1, 3.0])
    np.testing.assert_array_equal(lim.max_jump, [0.2, 0.2, INF])
    unlimited = read_parameters(group_values({"arm": {"joints": ["a", "b"]}}))
    assert unlimited.limits is None and unlimited.holds == ("position",)
    bad = (
        ({"arm": {"joints": ["a"], "lower": 2.0, "upper": 1.0}}, {}, r"lower limit above upper for a \(2 > 1\)"),
        ({"arm": {"joints": ["a"], "max_velocity": math.nan}}, {}, r"output.arm.max_velocity must be a number \(not "
                                                                   r"NaN\)"),
        ({"arm": {"joints": ["a"], "hold": "brake"}}, {}, "output.arm.hold must be one of position | empty"),
        ({"arm": {"joints": ["a"]}}, {"robot_description": "<robot"}, "robot_description is not a URDF that parses"),
        ({"arm": {"joints": ["a"]}}, {"robot_description": URDF.replace('name="a"', 'name="z"')},
         r"robot_description \(robot 'two_arms'\) has no joints \['a'\]"),
        ({"arm": {"joints": ["a"]}}, {"robot_description": URDF.replace('type="revolute"', 'type="fixed"')},
         "joint a is fixed"),
        ({"arm": {"joints": ["a"]}}, {"limits__policy": "ignore"}, "limits.policy must be one of clamp | reject"),
        ({"arm": {"joints": ["a"]}}, {"joints__state_names": ["b", "c"]},
         r"output.arm.joints: \['a'\] are not in joints.state_names"),
    )
    for groups, changes, message in bad:
        with pytest.raises(ParameterError, match=message):
            read_parameters(group_values(groups, **changes))


def test_limits_that_admit_no_finite_position_are_refused_at_start_up():
    """Issue 45 H1: lower = upper = -inf once passed (-inf > -inf is false) and made every command -inf."""
    for fields in (dict(lower=[-INF, -INF], upper=[-INF, INF]), dict(lower=[INF, -INF], upper=[INF, INF])):
        with pytest.raises(ValueError, match=r"position range admits no finite position for a"):
            limits(**fields)
    cases = (
        ({"arm": {"joints": ["a"], "lower": -INF, "upper": -INF}, "hand": {"joints": ["b"], "max_velocity": 1000.0}},
         {}, r"position range admits no finite position for a \(-inf .. -inf\)"),
        ({"arm": {"joints": ["a"], "lower": -INF, "upper": -INF}}, {},  # no other limit: once silently dropped
         r"position range admits no finite position for a"),
        ({"arm": {"joints": ["a"]}}, {"robot_description": URDF.replace('lower="-1.5" upper="1.25"',
                                                                        'lower="-inf" upper="-inf"')},
         r"robot_description: revolute joint a has limits -inf .. -inf, not a finite range"),
        ({"arm": {"joints": ["a"]}}, {"robot_description": URDF.replace('upper="1.25"', 'upper="inf"')},
         r"revolute joint a has limits -1.5 .. inf, not a finite range"),
        ({"arm": {"joints": ["a"], "scale": 1e308}}, {}, r"output.arm.scale must be within \+-1e\+06"),
        ({"arm": {"joints": ["a"], "offset": -1e300}}, {}, r"output.arm.offset must be within \+-1e\+06"),
    )
    for groups, changes, message in cases:
        with pytest.raises(ParameterError, match=message):
            read_parameters(group_values(groups, **changes))
