"""Inputs stamped on another clock than the node's: named once per source and condition, with the fix."""

from oxygen_ros.nodes.clock_check import ClockCheck

S = 10**9
NOW = 1_764_500_000 * S  # a wall-clock time


def test_a_bag_played_without_clock_is_named_once_with_its_fix():
    check = ClockCheck()
    entered, line = check.observe("camera/top", NOW - 3 * 3600 * S, NOW, sim_time=False)
    assert entered and line.startswith("camera/top arrives stamped 10800.0 s behind the node clock")
    assert "play it with `ros2 bag play --clock` and start the node with use_sim_time:=true" in line
    assert check.observe("camera/top", NOW - 3 * 3600 * S + S // 10, NOW + S // 10, sim_time=False) is None
    assert check.observe("joint_states", NOW - 3 * 3600 * S, NOW, sim_time=False)[0]  # each source once
    assert check.hint().count("behind the node clock") == 2
    left, note = check.observe("camera/top", NOW, NOW + S // 100, sim_time=False)  # on the node's clock again
    assert not left and note == "camera/top: stamps are on the node's clock again"
    assert check.hint().startswith("joint_states arrives")


def test_wall_clock_stamps_under_sim_time_and_a_missing_clock_name_the_reverse_fix():
    check = ClockCheck()
    _, line = check.observe("camera/top", NOW, 42 * S, sim_time=True)
    assert "ahead of the node clock" in line and "start the node with use_sim_time:=false" in line
    check = ClockCheck()
    _, line = check.observe("camera/top", 42 * S, 0, sim_time=True)  # on sim time, no /clock yet: it reads 0
    assert "while the node clock reads 0" in line and "`ros2 bag play --clock`" in line


def test_late_or_early_inputs_within_seconds_are_not_a_clock_problem():
    check = ClockCheck()
    for offset in (-5 * S, -S // 2, 0, 3 * S):
        assert check.observe("camera/top", NOW + offset, NOW, sim_time=False) is None
    assert check.hint() == ""
