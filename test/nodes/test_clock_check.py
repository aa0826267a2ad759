"""Inputs stamped on another clock than the node's: named once per source and condition, with the fix."""

from oxygen_ros.nodes.clock_check import ClockCheck

S = 10**9
NOW = 1_764_500_000 * S  # a wall-clock time


def immediate() -> ClockCheck:
    """A check that reports a condition from its first message."""
    return ClockCheck(persist_s=0.0)


def test_a_bag_played_without_clock_is_named_once_with_its_fix():
    check = immediate()
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
    check = immediate()
    _, line = check.observe("camera/top", NOW, 42 * S, sim_time=True)
    assert "ahead of the node clock" in line and "start the node with use_sim_time:=false" in line
    check = immediate()
    _, line = check.observe("camera/top", 42 * S, 0, sim_time=True)  # on sim time, no /clock yet: it reads 0
    assert "while the node clock reads 0" in line and "`ros2 bag play --clock`" in line


def test_late_or_early_inputs_within_seconds_are_not_a_clock_problem():
    check = immediate()
    for offset in (-5 * S, -S // 2, 0, 3 * S):
        assert check.observe("camera/top", NOW + offset, NOW, sim_time=False) is None
    assert check.hint() == ""


def test_a_condition_counts_once_it_has_lasted():
    wall = [0.0]
    check = ClockCheck(persist_s=1.0, monotonic=lambda: wall[0])
    # A node on sim time before its first /clock message: the first images are no problem yet...
    assert check.observe("camera/top", 42 * S, 0, sim_time=True) is None
    wall[0] = 0.5
    assert check.observe("camera/top", 42 * S + S // 2, 0, sim_time=True) is None
    assert check.hint() == ""
    # ... and once /clock arrives, nothing is reported at all.
    assert check.observe("camera/top", 43 * S, 43 * S, sim_time=True) is None
    # A condition that lasts is reported once.
    assert check.observe("camera/top", 44 * S, 0, sim_time=True) is None
    wall[0] = 2.0
    assert check.observe("camera/top", 45 * S, 0, sim_time=True)[0]
    wall[0] = 3.0
    assert check.observe("camera/top", 46 * S, 0, sim_time=True) is None
    assert "while the node clock reads 0" in check.hint()
