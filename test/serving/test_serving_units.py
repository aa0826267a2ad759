"""`oxygen-ros serve`'s parts without a server: the wire format against openpi-client's own packer, the reading of
observation dicts per embodiment, the engine options read from the node's parameter files, where the API key
comes from."""

from pathlib import Path

import msgpack
import numpy as np
import pytest
from openpi_client import image_tools, msgpack_numpy

from oxygen_ros.commands import serve
from oxygen_ros.control.embodiment import load_embodiment
from oxygen_ros.nodes.parameters import SPECS
from oxygen_ros.serving.params import ENGINE_DEFAULTS, engine_parameters, read_file
from oxygen_ros.serving.protocol import ProtocolError, pack, unpack
from oxygen_ros.serving.requests import MAX_ERROR_CHARS, RequestError, RequestReader

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)
IMAGE = RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8)


# ---- wire format -------------------------------------------------------------------------------------------------

def test_messages_cross_with_openpi_clients_packer_both_ways():
    message = {"actions": RNG.normal(size=(8, 14)), "image": IMAGE, "flag": np.bool_(True), "n": np.float32(2.5),
               "nested": {"list": [1, "two", 3.0]}, "prompt": "pick"}
    for packed, unpacker in ((pack(message), msgpack_numpy.unpackb), (msgpack_numpy.packb(message), unpack)):
        back = unpacker(packed)
        np.testing.assert_array_equal(back["actions"], message["actions"])
        np.testing.assert_array_equal(back["image"], IMAGE)
        assert back["image"].dtype == np.uint8 and back["n"] == np.float32(2.5) and back["flag"]
        assert back["nested"] == {"list": [1, "two", 3.0]} and back["prompt"] == "pick"
    sliced = IMAGE[:, ::2]  # not contiguous: sent in C order
    np.testing.assert_array_equal(unpack(pack(sliced)), sliced)


def array(dtype: str, shape, data: bytes) -> bytes:
    return msgpack.packb({"x": {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}})


ISSUE_45_ITEMS = 31 * 2**20  # the issue's message: an array of 31 M empty maps


@pytest.mark.parametrize("data", [
    b"\xdd" + ISSUE_45_ITEMS.to_bytes(4, "big") + b"\x80" * ISSUE_45_ITEMS,  # refused from its header
    b"\xdc\x01\xe0" + (b"\xdc\xff\xff" + b"\x80" * 0xFFFF) * 480,  # no array too long, all of them together
    b"\xdc\x00\x20" + (b"\xdc\xff\xff" + b"\xa2ab" * 0xFFFF) * 32,  # two-character strings
    b"\xdc\x01\x00" + (b"\xde\x10\x00" + b"".join(b"\xa3" + f"{i:03x}".encode() + b"\xc0"
                                                   for i in range(4096))) * 256,  # maps of 4096 entries
])
def test_messages_that_decode_into_too_many_objects_are_refused(data):
    with pytest.raises(ProtocolError, match="^the message is too large once decoded: (more than 262144 arrays, maps "
                                            "and items|32505856 exceeds max_array_len.262144.)$"):
        unpack(data)


def test_the_object_budget_passes_what_openpi_clients_send():
    message = {"observation/state": list(np.arange(1000.0)), "images": {"a": IMAGE, "b": IMAGE},
               "nested": [[i, str(i)] for i in range(60_000)], "prompt": "p" * 65536}
    back = unpack(msgpack_numpy.packb(message))
    assert back["nested"][-1] == [59_999, "59999"] and back["observation/state"][-1] == 999.0
    with pytest.raises(ProtocolError, match="more than 1000 arrays"):
        unpack(msgpack_numpy.packb(message), max_objects=1000)


@pytest.mark.parametrize("data, message", [
    (b"\xc1", "not a msgpack message"),
    (msgpack.packb([1, 2]) + b"\x00", "not a msgpack message: ExtraData"),
    (array("|O", [1], b"\x00" * 8), "dtype object is not accepted"),
    (array("<V8", [1], b"\x00" * 8), "dtype |V8 is not accepted"),
    (array("nonsense", [1], b""), "unknown dtype 'nonsense'"),
    (array("<f8", [2, 2], b"\x00" * 8), "needs 32 bytes, the message carries 8"),
    (array("<f8", [-1], b""), "shape must be a list of at most 64 sizes"),
    (array("<f8", [2**62] * 100_000, b""), "shape must be a list of at most 64 sizes, got a list of 100000 items"),
    (array("x" * 10**5, [1], b""), "unknown dtype 'xxxx.*' *\\.\\.\\. \\(100000 characters\\)$"),
    (msgpack.packb({"t": msgpack.ExtType(1, b"x")}), "^msgpack extension type 1 is not accepted"),
    (b"\x91" * 100_000 + b"\xc0", "not a msgpack message: StackError"),  # nested 100,000 deep
    (msgpack.packb({"x": {b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}}), "cannot hold 300"),
])
def test_malformed_messages_are_one_protocol_error(data, message):
    with pytest.raises(ProtocolError, match=message):
        unpack(data)


# ---- observation dicts -------------------------------------------------------------------------------------------

def reader(name: str, default_prompt: str = "", max_pixels: int = 0) -> RequestReader:
    return RequestReader(load_embodiment(name), (8, 16), max_pixels, default_prompt)


DROID = {"observation/exterior_image_1_left": IMAGE, "observation/wrist_image_left": IMAGE.transpose(2, 0, 1),
         "observation/joint_position": np.arange(7.0), "observation/gripper_position": np.float64(0.5),
         "prompt": "pick", "extra": "ignored"}


def test_droid_requests_read_as_droid_inputs_does():
    request = reader("droid").read(DROID)
    np.testing.assert_array_equal(request.state, [0, 1, 2, 3, 4, 5, 6, 0.5])  # joints, then the scalar gripper
    images = request.observation.images
    assert sorted(images) == ["base_0_rgb", "left_wrist_0_rgb"] and request.observation.task == "pick"
    np.testing.assert_array_equal(images["left_wrist_0_rgb"], IMAGE)  # channel first, turned as openpi's rule
    assert not request.narrate and request.noise is None
    floats = reader("droid").read(dict(DROID, **{"observation/exterior_image_1_left": IMAGE / 255.0}))
    expected = (255 * (IMAGE / 255.0)).astype(np.uint8)  # openpi's conversion, truncation included
    np.testing.assert_array_equal(floats.observation.images["base_0_rgb"], expected)
    # a client that resized on its side (openpi's image_tools, as DROID's laptop does) sends 224 x 224
    resized = image_tools.resize_with_pad(IMAGE, 224, 224)
    assert reader("droid").read(dict(DROID, **{"observation/wrist_image_left": resized})) \
        .observation.images["left_wrist_0_rgb"].shape == (224, 224, 3)


def test_aloha_requests_read_nested_channel_first_images_and_flip_the_state():
    state = np.linspace(-0.5, 0.5, 14)
    obs = {"state": state, "images": {"cam_high": IMAGE.transpose(2, 0, 1), "cam_low": IMAGE.transpose(2, 0, 1)},
           "prompt": b"fold", "narrate": True, "noise": np.ones((1, 8, 16))}
    request = reader("aloha").read(obs)
    assert sorted(request.observation.images) == ["base_0_rgb"]  # the wrists are optional, cam_low unused
    np.testing.assert_array_equal(request.state, state)
    np.testing.assert_array_equal(request.observation.state, load_embodiment("aloha").state_to_model(state))
    assert request.observation.task == "fold" and request.narrate
    assert request.noise.shape == (1, 8, 16) and request.noise.dtype == np.float32


BAD = {
    "not a dict": ([1, 2], "not_a_dict", "a request must be a dict"),
    "missing image": ({k: v for k, v in DROID.items() if k != "observation/wrist_image_left"}, "missing_key",
                      "missing key 'observation/wrist_image_left': embodiment droid reads observation/joint_position"),
    "missing prompt": ({k: v for k, v in DROID.items() if k != "prompt"}, "missing_key",
                       "missing key 'prompt' .and the server has no default prompt"),
    "short state": (dict(DROID, **{"observation/joint_position": np.zeros(6)}), "state_shape",
                    "observation/joint_position must hold 7 values, got shape \\[6\\]"),
    "text state": (dict(DROID, **{"observation/joint_position": "zero"}), "state_dtype", "must hold numbers"),
    "ragged state": (dict(DROID, **{"observation/joint_position": [[1], [2, 3]]}), "state_dtype", "must hold numbers"),
    "inf state": (dict(DROID, **{"observation/gripper_position": np.inf}), "nonfinite_state", "NaN or infinite"),
    "gray image": (dict(DROID, **{"observation/wrist_image_left": IMAGE[:, :, 0]}), "image_shape",
                   "must be height x width x 3 .or 3 x height x width., got shape \\[48, 64\\]"),
    "empty image": (dict(DROID, **{"observation/wrist_image_left": np.zeros((0, 4, 3), np.uint8)}), "image_shape",
                    "is empty"),
    "int image": (dict(DROID, **{"observation/wrist_image_left": IMAGE.astype(np.int64)}), "image_dtype",
                  "must be a uint8 array .or float in \\[0, 1\\]., got dtype int64"),
    "bright float": (dict(DROID, **{"observation/wrist_image_left": IMAGE * 1.0}), "image_values", "in \\[0, 1\\]"),
    "bad prompt": (dict(DROID, prompt=3), "prompt", "prompt must be a string, got int"),
    "bad narrate": (dict(DROID, narrate="yes"), "bad_flag", "narrate must be true or false"),
    "bad noise": (dict(DROID, noise=np.full((8, 16), np.nan)), "noise", "noise holds NaN"),
}


class NoRepr(list):
    """A decoded list whose repr must never be built (it can be gigabytes)."""

    def __repr__(self):
        raise AssertionError("the whole repr was built")


def test_refusals_describe_a_huge_value_in_a_few_words():
    with pytest.raises(RequestError) as err:
        reader("droid").read(dict(DROID, narrate=NoRepr(range(3_000_000))))
    assert str(err.value) == "narrate must be true or false, got a NoRepr of 3000000 items"
    state = np.zeros(1000, dtype=np.float16)
    state[[7, 9]] = [np.nan, np.inf]
    with pytest.raises(RequestError) as err:
        reader("absolute").read({"observation/state": state, "observation/image": IMAGE, "prompt": ""})
    assert (err.value.reason, str(err.value)) == ("nonfinite_state", "the state holds NaN or infinite values: 2 of "
                                                                      "1000, the first at index 7")
    with pytest.raises(RequestError) as err:  # 31 MB of float16: refused before any conversion
        reader("absolute").read({"observation/state": np.zeros(15_700_000, np.float16), "observation/image": IMAGE})
    assert (err.value.reason, str(err.value)) == ("state_shape", "the state holds 15700000 values, more than any "
                                                                 "model reads (1024)")
    long = RequestError("model_error", "x" * 10**6)  # whatever a message holds, it is cut
    assert len(str(long)) == MAX_ERROR_CHARS and str(long).endswith("...")


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_requests_are_refused_with_a_reason(case):
    obs, reason, message = BAD[case]
    with pytest.raises(RequestError, match=message) as err:
        reader("droid").read(obs)
    assert err.value.reason == reason


def test_defaults_budgets_and_any_width(tmp_path):
    no_prompt = {k: v for k, v in DROID.items() if k != "prompt"}
    assert reader("droid", default_prompt="tidy up").read(no_prompt).observation.task == "tidy up"
    with pytest.raises(RequestError, match="has 64 x 48 pixels, more than the server's budget of 1000"):
        reader("droid", max_pixels=1000).read(DROID)
    absolute = reader("absolute").read({"observation/state": np.arange(5.0), "observation/image": IMAGE,
                                        "prompt": ""})  # any state width; the wrist camera is optional
    assert absolute.state.shape == (5,) and sorted(absolute.observation.images) == ["base_0_rgb"]
    (tmp_path / "arm.yaml").write_text("name: arm\n")
    with pytest.raises(ValueError, match="embodiment arm has no openpi_keys section"):
        RequestReader(load_embodiment(str(tmp_path / "arm.yaml")), (8, 16), 0, "")


# ---- parameters --------------------------------------------------------------------------------------------------

def test_engine_options_are_the_nodes_with_its_defaults():
    node_defaults = {spec.name: spec.default for spec in SPECS}
    assert {name: node_defaults[name] for name in ENGINE_DEFAULTS} == ENGINE_DEFAULTS
    droid = engine_parameters([REPO / "config" / "droid.yaml"], ["model.dtype=float32", "model.cpu_kernel=off",
                                                                 "language.temperature=0.5"])
    assert (droid["embodiment"], droid["model.preset"], droid["control.denoise_steps"]) == ("droid", "small", 10)
    assert (droid["model.dtype"], droid["model.cpu_kernel"], droid["language.temperature"]) == \
        ("float32", "off", 0.5)  # a bare off is YAML's false: read back as the word
    assert len(droid["joints.action_names"]) == 8 and droid["control.rate_hz"] == 15.0
    assert "cameras.topics" in read_file(REPO / "config" / "droid.yaml")  # the node's wiring: read, not used
    with pytest.raises(ValueError, match="--param 'cameras.topics=.a.': expected NAME=VALUE with NAME one of"):
        engine_parameters([], ["cameras.topics=[a]"])
    with pytest.raises(ValueError, match="model.seed must be an integer >= 0, got 'x'"):
        engine_parameters([], ["model.seed=x"])
    with pytest.raises(ValueError, match="has no ros__parameters under"):
        read_file(REPO / "oxygen_ros" / "control" / "embodiments" / "droid.yaml")


# ---- the API key -------------------------------------------------------------------------------------------------

def test_the_api_key_is_the_flags_else_the_environments_and_its_value_is_never_a_printed_default(monkeypatch, capsys):
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    assert serve.api_key(None) is None and serve.api_key("") is None
    monkeypatch.setenv(serve.API_KEY_ENV, "")
    assert serve.api_key(None) is None  # set but empty: no key
    monkeypatch.setenv(serve.API_KEY_ENV, "secret-from-the-env")
    assert serve.api_key(None) == "secret-from-the-env"
    assert serve.api_key("from-the-flag") == "from-the-flag"
    with pytest.raises(SystemExit) as done:
        serve.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "$OXYGEN_ROS_API_KEY" in " ".join(text.split()) and "secret-from-the-env" not in text
