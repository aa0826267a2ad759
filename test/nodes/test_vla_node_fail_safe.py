"""The VLA node against hostile inputs and a broken model, over real DDS: it never dies from a message, never
publishes a chunk computed from a frame it must not act on or containing a non-finite value, and keeps its
narration requests bounded. Node processes as in test_vla_node_ros (tiny preset, the ALOHA file); the broken
model's walk runs for a fleet node's robot too (`test_vla_node_safety.start`)."""

import time

import numpy as np
import pytest
import torch
from diagnostic_msgs.msg import DiagnosticStatus
from sensor_msgs.msg import Image
from test_vla_node_ros import STARTUP_TIMEOUT_S, Robot, Spinner, diagnostic_values, start_node, wait_until
from test_vla_node_safety import KINDS, sides, start
from test_vla_node_units import jpeg_claiming, png_with_broken_chunk_length

from oxygen_ros.data.episode import ALOHA_JOINT_NAMES
from oxygen_ros.data.jpeg import encode_jpeg
from oxygen_ros.model.checkpoint import save_checkpoint
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.tokenizer import train_tokenizer
from oxygen_ros.nodes.conversions import ns_to_stamp


def test_hostile_inputs_never_kill_the_node_nor_reach_the_robot(ros_context, ros_env, model_cache):
    robot = Robot(ros_context, compressed_second_camera=True)
    spinner = Spinner(ros_context, [robot.node])
    # Every acted frame narrates with admission preempt, into one language slot, with a long token budget, and
    # decodes exactly one token per frame (a fixed k: on any machine a narration spans many frames): each new
    # narration preempts the running one, so without a bound the waiting requests would pile up.
    child = start_node(ros_env, model_cache, "-p", "control.rate_hz:=20.0", "-p", "cameras.compressed:=[false,true]",
                       "-p", "control.max_image_age_s:=0.5", "-p", "control.max_state_age_s:=0.4",
                       "-p", "control.future_tolerance_s:=0.1", "-p", "language.admission:=preempt",
                       "-p", "language.pool_slots:=2", "-p", "language.every_n_frames:=1",
                       "-p", "language.max_new_tokens:=200", "-p", "language.tokens_per_frame:=1",
                       "-p", "language.stream_every:=0",
                       "-p", "language.max_preempted:=3")

    counter = robot.counter

    def now() -> int:
        return robot.node.get_clock().now().nanoseconds

    def recovers() -> None:
        robot.recovers(10, child)

    def bad(publish, counter_name: str) -> None:
        before = counter(counter_name)
        publish()
        assert wait_until(lambda: counter(counter_name) > before, 5, child), (counter_name, robot.last_values())
        recovers()

    def withheld(publish_frame, state: str, seconds: float = 1.5) -> None:
        """Frames published for `seconds` with a fault: none of the later ones is acted on, the state says why.

        `publish_frame(now)` publishes one frame and returns its stamp."""
        stamps, start = [], time.monotonic()
        while time.monotonic() - start < seconds:
            stamp = publish_frame(now())
            if time.monotonic() - start > 0.8:  # the age limits (0.4 s, 0.5 s) have passed by then
                stamps.append(stamp)
            time.sleep(1 / 30)
        assert wait_until(lambda: robot.last_status().state == state, 3, child), robot.last_status().state
        assert not set(stamps) & robot.chunk_stamps()
        recovers()

    jpeg = encode_jpeg(robot.sensors.images[0], 90)

    def frame(stamp: int, state: list[float] | None = None, joints: bool = True) -> int:
        """Both cameras stamped `stamp`; the joint state too (with `state` positions) unless `joints` is False."""
        for index, pub in enumerate(robot.sensors.image_pubs):
            pub.publish(robot.sensors.image_msg(index, stamp))
        robot.publish_compressed(jpeg, stamp)
        if joints:
            robot.sensors.joint_pub.publish(robot.sensors.joint_msg(stamp, state))
        return stamp

    try:
        assert wait_until(lambda: robot.last_status() is not None, STARTUP_TIMEOUT_S, child), child.stop()[1]
        child.note_shm()
        recovers()
        # Pillow raises SyntaxError on this PNG and DecompressionBombError (no OSError) on this JPEG.
        bad(lambda: robot.publish_compressed(png_with_broken_chunk_length(), now(), fmt="png"), "dropped_corrupt")
        bad(lambda: robot.publish_compressed(jpeg_claiming(20000, 20000), now()), "dropped_too_large")
        thin = Image(height=1, width=4000, encoding="rgb8", step=12000, data=bytes(12000))
        thin.header.stamp = ns_to_stamp(now())
        bad(lambda: robot.sensors.image_pubs[0].publish(thin), "dropped_aspect")

        withheld(lambda stamp: frame(stamp + 5_000_000_000), "future_frame")  # stamped 5 s ahead
        assert counter("dropped_future_frame") > 0
        withheld(lambda stamp: frame(stamp, joints=False), "stale_state")  # joint_states went silent
        nan_state = [float("nan")] + [0.0] * 13
        withheld(lambda stamp: frame(stamp, nan_state), "stale_state")  # every state message rejected
        assert counter("dropped_nan_joint") > 0 and counter("dropped_stale_state") > 0
        time.sleep(0.3)
        rc, output = child.stop()
    finally:
        child.stop()
        spinner.close([robot.node])

    assert rc == 0, output
    assert "Traceback" not in output and "a callback raised" not in output, output
    for line in ("dropped a message from camera/cam_left_wrist/image_raw (corrupt): cannot decode",
                 "SyntaxError: broken PNG file",
                 "dropped a message from camera/cam_left_wrist/image_raw (too_large): 20000x20000 image",
                 "dropped a message from camera/cam_high/image_raw (aspect): 4000x1 image is too thin",
                 # an image or the joint state, whichever the tick finds first (images are decoded on their own
                 # thread, so on a loaded machine the state from the future is often seen first)
                 "not acting (future_frame): ", " ahead of the node clock",
                 "not acting (stale_state): newest good joint state is"):
        assert line in output, (line, output)
    assert " at 0x" not in output, output  # no object reprs in the log
    statuses = robot.statuses
    values = diagnostic_values(robot.diagnostics[-1])
    assert values["model_errors"] == "0" and values["state_age_ms"] != "none", values
    # The preempt soak: the waiting narrations stayed within one slot's request + max_preempted, and the
    # oldest were dropped rather than kept.
    assert max(s.active_language_requests for s in statuses) <= 1 + 3
    assert statuses[-1].language_requests_dropped > 0
    assert {"future_frame", "stale_state", "running"} <= {s.state for s in statuses}
    assert any("joint-state messages were rejected" in d.message for d in robot.diagnostics)


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_with_non_finite_outputs_publishes_no_chunk_and_reports_an_error(ros_context, ros_env, model_cache,
                                                                                  tmp_path, kind):
    """For the VLA node's robot and a fleet node's: no chunk with a non-finite value is ever published, the state
    is model_error (never running after it), ERROR on /diagnostics with the reason, every such chunk counted."""
    config = get_preset("tiny")
    model = build_model(config)
    with torch.no_grad():  # finite weights whose products overflow: the chunk comes out NaN
        model.action_out_proj.weight.fill_(3e38)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    stats = {"observation.state": {"q01": -np.ones(14), "q99": np.ones(14)},  # the 14 ALOHA joints
             "action": {"q01": -np.ones(14), "q99": np.ones(14)}}
    checkpoint = save_checkpoint(model, tmp_path / "checkpoint", stats, embodiment="aloha")
    tokenizer = train_tokenizer(tmp_path / "tok.model", config.vocab_size)
    robot, = sides(kind, ros_context, topics=["action_chunk"])
    spinner = Spinner(ros_context, [robot.node])
    child = start(kind, ros_env, model_cache, rate=20.0, checkpoint=(str(checkpoint), str(tokenizer)))
    good = [0.0] * len(ALOHA_JOINT_NAMES)
    try:
        end = time.monotonic() + STARTUP_TIMEOUT_S  # until its model has refused a few chunks
        while time.monotonic() < end and int(robot.value("nonfinite_chunks")) <= 3 and child.process.poll() is None:
            robot.frame(good)
            time.sleep(1 / 30)
        assert int(robot.value("nonfinite_chunks")) > 3, (robot.values, child.stop()[1])
        child.note_shm()
        time.sleep(0.3)  # one more status period
        rc, output = child.stop()
    finally:
        child.stop()
        spinner.close([robot.node])

    assert rc == 0, output
    assert not robot.heard.get("action_chunk"), "a chunk with non-finite values reached the robot"
    states = [values["state"] for _, _, values in robot.statuses]
    assert "model_error" in states, states
    # never running once a chunk was refused (a fleet robot, whose frames are queued and acted on later, may read
    # running between its first frame and its first refused chunk; the VLA node acts within the tick)
    assert "running" not in states[states.index("model_error"):], states
    if kind == "vla_node":
        assert "running" not in states, states
    assert robot.value("actions_published") == "0", robot.values
    errors = [message for level, message, _ in robot.statuses if level == DiagnosticStatus.ERROR]
    assert errors and all("action chunk has" in m and "not published" in m for m in errors), errors
    assert "non-finite values of" in output, output
    if kind == "vla_node":  # its log line counts them
        assert "such chunks so far" in output, output
