"""An episode boundary the VLA node is told over real DDS: its `~/reset` service (std_srvs/Trigger).

The node guides its chunks toward the one being executed (`output.handover: rtc_guided`) on frames that keep coming
without a gap, as a simulator's do across its reset. After the call the node waits for a new frame, the next chunk is sampled
plainly (`rtc_plain_no_chunk`: nothing of the previous episode is executed any more), a frame stamped before the call
(the previous episode's, late) is dropped and counted, and guidance resumes with the delay estimate kept.
"""

import time

from std_srvs.srv import Trigger
from test_vla_node_ros import STARTUP_TIMEOUT_S, Robot, Spinner, start_node, wait_until
from test_vla_node_rtc import COMMON

from oxygen_ros.data.stamps import stamp_to_ns


def test_reset_starts_an_episode_plain_and_drops_the_previous_episodes_frames(ros_context, ros_env, model_cache):
    robot = Robot(ros_context, "/ep")
    client = robot.node.create_client(Trigger, "vla_node/reset")
    spinner = Spinner(ros_context, [robot.node])
    node = start_node(ros_env, model_cache, *COMMON, "-p", "output.handover:=rtc_guided", namespace="/ep")
    try:
        assert wait_until(lambda: robot.last_status() is not None, STARTUP_TIMEOUT_S, node), node.stop()[1]

        def guided_at_least(count: int):
            def drive() -> bool:
                robot.publish_good()
                time.sleep(1 / 30)
                return robot.counter("rtc_guided") >= count
            return drive

        # the first episode: guided once the warm-up is over
        assert wait_until(guided_at_least(4), 120, node), robot.last_values()
        assert client.wait_for_service(timeout_sec=10.0)
        called_ns = robot.node.get_clock().now().nanoseconds
        future = client.call_async(Trigger.Request())
        assert wait_until(future.done, 30, node), "no answer from ~/reset"
        assert future.result().success, future.result().message
        with robot.lock:
            chunks_before = len(robot.chunks)
        # a status from after the reset, before any new frame: held, waiting for the new episode's frames
        assert wait_until(lambda: robot.counter("resets") == 1
                          and robot.last_status().state == "waiting_for_camera", 10, node), robot.last_values()
        at_reset = robot.last_values()

        # the previous episode's frame arrives late: dropped, never acted on
        late = set()
        for k in range(1, 4):  # best-effort camera topics: some may be lost on a loaded machine, one is enough
            late.add(robot.sensors.publish_frame(called_ns - k * 1_000_000))
            time.sleep(0.1)
        guided_before = int(at_reset["rtc_guided"])
        assert wait_until(guided_at_least(guided_before + 4), 120, node), robot.last_values()
        assert wait_until(lambda: robot.counter("dropped_before_reset") >= 1, 10, node), robot.last_values()
        after = robot.last_values()
        with robot.lock:
            new_chunks = [msg for _, msg in robot.chunks[chunks_before:]]
        result = node.stop()
    finally:
        node.stop()
        spinner.close([robot.node])
    rc, output = result
    assert rc == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    # the first chunk after the reset is sampled plainly, then guidance resumes with the estimate it had
    assert int(after["rtc_plain_no_chunk"]) >= int(at_reset["rtc_plain_no_chunk"]) + 1, (at_reset, after)
    assert after["rtc_plain_no_estimate"] == at_reset["rtc_plain_no_estimate"], (at_reset, after)
    assert int(after["dropped_before_reset"]) >= 1, after
    assert new_chunks and all(stamp_to_ns(m.header.stamp) > called_ns for m in new_chunks), \
        [stamp_to_ns(m.header.stamp) - called_ns for m in new_chunks]
    assert not late & {stamp_to_ns(m.header.stamp) for m in new_chunks}
    assert "reset (1 so far)" in output, output[-3000:]


def test_reset_of_a_node_not_yet_configured_is_refused(ros_context, ros_env, model_cache):
    """A node that has not loaded its model (autostart false) answers the call with success false and why."""
    robot = Robot(ros_context, "/idle")
    client = robot.node.create_client(Trigger, "vla_node/reset")
    spinner = Spinner(ros_context, [robot.node])
    node = start_node(ros_env, model_cache, "-p", "autostart:=false", namespace="/idle")
    try:
        assert client.wait_for_service(timeout_sec=STARTUP_TIMEOUT_S), node.stop()[1]
        future = client.call_async(Trigger.Request())
        assert wait_until(future.done, 30, node), "no answer from ~/reset"
        answer = future.result()
    finally:
        node.stop()
        spinner.close([robot.node])
    assert not answer.success and "not configured" in answer.message, answer

