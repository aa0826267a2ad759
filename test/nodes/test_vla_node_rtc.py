"""Real-time chunking in the VLA node over real DDS (`output.handover: rtc_guided`, `robots/rtc_guide.py`): the
node guides each chunk toward the one its robot is executing with the delay it measured, so consecutive chunks
agree where the new one takes over; a delay at or beyond the execution horizon is sampled plainly, counted and
logged, and the node keeps acting.

Three nodes of the tiny preset side by side, a point every 0.2 s (a chunk of 8 points spans 1.6 s and the tiny
model's delay is a step or two): `/guided` and `/plain` (newest_wins) on the same frames, `/late` fed frames stamped
0.5 s in the past with an execution horizon of 2 steps.
"""

import time

import numpy as np
from test_vla_node_ros import STARTUP_TIMEOUT_S, Robot, Spinner, start_node, wait_until

from oxygen_ros.data.stamps import stamp_to_ns

STEP_NS = 200_000_000
# a chunk of 8 points spans 1.6 s, so a loaded machine's delays stay below its horizon; inputs are fresh for a
# second, so a late tick rarely holds the robot (which restarts its guide)
COMMON = ["-p", "control.rate_hz:=5.0", "-p", "control.time_step:=0.2", "-p", "control.horizon:=8",
          "-p", "language.policy:=off", "-p", "control.max_image_age_s:=1.0", "-p", "control.max_state_age_s:=1.0"]


def first_point_gaps(chunks) -> list[float]:
    """For each chunk after the first: the largest joint difference between its first point and the point of the
    chunk before it meant for the same time (None where that one does not reach so far)."""
    gaps = []
    for (_, before), (_, after) in zip(chunks, chunks[1:], strict=False):
        offset = round((stamp_to_ns(after.header.stamp) - stamp_to_ns(before.header.stamp)) / STEP_NS)
        if 0 <= offset < len(before.points):
            gaps.append(float(np.abs(np.subtract(after.points[0].positions, before.points[offset].positions)).max()))
        else:
            gaps.append(None)
    return gaps


def test_guided_chunks_continue_the_executed_one_and_a_late_delay_falls_back_to_plain(ros_context, ros_env,
                                                                                       model_cache):
    robots = {ns: Robot(ros_context, ns) for ns in ("/guided", "/plain", "/late")}
    spinner = Spinner(ros_context, [r.node for r in robots.values()])
    children = {
        "/guided": start_node(ros_env, model_cache, *COMMON, "-p", "output.handover:=rtc_guided",
                              namespace="/guided"),
        "/plain": start_node(ros_env, model_cache, *COMMON, namespace="/plain"),
        "/late": start_node(ros_env, model_cache, *COMMON, "-p", "output.handover:=rtc_guided",
                            "-p", "output.rtc_execution_horizon:=2", namespace="/late"),
    }
    try:
        for ns, robot in robots.items():
            assert wait_until(lambda r=robot: r.last_status() is not None, STARTUP_TIMEOUT_S, children[ns]), \
                children[ns].stop()[1]

        def enough() -> bool:
            robots["/guided"].publish_good()
            robots["/plain"].publish_good()
            late = robots["/late"]
            late.sensors.publish_frame(late.node.get_clock().now().nanoseconds - 500_000_000)
            time.sleep(1 / 30)
            return (robots["/guided"].counter("rtc_guided") >= 8 and len(robots["/plain"].chunks) >= 8
                    and robots["/late"].counter("rtc_plain_delay") >= 3)

        assert wait_until(enough, 120, children["/guided"]), {ns: r.last_values() for ns, r in robots.items()}
        guided_values, late_values = robots["/guided"].last_values(), robots["/late"].last_values()
        results = {ns: child.stop() for ns, child in children.items()}
    finally:
        for child in children.values():
            child.stop()
        spinner.close([r.node for r in robots.values()])
    for rc, output in results.values():
        assert rc == 0, output
        assert "Traceback" not in output, output

    # the guide's start: no chunk executed before the first frame, two delays set aside as warm-up (a frame after a
    # hold, which a loaded machine can cause, counts as no_chunk instead)
    assert guided_values["handover"] == "rtc_guided"
    assert int(guided_values["rtc_plain_no_chunk"]) >= 1 and 1 <= int(guided_values["rtc_plain_no_estimate"]) <= 2
    assert int(guided_values["rtc_delay_steps"]) >= 1
    # consecutive chunks: guided ones take over where the executed one is (their committed first points follow
    # it), plainly sampled ones jump
    with robots["/guided"].lock, robots["/plain"].lock:
        guided_chunks, plain_chunks = list(robots["/guided"].chunks), list(robots["/plain"].chunks)
    gaps = first_point_gaps(guided_chunks)  # the start is plain (no chunk, warm-up): the second half is compared
    guided = [g for g in gaps[len(gaps) // 2:] if g is not None]
    plain = [g for g in first_point_gaps(plain_chunks) if g is not None]
    assert len(guided) >= 4 and len(plain) >= 4, (guided, plain)
    assert np.median(guided) < 0.25 * np.median(plain), (guided, plain, {k: v for k, v in guided_values.items() if "rtc" in k or "drop" in k or "hold" in k})
    # a delay at or beyond the execution horizon: sampled plainly, counted and logged; the node keeps acting
    assert int(late_values["rtc_plain_delay"]) >= 3 and int(late_values["rtc_guided"]) == 0
    assert robots["/late"].last_status().actions_published >= 5
    assert "frame sampled without guidance (delay)" in results["/late"][1]
