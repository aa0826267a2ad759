"""Real-time chunking in the VLA node over real DDS (`output.handover: rtc_guided`, `robots/rtc_guide.py`): the
node guides each chunk toward the one its robot is executing with the delay it measured, so consecutive chunks
agree where the new one takes over; a delay at or beyond the execution horizon is sampled plainly, counted and
logged, and the node keeps acting.

Three nodes of the tiny preset side by side, a point every 0.2 s (a chunk of 8 points spans 1.6 s and the tiny
model's delay is a step or two): `/guided` and `/plain` (newest_wins) on the same frames, `/late` fed frames stamped
0.5 s in the past with an execution horizon of 2 steps. Then the node on sim_node's robot with a delay injected
there: the delay it guides with is the one the robot sees.
"""

import re
import time

import numpy as np
from test_replay_node import Child
from test_sim_node import sim_args
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
    # the run's counters in one line when the node ends
    final = re.search(r"real-time chunking: rtc_guided (\d+), rtc_plain_no_chunk (\d+)", results["/guided"][1])
    assert final and int(final[1]) >= int(guided_values["rtc_guided"]), results["/guided"][1][-2000:]


def test_a_delay_injected_in_the_sim_is_the_delay_the_node_measures_and_guides_with(ros_context, ros_env,
                                                                                    model_cache):
    """sim_node with `inject_delay_steps` 3 (on sim time, paced at 10 Hz so the tiny model's own latency is about
    a step) and the VLA node guiding with the `zeros` schedule (only the actions within the delay are pinned): the
    node's delay estimate is at least 3 steps, and each guided chunk's first 3 points follow the chunk before it
    (what the robot executes until the new one takes effect) far closer than its points past the estimate do."""
    delay = 3
    ros_env["MUJOCO_GL"] = ros_env.get("MUJOCO_GL", "egl")
    robot = Robot(ros_context)
    spinner = Spinner(ros_context, [robot.node])
    sim = Child(sim_args(cameras="[top,left_wrist]", image_height=48, image_width=64, blending="newest_wins",
                         rate_hz=10.0, episode_steps=300, wait_for_policy="true", inject_delay_steps=delay), ros_env)
    node = start_node(ros_env, model_cache, "-p", "use_sim_time:=true",
                      "-p", "cameras.topics:=[camera/top/image_raw,camera/left_wrist/image_raw]",
                      "-p", "control.time_step:=0.02", "-p", "control.rate_hz:=25.0", "-p", "control.horizon:=8",
                      "-p", "language.policy:=off", "-p", "output.handover:=rtc_guided",
                      "-p", "output.rtc_schedule:=zeros")
    try:
        # (under load the test's subscription may match after the node's first chunks: those are not counted)
        assert wait_until(lambda: robot.counter("rtc_guided") >= 12 and len(robot.chunks) >= 15, STARTUP_TIMEOUT_S,
                          node), \
            (robot.last_values(), node.stop()[1][-3000:], sim.stop()[1][-3000:])
        values = robot.last_values()
        results = {"node": node.stop(), "sim": sim.stop()}
    finally:
        node.stop()
        sim.stop()
        spinner.close([robot.node])
    for rc, output in results.values():
        assert rc == 0, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
    estimate = int(values["rtc_delay_steps"])
    assert estimate >= delay, values
    with robot.lock:
        chunks = [msg for _, msg in robot.chunks]
    step_ns = 20_000_000
    within, beyond = [], []  # per guided chunk: its largest gap to the chunk before it, within / past the delay
    plain = int(values["rtc_plain_no_chunk"]) + int(values["rtc_plain_no_estimate"])  # the first chunks at most
    for before, after in zip(chunks[plain - 1:], chunks[plain:], strict=False):
        offset = round((stamp_to_ns(after.header.stamp) - stamp_to_ns(before.header.stamp)) / step_ns)
        gaps = [float(np.abs(np.subtract(after.points[i].positions, before.points[offset + i].positions)).max())
                for i in range(len(before.points) - offset)] if offset > 0 else []
        if len(gaps) > estimate:
            within.append(max(gaps[:delay]))
            beyond.append(max(gaps[estimate:]))
    assert len(within) >= 5, (len(chunks), values)
    assert np.median(within) < 0.25 * np.median(beyond), (within, beyond, values)
