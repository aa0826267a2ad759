"""The VLA node's parts without DDS: message conversions, the per-tick frame rules, instructions, parameters."""

import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from diagnostic_msgs.msg import DiagnosticStatus
from sensor_msgs.msg import CompressedImage, Image, JointState

from oxygen_ros.data.jpeg import encode_jpeg
from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.engine.runtime import RuntimeStats
from oxygen_ros.engine.scheduler import SchedulerConfig, node_decode_policy
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.preprocess import normalized_state, resize_with_pad
from oxygen_ros.model.prompt import tokenize_prompt
from oxygen_ros.model.tokenizer import load_tokenizer, train_tokenizer
from oxygen_ros.nodes import frame_inputs as frame_inputs_module
from oxygen_ros.nodes.conversions import (
    ConversionError,
    ImageLimits,
    check_compressed,
    chunk_to_trajectory,
    compressed_to_rgb,
    header_size,
    image_to_rgb,
    joint_positions,
    ns_to_stamp,
)
from oxygen_ros.nodes.diagnostics import Health, diagnostic_array, engine_status, level_and_message
from oxygen_ros.nodes.frame_inputs import DecodeThread, FrameInputs, InputLimits
from oxygen_ros.nodes.log_throttle import LogThrottle
from oxygen_ros.nodes.parameters import (
    GROUP_SPECS,
    OPTIONAL,
    REQUIRED,
    SPECS,
    ParameterError,
    check_against_model,
    read_parameters,
)
from oxygen_ros.robots.instruction import Instruction

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (5, 7, 3), dtype=np.uint8)


def image(encoding: str, pixels: np.ndarray, pad: int = 0, stamp_ns: int = 0) -> Image:
    height, width = pixels.shape[:2]
    rows = pixels.reshape(height, -1)
    padded = np.concatenate([rows, np.full((height, pad), 255, np.uint8)], axis=1)
    msg = Image(height=height, width=width, encoding=encoding, step=padded.shape[1])
    msg.data = padded.tobytes()
    msg.header.stamp = ns_to_stamp(stamp_ns)
    return msg


# ---- conversions ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pad", [0, 3])
def test_every_supported_encoding_becomes_rgb(pad):
    alpha = np.full(RGB.shape[:2] + (1,), 9, np.uint8)
    cases = {
        "rgb8": RGB,
        "bgr8": RGB[:, :, ::-1],
        "rgba8": np.concatenate([RGB, alpha], axis=2),
        "bgra8": np.concatenate([RGB[:, :, ::-1], alpha], axis=2),
    }
    for encoding, pixels in cases.items():
        out = image_to_rgb(image(encoding, pixels, pad))
        assert out.dtype == np.uint8 and out.shape == (5, 7, 3)
        np.testing.assert_array_equal(out, RGB, err_msg=encoding)
    gray = RGB[:, :, 0]
    np.testing.assert_array_equal(image_to_rgb(image("mono8", gray, pad)), np.repeat(gray[:, :, None], 3, axis=2))


def test_bad_images_are_rejected_with_a_reason():
    with pytest.raises(ConversionError, match="unsupported image encoding '16UC1'") as err:
        image_to_rgb(image("16UC1", RGB))
    assert err.value.reason == "encoding"
    truncated = image("rgb8", RGB)
    truncated.data = truncated.data[:-1]
    wider = image("rgb8", RGB)
    wider.width = 8  # step 21 < 8 x 3
    taller = image("rgb8", RGB)
    taller.height = 6
    for msg in (truncated, wider, taller):
        with pytest.raises(ConversionError) as err:
            image_to_rgb(msg)
        assert err.value.reason == "size"


def test_compressed_images_decode_and_corrupt_ones_are_rejected():
    import io

    from PIL import Image as PILImage

    png = io.BytesIO()
    PILImage.fromarray(RGB).save(png, format="PNG")
    np.testing.assert_array_equal(compressed_to_rgb(CompressedImage(format="png", data=png.getvalue())), RGB)
    smooth = np.tile(np.linspace(0, 255, 32, dtype=np.uint8)[None, :, None], (24, 1, 3))
    jpeg = encode_jpeg(smooth, 95)
    decoded = compressed_to_rgb(CompressedImage(format="rgb8; jpeg compressed bgr8", data=jpeg))
    assert decoded.shape == smooth.shape and np.abs(decoded.astype(int) - smooth).max() <= 8
    with pytest.raises(ConversionError) as err:
        compressed_to_rgb(CompressedImage(format="jpeg", data=jpeg[: len(jpeg) // 2]))
    assert err.value.reason == "corrupt"
    with pytest.raises(ConversionError) as err:
        compressed_to_rgb(CompressedImage(format="jpeg", data=b"not a jpeg at all"))
    assert err.value.reason == "corrupt"
    with pytest.raises(ConversionError) as err:
        compressed_to_rgb(CompressedImage(format="tiff", data=jpeg))
    assert err.value.reason == "encoding"


def png_bytes(pixels: np.ndarray) -> bytes:
    import io

    from PIL import Image as PILImage

    buffer = io.BytesIO()
    PILImage.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def png_with_broken_chunk_length() -> bytes:
    """A PNG whose second IDAT chunk declares a wrong length: Pillow opens it, then raises SyntaxError decoding."""
    png = bytearray(png_bytes(np.random.default_rng(1).integers(0, 256, (300, 300, 3), dtype=np.uint8)))
    offset, idats = 8, []
    while offset < len(png):
        length = int.from_bytes(png[offset:offset + 4], "big")
        if png[offset + 4:offset + 8] == b"IDAT":
            idats.append(offset)
        offset += 12 + length
    assert len(idats) >= 2  # an image that does not compress into one chunk
    png[idats[1]:idats[1] + 4] = (3).to_bytes(4, "big")
    return bytes(png)


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small real JPEG whose frame header is rewritten to claim width x height (a decompression bomb)."""
    data = bytearray(encode_jpeg(RGB, 90))
    offset = 2
    while data[offset + 1] not in (0xC0, 0xC2):  # baseline or progressive frame header
        offset += 2 + int.from_bytes(data[offset + 2:offset + 4], "big")
    data[offset + 5:offset + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def test_image_sizes_are_checked_from_headers_before_decoding():
    import io

    from PIL import Image as PILImage

    limits = ImageLimits(max_pixels=4096 * 4096, model_size=224)
    progressive = io.BytesIO()
    PILImage.fromarray(RGB).save(progressive, format="JPEG", progressive=True)
    for data in (encode_jpeg(RGB, 90), png_bytes(RGB), progressive.getvalue()):
        assert header_size(data) == (7, 5)
    # A 3 kB JPEG claiming 20000 x 20000: refused from its header, over budget; without a budget Pillow's own
    # limit refuses it (DecompressionBombError is no OSError: it used to escape).
    bomb = CompressedImage(format="jpeg", data=jpeg_claiming(20000, 20000))
    with pytest.raises(ConversionError, match="20000x20000 image has 400000000 pixels, over the budget") as err:
        check_compressed(bomb, limits)
    assert err.value.reason == "too_large"
    with pytest.raises(ConversionError, match="DecompressionBombError") as err:
        compressed_to_rgb(bomb)
    assert err.value.reason == "too_large"
    with pytest.raises(ConversionError, match="4000x1 image is too thin") as err:
        check_compressed(CompressedImage(format="jpeg", data=jpeg_claiming(4000, 1)), limits)
    assert err.value.reason == "aspect"
    thin = np.zeros((1, 4000, 3), np.uint8)
    with pytest.raises(ConversionError, match="too thin") as err:
        image_to_rgb(image("rgb8", thin), limits)
    assert err.value.reason == "aspect"
    assert image_to_rgb(image("rgb8", thin)).shape == (1, 4000, 3)  # no model size given: no aspect check
    with pytest.raises(ConversionError, match="over the budget of 20") as err:
        image_to_rgb(image("rgb8", RGB), ImageLimits(max_pixels=20))
    assert err.value.reason == "too_large"
    # Whatever Pillow raises on malformed data is a "corrupt" drop with a readable message (no object repr).
    for data in (png_with_broken_chunk_length(), b"\x89PNG\r\n\x1a\n" + bytes(8) + b"IHDR" + bytes(8) + b"junk",
                 b"\xff\xd8\xff\xe0\x00\x10", b"GIF89a"):
        with pytest.raises(ConversionError) as err:
            compressed_to_rgb(CompressedImage(format="png", data=data), limits)
        assert err.value.reason in ("corrupt", "size") and " at 0x" not in str(err.value), str(err.value)
    with pytest.raises(ConversionError, match="SyntaxError: broken PNG file"):
        compressed_to_rgb(CompressedImage(format="png", data=png_with_broken_chunk_length()), limits)


def test_joint_state_positions_are_picked_by_name():
    msg = JointState(name=["c", "a", "extra", "b"], position=[3.0, 1.0, 9.0, 2.0])
    np.testing.assert_array_equal(joint_positions(msg, ["a", "b", "c"]), [1.0, 2.0, 3.0])
    with pytest.raises(ConversionError, match=r"lacks joints \['d'\]") as err:
        joint_positions(msg, ["a", "d"])
    assert err.value.reason == "missing_joint"
    nan = JointState(name=["a", "b"], position=[1.0, math.nan])
    with pytest.raises(ConversionError, match=r"non-finite positions for \['b'\]") as err:
        joint_positions(nan, ["a", "b"])
    assert err.value.reason == "nan_joint"
    assert joint_positions(nan, ["a"]).tolist() == [1.0]  # a bad joint nobody asked for does not matter
    with pytest.raises(ConversionError) as err:
        joint_positions(JointState(name=["a", "b"], position=[1.0]), ["a"])
    assert err.value.reason == "joint_state"


def test_chunk_becomes_a_joint_trajectory_stamped_with_the_source_frame():
    actions = RNG.normal(size=(8, 3))
    stamp = 1_700_000_123_456_789_012
    msg = chunk_to_trajectory(actions, ["j1", "j2", "j3"], stamp, time_step_s=0.02, horizon=5)
    assert stamp_to_ns(msg.header.stamp) == stamp
    assert msg.joint_names == ["j1", "j2", "j3"] and len(msg.points) == 5
    for i, point in enumerate(msg.points):
        np.testing.assert_array_equal(point.positions, actions[i])
        assert stamp_to_ns(point.time_from_start) == 20_000_000 * (i + 1)
    assert stamp_to_ns(chunk_to_trajectory(actions, ["a", "b", "c"], 0, 0.6, 8).points[-1].time_from_start) \
        == 4_800_000_000
    with pytest.raises(ValueError, match="horizon"):
        chunk_to_trajectory(actions, ["j1", "j2", "j3"], stamp, 0.02, horizon=9)
    with pytest.raises(ValueError, match="joint names"):
        chunk_to_trajectory(actions, ["j1", "j2"], stamp, 0.02, horizon=2)


# ---- frame rules ----------------------------------------------------------------------------------------------------

def joint_state(*values) -> JointState:
    return JointState(name=["a", "b"], position=[float(v) for v in values])


NOW = 0  # the node clock at arrival: every kept stamp is ahead of it, so the out-of-order rule (tested on its
# own) stays out of these tests


def frame_of(inputs: FrameInputs, now_ns: int):
    """A tick's decision after the decoder (the node's own thread) has caught up."""
    inputs.decode_pending()
    return inputs.next_frame(now_ns)


def frame_inputs(**limits) -> FrameInputs:
    return FrameInputs(("cam/a", "cam/b"), ("base_0_rgb", "left_wrist_0_rgb"), (False, True), ("a", "b"),
                       InputLimits(**limits))


def test_the_decoder_gives_each_camera_the_models_input_with_the_checkpoints_crop():
    """With the model's size in the limits, the decoder makes the model's input as it decodes: the checkpoint's
    crop (`Pi05Config.image_crops`) for the camera that has one, the whole image for the other, as
    `prepare_inputs` would make them."""
    box = (0.2, 0.1, 0.9, 0.8)
    pixels = RNG.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    inputs = FrameInputs(("cam/a", "cam/b"), ("base_0_rgb", "left_wrist_0_rgb"), (False, False), ("a", "b"),
                         InputLimits(images=ImageLimits(model_size=16, crops=(("base_0_rgb", box),))))
    for index in range(2):
        inputs.on_image(index, image("rgb8", pixels, stamp_ns=1), NOW)
    inputs.on_joint_state(joint_state(1, 2), NOW)
    frame = frame_of(inputs, 1).frame
    assert torch.equal(frame.images["base_0_rgb"], resize_with_pad(pixels, 16, box))
    assert torch.equal(frame.images["left_wrist_0_rgb"], resize_with_pad(pixels, 16))
    assert not torch.equal(frame.images["base_0_rgb"], frame.images["left_wrist_0_rgb"])


def test_frame_rules_waiting_stale_reuse_and_bad_messages():
    inputs = frame_inputs(max_image_age_s=0.1)
    second = 1_000_000_000
    assert frame_of(inputs, 0).state == "waiting_for_camera"
    inputs.on_image(0, image("rgb8", RGB, stamp_ns=10 * second), NOW)
    decision = frame_of(inputs, 10 * second)
    assert (decision.state, decision.detail) == ("waiting_for_camera", "no image yet from cam/b")
    jpeg = CompressedImage(format="jpeg", data=encode_jpeg(RGB, 95))
    jpeg.header.stamp, jpeg.header.frame_id = ns_to_stamp(10 * second), "wrist"
    inputs.on_image(1, jpeg, NOW)
    assert frame_of(inputs, 10 * second).state == "waiting_for_state"
    inputs.on_joint_state(joint_state(1, 2), NOW)
    decision = frame_of(inputs, 10 * second + 50_000_000)
    frame = decision.frame
    assert decision.state == "running" and not decision.dropped and not frame.reused
    assert frame.stamp_ns == 10 * second and sorted(frame.images) == ["base_0_rgb", "left_wrist_0_rgb"]
    assert frame.state.tolist() == [1.0, 2.0]
    # Nothing new: the same images are used again (counted), until they are too old.
    again = frame_of(inputs, 10 * second + 90_000_000)
    assert again.state == "running" and again.frame.reused and inputs.reused_frames == 1
    stale = frame_of(inputs, 10 * second + 150_000_000)
    assert (stale.state, stale.detail) == ("stale_frame", "newest image from cam/a is 0.150 s old")
    assert inputs.drops == {"stale_frame": 1} and inputs.image_age_ns == 150_000_000
    # A bad message is counted and dropped; the last good value stays.
    with pytest.raises(ConversionError):
        inputs.on_image(0, image("yuv422", RGB, stamp_ns=11 * second), NOW)
    with pytest.raises(ConversionError):
        inputs.on_joint_state(JointState(name=["a"], position=[5.0]), NOW)
    corrupt = CompressedImage(format="jpeg", data=jpeg.data[: len(jpeg.data) // 2])
    corrupt.header.stamp = ns_to_stamp(11 * second)
    inputs.on_image(1, corrupt, NOW)  # passes the cheap checks; fails when decoded
    decision = frame_of(inputs, 10 * second + 160_000_000)
    assert [(d.source, d.reason) for d in decision.dropped] == [("cam/b", "corrupt")]
    assert decision.state == "stale_frame"
    assert inputs.drops == {"stale_frame": 2, "encoding": 1, "missing_joint": 1, "corrupt": 1}
    assert inputs.dropped_frames == 5
    inputs.on_image(0, image("bgr8", RGB[:, :, ::-1], stamp_ns=11 * second), NOW)
    inputs.on_image(1, jpeg, NOW)
    jpeg.header.stamp = ns_to_stamp(11 * second)
    decision = frame_of(inputs, 11 * second)
    assert decision.state == "running" and decision.frame.state.tolist() == [1.0, 2.0]
    np.testing.assert_array_equal(decision.frame.images["base_0_rgb"], RGB)


def test_frames_from_the_future_and_old_or_rejected_joint_states_are_not_acted_on():
    second = 1_000_000_000
    inputs = frame_inputs(max_image_age_s=0.5, max_state_age_s=0.2, future_tolerance_s=0.1)

    def sensors(image_ns: int, state_ns: int | None = None) -> None:
        inputs.on_image(0, image("rgb8", RGB, stamp_ns=image_ns), NOW)
        jpeg = CompressedImage(format="jpeg", data=encode_jpeg(RGB, 95))
        jpeg.header.stamp = ns_to_stamp(image_ns)
        inputs.on_image(1, jpeg, NOW)
        if state_ns is not None:
            state = joint_state(1, 2)
            state.header.stamp = ns_to_stamp(state_ns)
            inputs.on_joint_state(state, NOW)

    sensors(10 * second, 10 * second)
    assert frame_of(inputs, 10 * second).state == "running"
    # Stamped 5 s ahead: such a frame would pass the age check for 5 s after the cameras went silent.
    sensors(15 * second)
    decision = frame_of(inputs, 10 * second + 10_000_000)
    assert decision.state == "future_frame" and decision.frame is None
    assert decision.detail == "image from cam/a is stamped 4.990 s ahead of the node clock"
    sensors(10 * second + 50_000_000)  # within the tolerance: acted on
    assert frame_of(inputs, 10 * second).state == "running"
    sensors(10 * second, 12 * second)
    assert frame_of(inputs, 10 * second).state == "future_frame"
    assert inputs.drops == {"future_frame": 1, "future_state": 1}
    # The joint state stops: past max_state_age_s nothing is acted on, even with fresh images.
    sensors(11 * second, 11 * second)
    assert frame_of(inputs, 11 * second + 150_000_000).state == "running"
    sensors(11 * second + 250_000_000)
    decision = frame_of(inputs, 11 * second + 250_000_000)
    assert decision.state == "stale_state" and inputs.state_age_ns == 250_000_000
    assert decision.detail == "newest good joint state is 0.250 s old"
    # Every state message rejected: the last good one ages out the same way, and the detail says why.
    for _ in range(3):
        with pytest.raises(ConversionError):
            inputs.on_joint_state(joint_state(1, math.nan), NOW)
    decision = frame_of(inputs, 11 * second + 260_000_000)
    assert decision.state == "stale_state" and "the last 3 joint-state messages were rejected" in decision.detail
    assert inputs.drops["stale_state"] == 2 and inputs.drops["nan_joint"] == 3
    zero = frame_inputs()  # every check off
    zero.on_image(0, image("rgb8", RGB, stamp_ns=0), NOW)
    zero.on_image(1, CompressedImage(format="jpeg", data=encode_jpeg(RGB, 95)), NOW)
    zero.on_joint_state(joint_state(1, 2), NOW)
    assert frame_of(zero, 100 * second).state == "running"


def test_messages_older_than_the_newest_kept_and_joints_named_twice_are_dropped():
    second = 1_000_000_000
    inputs = frame_inputs(future_tolerance_s=0.1)
    now = 20 * second
    inputs.on_image(0, image("rgb8", RGB, stamp_ns=now), now)
    with pytest.raises(ConversionError, match="stamped 0.100 s before the newest message kept") as err:
        inputs.on_image(0, image("rgb8", RGB * 0, stamp_ns=now - second // 10), now)
    assert err.value.reason == "out_of_order"
    state = joint_state(1, 2)
    state.header.stamp = ns_to_stamp(now)
    inputs.on_joint_state(state, now)
    older = joint_state(3, 4)
    older.header.stamp = ns_to_stamp(now - 1)
    with pytest.raises(ConversionError, match="before the newest"):
        inputs.on_joint_state(older, now)
    twice = JointState(name=["a", "b", "a"], position=[1.0, 2.0, 9.0])
    twice.header.stamp = ns_to_stamp(now + 1)
    with pytest.raises(ConversionError, match=r"JointState names \['a'\] more than once") as err:
        inputs.on_joint_state(twice, now)
    assert err.value.reason == "duplicate_joint" and inputs.state.tolist() == [1.0, 2.0]
    assert inputs.drop_counts() == {"out_of_order": 2, "duplicate_joint": 1}
    # The clock went back (a bag looping): the kept stamp is ahead of it, so the older timeline is taken.
    inputs.on_image(0, image("rgb8", RGB, stamp_ns=5 * second), 5 * second)
    inputs.on_joint_state(older, 5 * second)
    assert inputs.state.tolist() == [3.0, 4.0]


def test_forget_starts_an_episode_with_no_input_and_drops_the_previous_episodes_messages(monkeypatch):
    """`forget(since)` (the node's ~/reset): nothing kept, so the tick waits; a message stamped at or before `since`
    is dropped as `before_reset`, also one that was being decoded across the call; an unstamped one cannot be dated
    and passes; newer ones are acted on."""
    second = 1_000_000_000
    inputs = frame_inputs()

    def sensors(stamp_ns: int, value: float) -> None:
        inputs.on_image(0, image("rgb8", RGB, stamp_ns=stamp_ns), NOW)
        jpeg = CompressedImage(format="jpeg", data=encode_jpeg(RGB, 95))
        jpeg.header.stamp = ns_to_stamp(stamp_ns)
        inputs.on_image(1, jpeg, NOW)
        state = joint_state(value, value)
        state.header.stamp = ns_to_stamp(stamp_ns)
        inputs.on_joint_state(state, NOW)

    sensors(10 * second, 1)
    assert frame_of(inputs, 10 * second).state == "running"
    sensors(11 * second, 2)  # kept, not decoded yet when the episode ends
    inputs.forget(11 * second)
    decision = frame_of(inputs, 11 * second)
    assert decision.state == "waiting_for_camera" and decision.frame is None
    assert inputs.state is None and inputs.drop_counts() == {}
    for stamp in (11 * second, 11 * second - 1):  # the previous episode's, late
        with pytest.raises(ConversionError, match="before the last reset") as err:
            sensors(stamp, 3)
        assert err.value.reason == "before_reset"
    unstamped = joint_state(4, 4)
    inputs.on_joint_state(unstamped, NOW)
    assert inputs.state.tolist() == [4.0, 4.0]
    sensors(11 * second + 1, 5)
    decision = frame_of(inputs, 11 * second + 1)
    assert decision.state == "running" and decision.frame.stamp_ns == 11 * second + 1
    assert decision.frame.state.tolist() == [5.0, 5.0]
    assert inputs.drop_counts() == {"before_reset": 2}
    # an image being decoded (the decoder's thread) when the reset came is not kept
    decode = frame_inputs_module.image_to_rgb

    def reset_meanwhile(msg, limits):
        inputs.forget(12 * second)
        return decode(msg, limits)

    monkeypatch.setattr(frame_inputs_module, "image_to_rgb", reset_meanwhile)
    inputs.on_image(0, image("rgb8", RGB, stamp_ns=12 * second), NOW)
    inputs.decode_pending()
    assert inputs.cameras[0].image is None and inputs.drop_counts() == {"before_reset": 3}


def test_the_tick_never_decodes_it_uses_the_newest_image_decoded_while_a_costly_one_decodes(monkeypatch):
    """A costly image (a JPEG claiming the whole pixel budget) is decoded on the decoder's thread: while that decode
    is held inside the decoder, the tick's call (`next_frame`) and the subscription's (`on_image`) return, the tick
    acting on the newest image already decoded; once it ends, the newest kept message is the tick's. Every decode
    runs on the decoder's thread, none on the caller's."""
    release, entered = threading.Event(), threading.Event()
    calls: list[tuple[str, threading.Thread]] = []
    inside: list[str] = []  # the message being decoded now, if any
    decode = frame_inputs_module.compressed_to_rgb

    def held_decoder(msg, limits=None):
        calls.append((msg.header.frame_id, threading.current_thread()))
        inside.append(msg.header.frame_id)
        try:
            if msg.header.frame_id == "costly":
                entered.set()
                release.wait(60)  # never reached in a passing run: only so that a failing one cannot hang
            return decode(msg, limits)
        finally:
            inside.remove(msg.header.frame_id)

    monkeypatch.setattr(frame_inputs_module, "compressed_to_rgb", held_decoder)
    second = 1_000_000_000
    inputs = FrameInputs(("cam",), ("base_0_rgb",), (True,), ("a", "b"), InputLimits())
    inputs.on_joint_state(joint_state(1, 2), NOW)

    def jpeg(pixels: np.ndarray, stamp_ns: int, name: str) -> CompressedImage:
        msg = CompressedImage(format="jpeg", data=encode_jpeg(pixels, 95))
        msg.header.stamp, msg.header.frame_id = ns_to_stamp(stamp_ns), name
        return msg

    first, costly, newest = jpeg(RGB, 10 * second, "first"), jpeg(255 - RGB, 11 * second, "costly"), \
        jpeg(RGB // 2, 12 * second, "newest")
    decoder = DecodeThread(inputs)
    try:
        inputs.on_image(0, first, NOW)
        decoder.wake()
        deadline = time.monotonic() + 30
        while (decision := inputs.next_frame(10 * second)).frame is None:
            assert time.monotonic() < deadline, "the decoder thread decoded nothing"
            time.sleep(0.005)
        np.testing.assert_array_equal(decision.frame.images["base_0_rgb"], decode(first))
        inputs.on_image(0, costly, NOW)
        decoder.wake()
        assert entered.wait(30), "the decoder thread never started the costly image"
        for tick in range(3):  # the decode is still held: each tick acts on the image decoded before it
            decision = inputs.next_frame(11 * second + tick)
            assert inside == ["costly"], inside
            assert decision.state == "running" and decision.frame.stamp_ns == 10 * second
            assert decision.frame.frame_id == "first" and decision.frame.reused
            np.testing.assert_array_equal(decision.frame.images["base_0_rgb"], decode(first))
        inputs.on_image(0, newest, NOW)  # a newer message meanwhile: kept for the decoder, not decoded here
        decoder.wake()
        assert inside == ["costly"] and [name for name, _ in calls] == ["first", "costly"]
        release.set()
        deadline = time.monotonic() + 30
        while (frame := inputs.next_frame(12 * second).frame).stamp_ns != 12 * second:
            assert time.monotonic() < deadline, "the decoder thread never decoded the newest image"
            time.sleep(0.005)
        assert frame.frame_id == "newest" and not frame.reused
        np.testing.assert_array_equal(frame.images["base_0_rgb"], decode(newest))
    finally:
        release.set()
        decoder.close()
    assert [name for name, _ in calls] == ["first", "costly", "newest"]
    assert all(thread is decoder.thread for _, thread in calls), calls  # never the caller's thread


def test_instruction_ignores_empty_cuts_long_and_fits_the_prompt(tmp_path):
    instruction = Instruction("do nothing", max_chars=40)
    assert instruction.set("   ") == "ignored" and instruction.text == "do nothing" and instruction.version == 0
    assert instruction.set("stack the cups") == "accepted" and instruction.version == 1
    assert instruction.set("stack the cups") == "accepted" and instruction.version == 1  # unchanged
    assert instruction.set("x" * 50) == "truncated" and instruction.text == "x" * 40
    assert (instruction.ignored, instruction.truncated) == (1, 1)

    config = get_preset("tiny")
    tokenizer = load_tokenizer(train_tokenizer(tmp_path / "tok.model", config.vocab_size))
    state = np.linspace(-0.9, 0.9, 14)
    words = " ".join(f"move block {i} to the tray" for i in range(30)).split()
    instruction = Instruction("", max_chars=1000)
    instruction.set(" ".join(words))
    assert instruction.fit_prompt(tokenizer, state, config, None)
    kept = instruction.text.split()
    assert 0 < len(kept) < len(words) and kept == words[: len(kept)] and instruction.truncated == 1
    normalized = normalized_state(state, config, None)
    tokenize_prompt(tokenizer, instruction.text, normalized, config.max_token_len)  # fits now
    with pytest.raises(ValueError, match="max_token_len"):  # and is the longest prefix of words that does
        tokenize_prompt(tokenizer, " ".join(words[: len(kept) + 1]), normalized, config.max_token_len)
    assert instruction.fit_prompt(tokenizer, state, config, None) is None  # already fits: nothing to do

    # No spaces, or emoji only: cut by characters, never to nothing, never inside a character's sequence.
    for text in ("x" * 3000, "\U0001f9d1\u200d\U0001f373" * 1000, "e\u0301" * 1500):
        instruction = Instruction("wave", max_chars=2000)
        assert instruction.set(text) == "truncated" and instruction.text
        assert instruction.fit_prompt(tokenizer, state, config, None) == "cut"
        cut = instruction.text
        assert cut and text.startswith(cut) and text[len(cut)] not in ("\u200d", "\u0301", "\U0001f373")
        tokenize_prompt(tokenizer, cut, normalized, config.max_token_len)
    # Nothing of the new text fits (here: a tokenizer for which its first character is too long): keep the old task.
    class Picky:
        def encode(self, text: str, add_bos: bool = False) -> list[int]:
            return [1] * (1000 if "Task: s" in text else 10)

    instruction = Instruction("wave", max_chars=100)
    instruction.set("stack")
    assert instruction.fit_prompt(Picky(), state, config, None) == "previous" and instruction.text == "wave"


def test_log_throttle_is_per_key_and_counts_what_it_held_back():
    now = [0.0]
    throttle = LogThrottle(5.0, clock=lambda: now[0])
    assert throttle.allow(("cam", "corrupt")) == 0
    assert throttle.allow(("cam", "corrupt")) is None and throttle.allow(("cam", "corrupt")) is None
    assert throttle.allow(("cam", "too_large")) == 0  # another reason is not hidden by the first
    now[0] = 5.0
    assert throttle.allow(("cam", "corrupt")) == 2
    assert LogThrottle.suffix(2) == " (2 more since the last such line)" and LogThrottle.suffix(0) == ""


# ---- parameters -----------------------------------------------------------------------------------------------------

def parameter_values(**changes) -> dict:
    values = {spec.name: None if spec.default in (REQUIRED, OPTIONAL) else spec.default for spec in SPECS}
    values.update({"cameras.topics": ["cam/a", "cam/b"], "cameras.keys": ["base_0_rgb", "left_wrist_0_rgb"],
                   "joints.state_names": ["a", "b"], "joints.action_names": ["a", "b"]})
    values.update({k.replace("__", "."): v for k, v in changes.items()})
    return values


def test_parameters_are_validated_with_clear_errors():
    params = read_parameters(parameter_values(control__rate_hz=20))  # an integer where a float is expected
    assert params.rate_hz == 20.0 and params.time_step_s == 0.05 and params.camera_compressed == (False, False)
    assert (params.max_pixels, params.max_state_age_s, params.future_tolerance_s, params.max_preempted) == (
        1920 * 1200, 0.5, 0.1, 16)
    assert read_parameters(parameter_values(cameras__compressed=[True, False])).camera_compressed == (True, False)
    assert read_parameters(parameter_values(language__policy=False)).language_policy == "off"  # YAML's `off`
    bad = {
        "cameras.keys": (["base_0_rgb"], "cameras.topics has 2 entries but cameras.keys 1"),
        "cameras.topics": (None, "cameras.topics is not set"),
        "cameras.compressed": ([True], "cameras.compressed has 1 entries for 2 cameras"),
        "joints.state_names": (["a", "a"], r"joints.state_names lists \['a'\] more than once"),
        "model.preset": ("huge", "model.preset must be one of tiny | small | pi05"),
        "language.policy": ("always", "language.policy must be one of"),
        "language.admission": ("random", "language.admission must be one of"),
        "control.rate_hz": (0.0, r"control.rate_hz must be > 0"),
        "control.deadline_margin_s": (0.5, "must be shorter than the control period"),
        "language.pool_slots": (1, "language.pool_slots must be an integer >= 2"),
        "control.max_image_age_s": ("soon", "control.max_image_age_s must be a number"),
        "control.max_state_age_s": (-0.5, "control.max_state_age_s must be >= 0"),
        "control.future_tolerance_s": (math.inf, "control.future_tolerance_s must be a number"),
        "cameras.max_pixels": (-1, "cameras.max_pixels must be an integer >= 0"),
        "language.max_preempted": (1.5, "language.max_preempted must be an integer >= 0"),
        "language.tokens_per_frame": (-1, "language.tokens_per_frame must be an integer >= 0"),
        "language.min_steps_per_frame": (True, "language.min_steps_per_frame must be an integer >= 0"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(ParameterError, match=message):
            read_parameters(parameter_values(**{name.replace(".", "__"): value}))
    assert read_parameters(parameter_values()).embodiment.name == "absolute"
    droid = [f"j{i}" for i in range(8)]
    params = read_parameters(parameter_values(embodiment="droid", joints__state_names=droid, joints__action_names=droid))
    assert params.embodiment.name == "droid" and params.time_step_s == 1 / 15  # unset: the embodiment's step
    for changes, message in (
            ({"embodiment": "libero"}, "embodiment: embodiment 'libero' is neither a shipped profile"),
            ({"embodiment": "droid"}, "embodiment: embodiment droid reads 8 state dims, joints.state_names has 2"),
            ({"embodiment": "droid", "joints__state_names": droid, "joints__action_names": droid,
              "control__time_step": 0.05},
             "control.time_step 0.05 s differs from the 0.0666667 s step embodiment droid integrates"),
            ({"embodiment_override": "yes"}, "embodiment_override must be true or false")):
        with pytest.raises(ParameterError, match=message):
            read_parameters(parameter_values(**changes))


def test_a_remote_engine_is_a_websocket_url_whose_profile_says_what_it_reads(tmp_path):
    url = "ws://pool:8000/robots/arm1?model=a&rate_hz=5&slo_ms=200"
    params = read_parameters(parameter_values(engine__remote=f" {url} ", engine__timeout_s=2))
    assert (params.remote, params.remote_timeout_s) == (url, 2.0)
    assert read_parameters(parameter_values()).remote == ""  # unset: the model runs in the node
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\nabout: absolute positions, no openpi keys\n")
    for changes, message in (
            ({"engine__remote": "http://pool:8000"}, "engine.remote must be a ws:// or wss:// URL"),
            ({"engine__remote": url, "engine__timeout_s": 0.0}, "engine.timeout_s must be > 0"),
            ({"engine__remote": url, "embodiment": str(bare)}, "embodiment bare has no openpi_keys section"),
            ({"engine__remote": url, "cameras__keys": ["left_wrist_0_rgb", "right_wrist_0_rgb"]},
             r"requires the images \['observation/image'\]; map a camera to each of \['base_0_rgb'\]"),
            ({"engine__remote": url, "output__handover": "rtc_guided"}, "with engine.remote take another hand-over")):
        with pytest.raises(ParameterError, match=message):
            read_parameters(parameter_values(**changes))


def test_decode_policy_parameters_choose_adaptive_k_with_its_floor_or_a_fixed_k():
    params = read_parameters(parameter_values())  # the default: adaptive k, one step a frame owed
    assert (params.tokens_per_frame, params.min_steps_per_frame) == (0, 1)
    assert node_decode_policy(params.tokens_per_frame, params.min_steps_per_frame, 32) == {
        "adaptive_k": True, "tokens_per_frame": 32, "min_steps_per_frame": 1}  # at most one budget per period
    params = read_parameters(parameter_values(language__tokens_per_frame=3, language__min_steps_per_frame=0))
    fixed = SchedulerConfig(**node_decode_policy(params.tokens_per_frame, params.min_steps_per_frame, 32))
    assert (fixed.adaptive_k, fixed.tokens_per_frame, fixed.min_steps_per_frame) == (False, 3, 0)
    with pytest.raises(ValueError, match="must be >= 0"):
        node_decode_policy(0, -1, 32)


def group_values(groups: dict, **changes) -> dict:
    """Parameters with output groups {name: {field: value}} over the action joints a, b, c."""
    values = parameter_values(**{"joints__action_names": ["a", "b", "c"], "joints__state_names": ["a", "b", "c"],
                                 "output__groups": list(groups), **changes})
    for name, fields in groups.items():
        values.update({f"output.{name}.{field}": fields.get(field, None if default is REQUIRED else default)
                       for field, (default, _) in GROUP_SPECS.items()})
    return values


def test_a_velocity_group_needs_velocities_and_holds_with_zero(tmp_path):
    profile = tmp_path / "wheels.yaml"  # three joints commanded by velocity, as pi05_droid's arm
    profile.write_text("name: wheels\nrate_hz: 10.0\nstate: {dims: 3}\n"
                       "action: {dims: 3, kinds: [velocity, velocity, position]}\n")
    groups = {"arm": {"joints": ["a", "b"], "interface": "velocity"}, "hand": {"joints": ["c"]}}
    params = read_parameters(group_values(groups, embodiment=str(profile)))
    arm, hand = params.groups
    assert (arm.interface, arm.topic, hand.interface, hand.topic) == (
        "velocity", "arm_controller/commands", "trajectory", "hand_controller/joint_trajectory")
    assert params.holds == ("zero", "position")  # each interface's default hold
    with pytest.raises(ParameterError, match="output.arm.interface velocity needs velocities, and embodiment "
                                             "absolute makes positions only"):
        read_parameters(group_values(groups))
    with pytest.raises(ParameterError, match="output.arm.hold must be one of zero for a velocity group"):
        read_parameters(group_values({**groups, "arm": {**groups["arm"], "hold": "position"}},
                                     embodiment=str(profile)))
    with pytest.raises(ParameterError, match="output.arm.interface must be one of trajectory | velocity"):
        read_parameters(group_values({"arm": {"joints": ["a"], "interface": "effort"}}))


def test_output_groups_pick_joints_by_name_with_their_units_and_topics():
    params = read_parameters(group_values({"arm": {"joints": ["b", "a"]},
                                           "gripper": {"joints": ["c"], "topic": "hand/command", "scale": 2,
                                                       "offset": [-0.5]}}))
    arm, gripper = params.groups
    assert (arm.joints, arm.columns, arm.topic, arm.scale, arm.offset) == (
        ("b", "a"), (1, 0), "arm_controller/joint_trajectory", (1.0, 1.0), (0.0, 0.0))
    assert (gripper.topic, gripper.columns, gripper.scale, gripper.offset) == ("hand/command", (2,), (2.0,), (-0.5,))
    assert read_parameters(parameter_values()).groups == ()  # unset: action_chunk only
    assert params.handover == "newest_wins"
    bad = (
        ({"arm": {"joints": ["a", "x"]}}, r"output.arm.joints: \['x'\] are not in joints.action_names"),
        ({"arm": {"joints": ["a", "b"]}, "hand": {"joints": ["b"]}},
         r"output.hand.joints: b \(also in arm\): a joint belongs to one group only"),
        ({"arm": {"joints": ["a", "a"]}}, r"output.arm.joints lists \['a'\] more than once"),
        ({"arm": {}}, "output.arm.joints is not set"),
        ({"arm": {"joints": [" "]}}, "output.arm.joints must be a non-empty list"),
        ({"arm": {"joints": ["a"], "topic": "t"}, "hand": {"joints": ["b"], "topic": "t"}},
         "output.hand.topic 't' is also group arm's"),
        ({"arm": {"joints": ["a", "b"], "scale": [1.0]}}, r"output.arm.scale must be a finite number or a list of 2"),
        ({"arm": {"joints": ["a"], "offset": math.nan}}, "output.arm.offset must be a finite number"),
        ({"arm": {"joints": ["a"], "scale": 0.0}}, "output.arm.scale must not be 0"),
        ({"handover": {"joints": ["a"]}}, r"output.groups: \['handover'\] cannot name a group"),
        ({"left arm": {"joints": ["a"]}}, "cannot name a group"),
    )
    for groups, message in bad:
        with pytest.raises(ParameterError, match=message):
            read_parameters(group_values(groups))
    with pytest.raises(ParameterError, match="output.handover must be one of newest_wins | temporal_ensemble | rtc"):
        read_parameters(parameter_values(output__handover="average"))
    with pytest.raises(ParameterError, match=r"output.groups lists \['arm'\] more than once"):
        read_parameters(parameter_values(output__groups=["arm", "arm"]))


def test_parameters_are_checked_against_the_model():
    tiny = get_preset("tiny")
    check_against_model(read_parameters(parameter_values()), tiny)
    with pytest.raises(ParameterError, match=r"cameras.keys \['right_wrist_0_rgb'\] are not image keys"):
        check_against_model(read_parameters(parameter_values(cameras__keys=["base_0_rgb", "right_wrist_0_rgb"])),
                            tiny)
    with pytest.raises(ParameterError, match="exceeds the model's action horizon"):
        check_against_model(read_parameters(parameter_values(control__horizon=9)), tiny)
    with pytest.raises(ParameterError, match="the model's state takes at most 16"):
        names = [f"j{i}" for i in range(17)]
        check_against_model(read_parameters(parameter_values(joints__state_names=names)), tiny)


def test_shipped_parameter_files_declare_on_a_namespaced_node(ros_domain_id):
    import rclpy
    from rclpy.node import Node

    from oxygen_ros.nodes.parameters import declare_parameters

    for name, cameras, joints, rate in (("aloha", 3, 14, 50.0), ("droid", 2, 8, 15.0)):
        context = rclpy.Context()
        rclpy.init(args=["vla_node", "--ros-args", "--params-file", str(REPO / "config" / f"{name}.yaml")],
                   context=context, domain_id=ros_domain_id)
        try:
            node = Node("vla_node", namespace="/robot3", context=context)
            params = read_parameters(declare_parameters(node))
            check_against_model(params, get_preset("small"))
            assert len(params.camera_topics) == cameras and params.camera_keys[0] == "base_0_rgb"
            assert len(params.state_names) == joints == len(params.action_names) and params.rate_hz == rate
            assert all(node.describe_parameter(s.name).read_only for s in SPECS)
            node.destroy_node()
        finally:
            context.try_shutdown()
            context.destroy()


# ---- status ---------------------------------------------------------------------------------------------------------

def test_status_levels_and_messages():
    stats = RuntimeStats(action_rate_hz=19.5, action_latency_p50_ms=3.0, action_latency_p99_ms=5.0, actions=100,
                         deadline_misses=0, tokens_per_s=40.0, active_requests=2, requests_dropped=0, slots_used=2,
                         slots_total=8, bytes_used=2048, bytes_total=8192, floor_steps=3, floor_action_s=0.0125)
    health = Health(state="running", detail="", stats=stats, target_rate_hz=20.0, actions_published=100,
                    dropped_frames=3, values={"model_errors": 0})
    assert level_and_message(health)[0] == DiagnosticStatus.OK
    array = diagnostic_array(health, ns_to_stamp(5), "/robot1/vla_node: vla engine", "cpu")
    values = {kv.key: kv.value for kv in array.status[0].values}
    assert values["kv_usage_percent"] == "25.0" and values["dropped_frames"] == "3" and values["model_errors"] == "0"
    assert values["text_floor_steps"] == "3" and values["text_floor_action_ms"] == "12.5"
    status = engine_status(health, ns_to_stamp(5))
    assert (status.state, status.kv_slots_used, status.kv_slots_total, status.dropped_frames) == ("running", 2, 8, 3)
    slow = Health(**{**health.__dict__, "target_rate_hz": 50.0})
    assert level_and_message(slow) == (DiagnosticStatus.WARN, "acting at 19.5 Hz of 50 Hz")
    waiting = Health(**{**health.__dict__, "state": "waiting_for_camera", "detail": "no image yet from cam"})
    assert level_and_message(waiting) == (DiagnosticStatus.WARN, "waiting_for_camera: no image yet from cam")
    failed = Health(**{**health.__dict__, "state": "model_error", "detail": "RuntimeError: boom"})
    assert level_and_message(failed) == (DiagnosticStatus.ERROR, "model error: RuntimeError: boom")


# ---- the node's tick, in-process --------------------------------------------------------------------------------

def aloha_checkpoint(folder: Path) -> tuple[Path, Path]:
    """A tiny checkpoint trained (by its config.json) in the aloha embodiment, and a tokenizer, in `folder` (written
    once)."""
    from oxygen_ros.model.checkpoint import save_checkpoint
    from oxygen_ros.model.pi05 import build_model

    config = get_preset("tiny")
    checkpoint, tokenizer = folder / "checkpoint", folder / "tok.model"
    if not checkpoint.is_dir():
        stats = {"observation.state": {"q01": -np.ones(14), "q99": np.ones(14)},
                 "action": {"q01": -np.ones(16), "q99": np.ones(16)}}
        save_checkpoint(build_model(config), checkpoint, norm_stats=stats, embodiment="aloha")
        train_tokenizer(tokenizer, config.vocab_size)
    return checkpoint, tokenizer


def aloha_node(tmp_path, ros_domain_id, *parameters: str):
    """A vla_node in this process (its own rclpy context) on config/aloha.yaml with the tiny checkpoint and
    tokenizer of `aloha_checkpoint(tmp_path)`, two cameras a and b, and `parameters` ("name:=value") on top."""
    import rclpy

    from oxygen_ros.nodes.vla_node import VlaNode

    checkpoint, tokenizer = aloha_checkpoint(tmp_path)
    context = rclpy.Context()
    overrides = [f"model.checkpoint:={checkpoint}", f"model.tokenizer:={tokenizer}", "cameras.topics:=[a,b]",
                 "cameras.keys:=[base_0_rgb,left_wrist_0_rgb]", "cameras.compressed:=false", "control.horizon:=4",
                 # 4 points 0.5 s apart: a plan outlasts this machine's time between stamping a frame and its tick
                 # (one that has ended is refused)
                 "control.time_step:=0.5", *parameters]
    rclpy.init(args=["vla_node", "--ros-args", "--params-file", str(REPO / "config" / "aloha.yaml"),
                     *[arg for value in overrides for arg in ("-p", value)]],
               context=context, domain_id=ros_domain_id)
    node = VlaNode(context=context)
    assert node.autostart(), node.failure  # configured and active, as its process would be
    return node, context


def decoded(node) -> None:
    """Wait for the node's decoder thread to have decoded the images just given to it."""
    deadline = time.monotonic() + 30
    while not all(camera.fresh for camera in node.inputs.cameras):
        assert time.monotonic() < deadline, "the decoder thread decoded nothing"
        time.sleep(0.005)


def test_model_errors_are_counted_reported_and_ticks_go_on(tmp_path, ros_domain_id):
    node, context = aloha_node(tmp_path, ros_domain_id)
    try:
        # Start-up refuses stats narrower than the robot; narrowed after it, every act() raises ValueError.
        node.policy.norm_stats["observation.state"]["q01"] = -np.ones(4)
        now = node.get_clock().now().nanoseconds
        for index in range(2):
            node._on_image(index, image("rgb8", RGB, stamp_ns=now))
        names = list(node.params.state_names)
        state = JointState(name=names, position=np.linspace(-1, 1, len(names)).tolist())
        state.header.stamp = ns_to_stamp(now)
        node._on_joint_state(state)
        decoded(node)
        for ticks in (1, 2):
            node._control_tick()
            assert node.state == "model_error" and node.model_errors == ticks
        health = node.health()
        assert level_and_message(health) == (
            DiagnosticStatus.ERROR, "model error: ValueError: norm stat q01 has 4 dims, need 14")
        assert health.values["model_errors"] == 2 and health.actions_published == 0
        assert node.instruction.truncated == 0  # a model error is not mistaken for a prompt that is too long
    finally:
        node.close()
        node.destroy_node()
        context.try_shutdown()
        context.destroy()


class Published(list):
    """Stands in for a publisher: keeps what the node publishes."""

    def publish(self, msg) -> None:
        self.append(msg)


def test_a_delta_chunk_is_added_to_the_state_the_model_saw_not_a_newer_one(tmp_path, ros_domain_id, monkeypatch):
    """embodiment aloha (config/aloha.yaml): three joint states arrive while the model runs; the published command
    is the model's deltas added to the frame's state (pi's signs flipped back), the grippers converted, not added."""
    node, context = aloha_node(tmp_path, ros_domain_id)
    try:
        names = list(node.params.state_names)
        seen = np.linspace(-0.5, 0.5, len(names))

        def joint_state(values, stamp_ns):
            msg = JointState(name=names, position=list(values))
            msg.header.stamp = ns_to_stamp(stamp_ns)
            return msg

        now = node.get_clock().now().nanoseconds
        for index in range(2):
            node._on_image(index, image("rgb8", RGB, stamp_ns=now))
        node._on_joint_state(joint_state(seen, now))
        decoded(node)
        act = node.runtime.act

        def act_while_the_arm_moves(frame):
            for k in range(1, 4):
                node._on_joint_state(joint_state(seen + 0.1 * k, now + k))
            return act(frame)

        deltas = np.zeros((node.horizon, 14))
        deltas[:, :6], deltas[:, 7:13], deltas[:, [6, 13]] = 0.05, -0.05, 0.3
        monkeypatch.setattr(node.runtime, "act", act_while_the_arm_moves)
        monkeypatch.setattr(node.runtime, "robot_actions", lambda chunk, dims, model_id: deltas)  # the model's raw output
        node.chunk_pub = published = Published()
        node._control_tick()
        assert node.actions_published == 1, node.detail
        np.testing.assert_allclose(node.inputs.state, seen + 0.3)  # newer states did arrive
        positions = np.array([p.positions for p in published[0].points])
        flips = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1])
        expected = seen + flips * deltas[0]
        expected[[6, 13]] = (0.3 + 0.5476 + 0.6213) / 2.1123  # pi's gripper angle to ALOHA's normalized joint
        np.testing.assert_allclose(positions, np.tile(expected, (node.horizon, 1)), atol=1e-12)
    finally:
        node.close()
        node.destroy_node()
        context.try_shutdown()
        context.destroy()


def test_a_scaled_group_is_jump_checked_and_held_in_its_controllers_units(tmp_path, ros_domain_id, monkeypatch,
                                                                         capfd):
    """A gripper group with config/aloha_controllers.yaml's scale and offset and a max_jump: the measured gripper
    (the joint state, in the command's units: normalized) is mapped through offset + scale before the jump check
    and for the position hold, never compared with the plan or sent to the controller raw. Plans refused every
    other tick hold every time, but log the hold once per reason and throttle period."""
    scale, offset, max_jump = 2.1123, -0.6213, 0.3
    # a 1 s time grid and no age checks: however long this machine takes between stamping and ticking, the plan's
    # first point is still ahead and the frame is acted on
    node, context = aloha_node(tmp_path, ros_domain_id, "output.groups:=[gripper]",
                               "output.gripper.joints:=[left_gripper]", f"output.gripper.scale:={scale}",
                               f"output.gripper.offset:={offset}", f"output.gripper.max_jump:={max_jump}",
                               "control.time_step:=1.0", "control.max_image_age_s:=0.0",
                               "control.max_state_age_s:=0.0")
    try:
        names = list(node.params.state_names)
        column = names.index("left_gripper")
        raw = np.zeros((node.horizon, 14))  # the model's output, gripper column set per tick
        monkeypatch.setattr(node.runtime, "robot_actions", lambda chunk, dims, model_id: raw)
        node.chunk_pub = Published()
        node.group_pubs = [(group, Published()) for group, _ in node.group_pubs]
        sent = node.group_pubs[0][1]
        node._log = LogThrottle(node._log.period_s, clock=lambda: 0.0)  # one period, however long this takes

        def command(model_gripper: float) -> float:
            """The left gripper's command (normalized) that the embodiment makes of the model's raw output."""
            raw[:, column] = model_gripper
            return float(node.params.embodiment.actions_to_robot(raw, np.zeros(14)).positions[0, column])

        def tick(measured_gripper: float) -> None:
            now = node.get_clock().now().nanoseconds
            for index in range(2):
                node._on_image(index, image("rgb8", RGB, stamp_ns=now))
            state = np.linspace(-0.5, 0.5, 14)
            state[column] = measured_gripper
            msg = JointState(name=names, position=state.tolist())
            msg.header.stamp = ns_to_stamp(now)
            node._on_joint_state(msg)
            decoded(node)
            node._control_tick()

        # Measured where the plan is: in the controller's units no jump at all, so the plan goes out (measured
        # and plan compared in different units, 0.52 apart, it was refused).
        held_open = command(1.0)
        assert abs(offset + scale * held_open - held_open) > max_jump  # what a raw comparison sees
        tick(held_open)
        assert node.actions_published == 1 and node.state == "running", node.detail
        plan = sent[-1]
        assert stamp_to_ns(plan.header.stamp) != 0 and list(plan.joint_names) == ["left_gripper"]
        np.testing.assert_allclose([p.positions[0] for p in plan.points], offset + scale * held_open, atol=1e-12)
        # Measured closed (0, the controller's -0.6213) and a plan at the controller's 0: 0.62 away, refused (a raw
        # comparison, 0 with 0, let it through), and the hold is at the measured position in the controller's
        # units, not at the raw 0.
        toward_zero = command(-0.5476)  # pi's gripper angle for the controller's 0
        assert abs(offset + scale * toward_zero) < 1e-3 and abs(offset) > max_jump
        tick(0.0)
        assert node.actions_published == 1 and node.state == "limit_rejected", node.detail
        assert node.path.limits_rejected == {"left_gripper": 1} and "jump limit" in node.detail
        hold = sent[-1]
        assert stamp_to_ns(hold.header.stamp) == 0 and len(sent) == 2
        assert list(hold.joint_names) == ["left_gripper"] and len(hold.points) == 1
        np.testing.assert_allclose(hold.points[0].positions, [offset], atol=1e-12)
        # Refused every other tick: a hold each time (counted), one "holding" line for the reason.
        for _ in range(3):
            command(1.0)
            tick(held_open)
            command(-0.5476)
            tick(0.0)
        assert node.actions_published == 4 and node.path.holds_sent == 4 and node.path.limits_rejected == {"left_gripper": 4}
        assert [stamp_to_ns(m.header.stamp) == 0 for m in sent] == [False, True] * 4
        lines = [line for line in capfd.readouterr().err.splitlines() if "holding gripper" in line]
        assert len(lines) == 1 and lines[0].endswith("holding gripper: limit_rejected"), lines
    finally:
        node.close()
        node.destroy_node()
        context.try_shutdown()
        context.destroy()


def test_overlap_threads_reaches_the_runtime_and_the_node_acts_and_narrates_with_it(tmp_path, ros_domain_id):
    """`language.overlap_threads: 1`: ticks in-process on the real tiny model publish finite chunks every tick, and
    the narrations decoded beside the denoising are published too."""
    node, context = aloha_node(tmp_path, ros_domain_id, "language.overlap_threads:=1",
                               "language.policy:=every_n_frames", "language.every_n_frames:=1",
                               "language.max_new_tokens:=4", "model.cpu_threads:=2")
    try:
        assert node.runtime.config.overlap_threads == 1
        names = list(node.params.state_names)
        for tick in range(6):
            now = node.get_clock().now().nanoseconds
            for index in range(2):
                node._on_image(index, image("rgb8", RGB, stamp_ns=now))
            state = JointState(name=names, position=np.linspace(-1, 1, len(names)).tolist())
            state.header.stamp = ns_to_stamp(now)
            node._on_joint_state(state)
            decoded(node)
            node._control_tick()
            assert node.actions_published == tick + 1, node.detail
        assert node.runtime.drain(30)
        assert node.narrations_published >= 6 and node.runtime.worker_error is None
    finally:
        node.close()
        node.destroy_node()
        context.try_shutdown()
        context.destroy()


def test_cpu_kernel_parameter_reaches_the_model(tmp_path, ros_domain_id):
    """`model.cpu_kernel`: `auto` (the default) decodes through the compiled kernel where it builds and the CPU has
    AVX-512 or AVX2 with FMA (the setup installs a C++ compiler), and says so in the start-up source; `off` keeps the
    eager step."""
    from oxygen_ros.model.cpu_kernel import auto_refusal

    auto = ("auto", True, "cpu kernel on (auto)") if auto_refusal() is None else ("auto", False, "measured on)")
    for value, on, said in (auto, ("off", False, "cpu kernel off (as configured)")):
        node, context = aloha_node(tmp_path / value, ros_domain_id, f"model.cpu_kernel:={value}")
        try:
            assert node.params.cpu_kernel == value
            assert node.policy.model.uses_cpu_kernel is on and node.policy.source.endswith(said)
        finally:
            node.close()
            node.destroy_node()
            context.try_shutdown()
            context.destroy()


def test_the_droid_controllers_overlay_closes_the_gripper_on_one_and_reads_it_back():
    from oxygen_ros.serving.params import read_file

    config = Path(__file__).resolve().parents[2] / "config"
    values = parameter_values()
    for name in ("droid.yaml", "droid_controllers.yaml"):
        values.update(read_file(config / name))
    for group in values["output.groups"]:  # the fields a file leaves out, at their defaults (as the node declares)
        for field, (default, _) in GROUP_SPECS.items():
            values.setdefault(f"output.{group}.{field}", default)
    params = read_parameters(values)
    arm, gripper = params.groups
    assert (arm.name, arm.interface, len(arm.joints)) == ("arm", "trajectory", 7)
    closed, opened = gripper.to_robot(np.array([[0.0] * 7 + [1.0], [0.0] * 8]))[:, 0]
    assert (opened, closed) == (0.0, 0.8)  # DROID's command: 0 open .. 1 closed
    # the broadcaster's gripper joint in rad back to DROID's 0 open .. 1 closed, and held where it is
    measured = np.array([0.1, -0.2, 0.3, -1.5, 0.0, 1.2, 0.4, 0.6])
    state = params.state_units.to_state(measured)
    assert state[7] == pytest.approx(0.75) and np.array_equal(state[:7], measured[:7])
    assert gripper.measured_to_robot(state, params.state_names)[0] == pytest.approx(0.6)
