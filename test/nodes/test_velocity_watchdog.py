"""The velocity watchdog: a velocity group whose commands stop gets one command of zeros (the logic with explicit
times, then the node over real DDS, as a separate process beside a commander that stops), and a timeout not longer
than the control period is one start-up line, exit 1."""

import threading

import rclpy
from std_msgs.msg import Float64MultiArray
from test_replay_node import Child
from test_vla_node_ros import Spinner, wait_until

from oxygen_ros.control.velocity_watchdog import VelocityWatchdog, WatchdogError, check_timeout
from oxygen_ros.nodes.velocity_watchdog import main as watchdog_main

MS = 1_000_000


def test_a_group_is_zeroed_once_when_its_moving_commands_stop():
    watchdog = VelocityWatchdog(timeout_ns=100 * MS)
    assert watchdog.due(1_000 * MS) == []  # nothing commanded yet: nothing to stop
    for t in range(0, 500, 50):
        watchdog.command("arm/commands", [0.1, -0.2, 0.0], t * MS)
        assert watchdog.due(t * MS + 60 * MS) == []  # commands 50 ms apart: never late
    watchdog.command("hand/commands", [0.0], 450 * MS)  # zeros: standing still, nothing to stop
    assert watchdog.due(550 * MS) == []  # exactly the timeout after the last command: not yet
    assert watchdog.due(551 * MS) == [("arm/commands", 3)]
    assert watchdog.due(2_000 * MS) == [] and watchdog.zeroed == 1  # once, until it moves again
    watchdog.command("arm/commands", [0.0, 0.0, 0.0], 2_000 * MS)  # its own zeros heard back
    assert watchdog.due(5_000 * MS) == []
    watchdog.command("arm/commands", [0.3], 6_000 * MS)
    assert watchdog.due(6_200 * MS) == [("arm/commands", 1)] and watchdog.zeroed == 2


def test_a_timeout_within_the_control_period_is_refused():
    check_timeout(0.5, 1 / 15)
    for timeout, period in ((0.05, 0.1), (0.1, 0.1)):
        try:
            check_timeout(timeout, period)
        except WatchdogError as err:
            assert "must be longer than the commander's control period" in str(err)
        else:
            raise AssertionError(f"timeout {timeout} with period {period} accepted")


def test_the_node_refuses_a_short_timeout_with_one_line(capfd, ros_domain_id):
    code = watchdog_main(["--ros-args", "-p", "topics:=[arm/commands]", "-p", "timeout_s:=0.05",
                          "-p", "control_period_s:=0.1"])
    err = capfd.readouterr().err
    assert code == 1
    lines = [line for line in err.splitlines() if "cannot start" in line]
    assert lines == ["cannot start: timeout_s 0.05 must be longer than the commander's control period "
                     "control_period_s 0.1: it would zero the group between two commands"], err


def test_the_node_zeroes_a_velocity_group_whose_commander_stops(ros_context, ros_env):
    commander = rclpy.create_node("commander", context=ros_context)
    pub = commander.create_publisher(Float64MultiArray, "arm_controller/commands", 10)
    heard: list[list[float]] = []
    lock = threading.Lock()

    def keep(msg):
        with lock:
            heard.append(list(msg.data))

    commander.create_subscription(Float64MultiArray, "arm_controller/commands", keep, 10)
    spinner = Spinner(ros_context, [commander])
    child = Child(["-m", "oxygen_ros.nodes.velocity_watchdog", "--ros-args", "-p", "topics:=[arm_controller/commands]",
                   "-p", "timeout_s:=0.5", "-p", "control_period_s:=0.1"], ros_env)
    try:
        def commanding() -> bool:  # until the watchdog has joined the topic
            pub.publish(Float64MultiArray(data=[0.2, -0.1]))
            return pub.get_subscription_count() >= 2  # the commander's own subscription and the watchdog's

        assert wait_until(commanding, 120, child), child.stop()[1]
        for _ in range(5):  # the commander's last commands; then it stops
            pub.publish(Float64MultiArray(data=[0.3, -0.3]))

        def zeroed_after_the_last() -> bool:
            with lock:
                last = [i for i, data in enumerate(heard) if data == [0.3, -0.3]]
                return bool(last) and [0.0, 0.0] in heard[last[-1] + 1:]

        assert wait_until(zeroed_after_the_last, 60, child), (heard[-3:], child.stop()[1])
        with lock:
            last_move = max(i for i, data in enumerate(heard) if any(data))
            assert all(data == [0.0, 0.0] for data in heard[last_move + 1:])  # and nothing moves it again
        rc, output = child.stop()
    finally:
        child.stop()
        spinner.close([commander])
    assert rc == 0, output
    assert "zeroing arm_controller/commands after 0.5 s without a command" in output
    assert "no command on arm_controller/commands for 0.5 s: sent zeros" in output
