"""Embodiment profiles against values worked out by hand from openpi's formulas (docs/embodiments.md cites them),
both ways, and the profiles the node must refuse."""

import numpy as np
import pytest

from oxygen_ros.control.embodiment import (
    EmbodimentError,
    lerobot_relative_mask,
    load_embodiment,
    shipped_names,
)
from oxygen_ros.model.checkpoint import TrainedOn
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.preprocess import normalized_state

ALOHA_FLIPS = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1], dtype=float)


def test_shipped_profiles_load():
    assert shipped_names() == ("absolute", "aloha", "aloha_sim", "droid")
    droid, aloha = load_embodiment("droid"), load_embodiment("aloha")
    assert (droid.rate_hz, droid.horizon, droid.openpi_asset_ids) == (15.0, 15, ("droid",))
    assert (aloha.rate_hz, aloha.horizon, aloha.openpi_asset_ids) == (50.0, 50, ("trossen",))
    assert droid.openpi_keys.state == (("observation/joint_position", 7), ("observation/gripper_position", 1))
    assert dict(aloha.openpi_keys.images)["images/cam_high"] == "base_0_rgb"
    assert aloha.openpi_keys.image_layout == "chw" and droid.openpi_keys.image_layout == "hwc"
    assert aloha.openpi_keys.optional_images == ("images/cam_left_wrist", "images/cam_right_wrist")
    assert aloha.openpi_keys.metadata == {"reset_pose": [0, -1.5, 1.5, 0, 0, 0]}
    assert load_embodiment("absolute").openpi_keys.state == (("observation/state", None),)


def test_openpi_actions_are_the_robot_command_with_velocities_left_as_velocities():
    """What openpi's server returns: ALOHA's deltas made absolute and encoded (the node's command itself), DROID's
    velocities as the model gave them (the node integrates them; openpi does not), the gripper as it is."""
    droid, aloha = load_embodiment("droid"), load_embodiment("aloha")
    state = np.array([0.3, -0.2, 0.1, -1.5, 0.0, 1.2, 0.7, 0.25])
    model = np.random.default_rng(0).uniform(-1, 1, (15, 32))
    np.testing.assert_array_equal(droid.openpi_actions(model, state), model[:, :8])
    aloha_state = np.linspace(-0.5, 0.5, 14)
    np.testing.assert_array_equal(aloha.openpi_actions(model[:, :14], aloha_state),
                                  aloha.actions_to_robot(model[:, :14], aloha_state).positions)
    np.testing.assert_array_equal(load_embodiment("absolute").openpi_actions(model[:, :5], state), model[:, :5])


@pytest.mark.parametrize("name", ["absolute", "aloha", "droid"])
def test_a_remote_engines_openpi_reply_becomes_the_command_the_local_engine_makes(name):
    """A robot served by a remote engine gets openpi's reply (`openpi_actions`); `openpi_to_model` takes it back to
    the model's actions, so the robot's command is the local engine's, action filter (DROID's clip) included."""
    profile = load_embodiment(name)
    rng = np.random.default_rng(1)
    width = 5 if profile.kinds is None else len(profile.kinds)
    model = rng.uniform(-1.5, 1.5, (10, width))  # past DROID's clip of [-1, 1]: the robot side clips
    state = rng.uniform(-0.5, 0.5, profile.state_dims or width)
    if name == "aloha":
        state[[6, 13]] = 0.03  # a finger position inside the gripper's range (m)
        model[:, [6, 13]] = rng.uniform(0.1, 0.9, (10, 2))
    reply = profile.openpi_actions(model, state)
    local, remote = profile.actions_to_robot(model, state), profile.actions_to_robot(
        profile.openpi_to_model(reply, state), state)
    np.testing.assert_allclose(remote.stacked(), local.stacked(), atol=1e-9)


def test_droid_velocities_are_normalized_steps_of_0_2_rad_added_to_the_frame_state():
    """DROID's `joint_velocity_to_delta`: v = 0.5 moves a joint 0.1 rad per 15 Hz step, so 15 steps (1 s) end
    1.5 rad from the frame's joints at 1.5 rad/s (1.0 = 3 rad/s)."""
    droid = load_embodiment("droid")
    state = np.array([0.3, -0.2, 0.1, -1.5, 0.0, 1.2, 0.7, 0.25])
    model = np.zeros((15, 32))  # the model's padded width; the profile reads its first 8 dims
    model[:, :7] = 0.5
    model[:, 7] = 0.8  # gripper position, absolute
    chunk = droid.actions_to_robot(model, state)
    np.testing.assert_allclose(chunk.positions[-1, :7], state[:7] + 1.5, atol=1e-12)
    np.testing.assert_allclose(chunk.positions[0, :7], state[:7] + 0.1, atol=1e-12)  # point 0: one step on
    np.testing.assert_allclose(chunk.velocities[:, :7], 1.5)
    np.testing.assert_allclose(chunk.positions[:, 7], 0.8)
    np.testing.assert_allclose(chunk.velocities[:, 7], 0.0, atol=1e-12)  # a held gripper does not move
    assert chunk.stacked().shape == (15, 16)
    np.testing.assert_allclose(droid.actions_to_model(chunk.positions, state), model[:, :8], atol=1e-12)
    np.testing.assert_array_equal(droid.state_to_model(state), state)


def test_droid_scales_a_velocity_vector_past_one_down_as_a_whole(tmp_path):
    """max |v| = 2: the whole vector is divided by 2 (directions kept), as DROID does; the shipped profile clips
    every dim to [-1, 1] first as openpi's example does, so the unclipped case is a profile without `clip`."""
    text = open(load_embodiment("droid").source).read()
    path = tmp_path / "droid_noclip.yaml"
    path.write_text(text.replace("  clip: [-1, 1]", "  # no clip"))
    droid = load_embodiment(str(path))
    assert droid.action_filter is None
    v = np.array([2.0, -1.0, 0.5, 0.0, 0.2, -2.0, 1.0])
    model = np.zeros((1, 8))
    model[0, :7] = v
    chunk = droid.actions_to_robot(model, np.zeros(8))
    np.testing.assert_allclose(chunk.positions[0, :7], 0.2 * v / 2.0, atol=1e-12)
    np.testing.assert_allclose(chunk.velocities[0, :7], 3.0 * v / 2.0, atol=1e-12)
    clipped = load_embodiment("droid").actions_to_robot(model, np.zeros(8))  # clip first: no dim past 1
    np.testing.assert_allclose(clipped.positions[0, :7], 0.2 * np.clip(v, -1, 1), atol=1e-12)


def test_droid_gripper_is_0_open_1_closed_and_binarized_only_when_the_profile_asks(tmp_path):
    droid = load_embodiment("droid")
    model = np.zeros((3, 8))
    model[:, 7] = [0.3, 0.6, 1.2]  # closing; the last one past closed
    np.testing.assert_allclose(droid.actions_to_robot(model, np.zeros(8)).positions[:, 7], [0.3, 0.6, 1.0])
    path = tmp_path / "droid_binary.yaml"
    path.write_text(open(droid.source).read().replace("  # binarize: 0.5", "  binarize: 0.5"))
    binary = load_embodiment(str(path))
    np.testing.assert_array_equal(binary.actions_to_robot(model, np.zeros(8)).positions[:, 7], [0.0, 1.0, 1.0])
    # openpi's server returns the model's numbers; the filter is the client's (here: the node's) step
    np.testing.assert_array_equal(binary.openpi_actions(model, np.zeros(8)), model)


@pytest.mark.parametrize("edit, message", [
    (("step: 0.2", "step: 0"), "velocity.step must be a positive number"),
    (("limit: 1.0", "limit: -1"), "velocity.limit must be a positive number"),
    (("clip: [-1, 1]", "clip: [1, -1]"), "action.clip must be [low, high]"),
    (("  # binarize: 0.5", "  binarize: yes"), "action.binarize must be a number"),
])
def test_droid_velocity_and_filter_keys_are_checked(tmp_path, edit, message):
    path = tmp_path / "bad.yaml"
    path.write_text(open(load_embodiment("droid").source).read().replace(*edit))
    with pytest.raises(EmbodimentError, match=message.replace("[", r"\[")):
        load_embodiment(str(path))


def test_aloha_state_in_flips_signs_and_converts_the_gripper_to_pi_angles():
    aloha = load_embodiment("aloha")
    state = np.array([0.1, 0.2, -0.3, 0.4, 0.5, 0.6, 0.5, -0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 1.0])
    model = aloha.state_to_model(state)
    joints = [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12]
    np.testing.assert_allclose(model[joints], (ALOHA_FLIPS * state)[joints])
    # gripper 0.5: x = 0.01844 + 0.5 * 0.03956 = 0.03822 m; (0.022^2 + x^2 - 0.036^2) / (2 * 0.022 * x) = 0.385786;
    # asin = 0.396059 rad; (0.396059 - 0.5476) / 1.082 = -0.140056. Gripper 1.0: x = 0.058 gives exactly 1, pi / 2.
    np.testing.assert_allclose(model[6], -0.1400559217, atol=1e-9)
    np.testing.assert_allclose(model[13], (np.pi / 2 - 0.5476) / 1.082, atol=1e-9)
    padded = normalized_state(model, get_preset("tiny"), None)  # the model's width: the profile's dims, then zeros
    assert padded.shape == (16,) and np.array_equal(padded[:14], model) and not padded[14:].any()


def test_aloha_deltas_are_added_to_the_frame_state_and_the_grippers_converted_absolute():
    aloha = load_embodiment("aloha")
    state = np.array([0.1, 0.3, -0.3, 0.4, 0.5, 0.6, 0.5, -0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 1.0])
    model = np.zeros((50, 14))
    model[:, :6] = 0.1  # a delta in pi's signs
    model[:, 6] = 0.4  # pi's gripper angle, absolute
    model[:, 7:13] = -0.05
    chunk = aloha.actions_to_robot(model, state)
    assert chunk.velocities is None
    # joint 1 flips: robot = -(0.1 + (-0.3)) = 0.2 = state 0.3 - 0.1; joint 0 does not: 0.1 + 0.1.
    np.testing.assert_allclose(chunk.positions[:, 0], 0.2)
    np.testing.assert_allclose(chunk.positions[:, 1], 0.2)
    np.testing.assert_allclose(chunk.positions[:, 7:13] - (state[7:13] - 0.05 * ALOHA_FLIPS[7:13]), 0.0, atol=1e-12)
    # gripper: (0.4 + 0.5476 + 0.6213) / 2.1123 = 0.742745, whatever the state's gripper was
    np.testing.assert_allclose(chunk.positions[:, 6], 0.7427448753, atol=1e-9)
    np.testing.assert_allclose(chunk.positions[:, 13], (0.5476 + 0.6213) / 2.1123, atol=1e-9)
    # and back: recorded absolute actions become what training fits
    np.testing.assert_allclose(aloha.actions_to_model(chunk.positions, state), model, atol=1e-12)
    # batched over frames, each chunk relative to its own frame
    states = np.stack([state, state + 0.2])
    both = aloha.actions_to_robot(np.stack([model, model]), states).positions
    np.testing.assert_allclose(both[1, :, :6] - both[0, :, :6], 0.2)
    np.testing.assert_allclose(both[1, :, 6], both[0, :, 6])


def test_aloha_sim_is_alohas_units_with_every_joint_absolute():
    """openpi's pi0_aloha_sim: adapt_to_pi as in `aloha`, no delta: the joints are the flipped model values whatever
    the frame's state, the grippers and the state in are `aloha`'s, and its request keys are `aloha`'s."""
    aloha, sim = load_embodiment("aloha"), load_embodiment("aloha_sim")
    state = np.array([0.1, 0.3, -0.3, 0.4, 0.5, 0.6, 0.5, -0.1, -0.2, 0.3, 0.4, 0.5, 0.6, 1.0])
    model = np.random.default_rng(0).uniform(-1, 1, (50, 14))
    chunk = sim.actions_to_robot(model, state)
    joints = [d for d in range(14) if d not in (6, 13)]
    np.testing.assert_allclose(chunk.positions[:, joints], model[:, joints] * ALOHA_FLIPS[joints], atol=1e-12)
    np.testing.assert_allclose(sim.actions_to_robot(model, state + 0.3).positions, chunk.positions)
    np.testing.assert_allclose(chunk.positions[:, [6, 13]], aloha.actions_to_robot(model, state).positions[:, [6, 13]])
    np.testing.assert_allclose(sim.actions_to_model(chunk.positions, state), model, atol=1e-12)
    np.testing.assert_allclose(sim.state_to_model(state[None]), aloha.state_to_model(state[None]))
    assert sim.openpi_keys == aloha.openpi_keys and (sim.rate_hz, sim.horizon) == (50.0, 50)


def test_absolute_is_the_identity_on_any_width():
    absolute = load_embodiment("absolute")
    state, actions = np.arange(5.0), np.arange(30.0).reshape(3, 10)
    np.testing.assert_array_equal(absolute.state_to_model(state), state)
    chunk = absolute.actions_to_robot(actions, state)
    np.testing.assert_array_equal(chunk.positions, actions)
    assert chunk.velocities is None and not absolute.has_velocity and absolute.time_step is None
    absolute.check_joints(("a",) * 3, ("b",) * 7)


def test_a_user_profile_picks_state_dims_and_converts_units(tmp_path):
    path = tmp_path / "arm.yaml"
    path.write_text("""
name: arm
rate_hz: 10
state: {dims: 4, pick: [2, 0], sign: [1, -1]}
action:
  dims: 2
  kinds: [delta, gripper]
  convert: {1: width}
conversions:
  width: {type: linear, scale: 0.08, offset: 0.01}
""")
    arm = load_embodiment(str(path))
    np.testing.assert_allclose(arm.state_to_model([1.0, 2.0, 3.0, 4.0]), [3.0, -1.0])
    chunk = arm.actions_to_robot(np.array([[0.5, 0.5]]), np.array([1.0, 2.0, 3.0, 4.0])).positions
    np.testing.assert_allclose(chunk, [[3.5, 0.05]])  # delta on model state dim 0 (robot dim 2); 0.01 + 0.08 * 0.5
    arm.check_joints(("a", "b", "c", "d"), ("x", "y"))
    with pytest.raises(EmbodimentError, match="embodiment arm reads 4 state dims, joints.state_names has 3"):
        arm.check_joints(("a", "b", "c"), ("x", "y"))
    with pytest.raises(EmbodimentError, match="embodiment arm has 2 action dims, joints.action_names has 3"):
        arm.check_joints(("a", "b", "c", "d"), ("x", "y", "z"))


BAD_PROFILES = {
    "unknown kind": ("action: {dims: 1, kinds: [torque]}", "unknown action kind 'torque'; known: position | delta"),
    "end effector": ("action: {dims: 1, kinds: [end_effector]}",
                     "end-effector actions .* cannot be expressed as a joint trajectory"),
    "missing mask": ("action: {dims: 2}", "action.kinds is missing: give each of the 2 action dims its kind"),
    "short mask": ("action: {dims: 2, kinds: [delta]}", "action.kinds must list one kind for each of the 2"),
    "velocity without rate": ("action: {dims: 1, kinds: [velocity]}", "velocity actions need rate_hz"),
    "bad sign": ("state: {dims: 2, sign: [1, 2]}", r"state.sign must list \+1 or -1 for each of its 2"),
    "undefined conversion": ("action: {dims: 1, kinds: [gripper], convert: {0: g}}",
                             "names conversion 'g', which conversions does not define"),
    "bad conversion": ("action: {dims: 1, kinds: [gripper], convert: {0: g}}\nconversions: {g: {type: linear}}",
                       r"conversions.g \(linear\) takes the numbers scale, offset; missing \['scale', 'offset'\]"),
    "unknown key": ("actions: {dims: 1}", r"the file has unknown keys \['actions'\]"),
    "openpi widths": ("state: {dims: 3}\nopenpi_keys: {state: [[s, 2]]}", "openpi_keys.state adds up to 2 dims"),
    "openpi any width": ("openpi_keys: {state: [a, [b, 2]]}", "a key without a width .* must be the only state key"),
    "openpi optional": ("openpi_keys: {images: {a: base_0_rgb}, optional_images: [b]}",
                        "optional_images must list keys of openpi_keys.images"),
    "openpi layout": ("openpi_keys: {image_layout: whc}", "image_layout must be one of hwc | chw, got 'whc'"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROFILES))
def test_bad_profiles_are_refused_with_the_reason(case, tmp_path):
    body, message = BAD_PROFILES[case]
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\n{body}\n")
    with pytest.raises(EmbodimentError, match=message):
        load_embodiment(str(path))


def test_unknown_names_and_files_are_refused():
    with pytest.raises(EmbodimentError, match="'libero' is neither a shipped profile .absolute | aloha | droid."):
        load_embodiment("libero")


def test_a_profile_is_checked_against_what_the_checkpoint_was_trained_on():
    aloha, droid, absolute = (load_embodiment(n) for n in ("aloha", "droid", "absolute"))
    names = tuple(f"j{i}" for i in range(14))
    assert aloha.mismatch(TrainedOn(openpi_asset_id="trossen"), names) is None
    assert "assets/trossen, which embodiment aloha is for" in droid.mismatch(TrainedOn(openpi_asset_id="trossen"),
                                                                           names)
    assert "LIBERO" in absolute.mismatch(TrainedOn(openpi_asset_id="physical-intelligence/libero"), names)
    assert absolute.mismatch(TrainedOn(openpi_asset_id="my_robot"), names) is None  # says nothing we know
    assert aloha.mismatch(TrainedOn(embodiment="aloha"), names) is None
    assert "trained in embodiment aloha" in absolute.mismatch(TrainedOn(embodiment="aloha"), names)
    lerobot = TrainedOn(lerobot_relative=False)
    assert absolute.mismatch(lerobot, names) is None
    assert "no sign flips or unit conversions" in aloha.mismatch(lerobot, names)
    assert "not velocities" in droid.mismatch(lerobot, names[:8])
    assert aloha.mismatch(None, names) is None and aloha.mismatch(TrainedOn(), names) is None


def test_lerobot_relative_actions_need_the_same_delta_mask(tmp_path):
    relative = TrainedOn(lerobot_relative=True, lerobot_exclude=("gripper",),
                         lerobot_action_names=("shoulder", "elbow", "gripper"))
    assert lerobot_relative_mask(relative, 3) == [True, True, False]
    assert lerobot_relative_mask(TrainedOn(lerobot_relative=True, lerobot_exclude=("gripper",)), 3) == [True] * 3
    path = tmp_path / "so100.yaml"
    path.write_text("name: so100\naction: {dims: 3, kinds: [delta, delta, gripper]}\n")
    so100 = load_embodiment(str(path))
    assert so100.mismatch(relative, ("a", "b", "c")) is None
    message = load_embodiment("absolute").mismatch(relative, ("a", "b", "c"))
    assert "relative actions on dims [0, 1] (use_relative_actions true), the profile has deltas on no dim" in message


def test_openpis_train_config_is_read_before_its_asset_id(tmp_path):
    droid, aloha = load_embodiment("droid"), load_embodiment("aloha")
    names = tuple(f"j{i}" for i in range(8))
    # pi05_full_droid_finetune keeps asset id droid but trains joint-position deltas (RLDSDroidDataConfig)
    full = TrainedOn(openpi_config="pi05_full_droid_finetune", openpi_asset_id="droid")
    assert "openpi's pi05_full_droid_finetune trains 7 joint-position deltas" in droid.mismatch(full, names)
    path = tmp_path / "droid_deltas.yaml"
    path.write_text("name: droid_deltas\nstate: {dims: 8}\naction: {dims: 8, kinds: [delta, delta, delta, delta, "
                    "delta, delta, delta, gripper]}\n")
    assert load_embodiment(str(path)).mismatch(full, names) is None
    # the config's name found in openpi's checkpoints/<config>/<exp>/<step> layout
    trained = TrainedOn(openpi_folders=("20000", "my_run", "pi05_full_droid_finetune"), openpi_asset_id="droid")
    assert "joint-position deltas" in droid.mismatch(trained, names)
    velocity = TrainedOn(openpi_folders=("5000", "run", "pi05_droid_finetune"), openpi_asset_id="droid")
    assert droid.mismatch(velocity, names) is None
    assert "which embodiment droid is for" in aloha.mismatch(velocity, tuple(f"j{i}" for i in range(14)))
    assert "no profile can drive it" in droid.mismatch(TrainedOn(openpi_config="pi05_libero"), names)


def test_a_lerobot_fine_tune_on_droid_velocities_fits_droid():
    droid, absolute = load_embodiment("droid"), load_embodiment("absolute")
    names = tuple(f"j{i}" for i in range(8))
    velocities = TrainedOn(lerobot_relative=False,
                           lerobot_action_names=tuple(f"joint_velocity_{i}" for i in range(7)) + ("gripper_position",))
    assert droid.mismatch(velocities, names) is None
    assert "are velocities on dims [0, 1, 2, 3, 4, 5, 6]; the profile has them on none" in \
        absolute.mismatch(velocities, names)
    positions = TrainedOn(lerobot_relative=False,
                          lerobot_action_names=tuple(f"joint_position_{i}" for i in range(7)) + ("gripper_position",))
    assert "velocities on dims none; the profile has them on [0, 1, 2, 3, 4, 5, 6]" in droid.mismatch(positions, names)
