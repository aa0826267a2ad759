"""Observation preprocessing: padding resize, camera masks, quantile normalisation, action post-processing."""

import numpy as np
import pytest
import torch

from oxygen_ros.model.config import get_preset
from oxygen_ros.model.normalization import Normalization
from oxygen_ros.model.preprocess import (
    Observation,
    crop_square,
    normalized_state,
    prepare_inputs,
    resize_with_pad,
    robot_actions,
)
from oxygen_ros.model.tokenizer import load_tokenizer, train_tokenizer

CFG = get_preset("tiny")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(train_tokenizer(tmp_path_factory.mktemp("tok") / "t.model", CFG.vocab_size))


def test_wide_image_is_scaled_to_fit_and_padded_top_and_bottom():
    image = np.full((20, 40, 3), 255, dtype=np.uint8)  # white, twice as wide as tall
    out = resize_with_pad(image, 56)
    assert out.shape == (3, 56, 56)
    # 40 -> 56 wide, so 20 -> 28 tall, centred: 14 black rows above and below.
    assert torch.allclose(out[:, 14:42], torch.ones(3, 28, 56))
    assert torch.all(out[:, :14] == -1) and torch.all(out[:, 42:] == -1)


def test_square_image_at_resolution_is_only_rescaled():
    image = np.arange(56 * 56 * 3, dtype=np.int64).reshape(56, 56, 3) % 256
    out = resize_with_pad(image.astype(np.uint8), 56)
    assert torch.allclose(out, torch.from_numpy(image).permute(2, 0, 1).float() / 127.5 - 1)
    with pytest.raises(ValueError, match="RGB"):
        resize_with_pad(np.zeros((8, 8)), 56)


def test_a_crop_shows_the_same_part_of_the_scene_whether_or_not_the_image_came_padded():
    """A checkpoint's crop is in the coordinates of the image padded to a square: a robot that sends its camera's
    240x320 frame and one that resized it with padding to 224x224 first (openpi's clients do) show the model the
    same part of the scene."""
    rng = np.random.default_rng(0)
    scene = rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)
    scene[100:120, 200:220] = (255, 0, 0)  # a red square: rows 100-119, columns 200-219
    box = (0.35, 0.55, 0.55, 0.75)  # of the 320x320 padded square: rows 112-176 -> image rows 72-136, cols 176-240
    part = crop_square(scene, box)
    assert part.shape == (64, 64, 3) and np.array_equal(part, scene[72:136, 176:240])
    padded = np.zeros((320, 320, 3), np.uint8)
    padded[40:280] = scene
    assert np.array_equal(crop_square(padded, box), part)
    direct = resize_with_pad(scene, 32, box)
    smaller = resize_with_pad(np.asarray(resize_with_pad(padded, 224).add(1).mul(127.5).round().permute(1, 2, 0),
                                         dtype=np.uint8), 32, box)
    assert direct.shape == smaller.shape == (3, 32, 32)
    assert (direct - smaller).abs().mean() < 0.1  # the same part, through one more resampling
    def red_centre(pixels):  # where the red square lands in the model's input
        rows, cols = torch.nonzero((pixels[0] > 0.8) & (pixels[1] < -0.8) & (pixels[2] < -0.8), as_tuple=True)
        return np.array([rows.float().mean(), cols.float().mean()])
    assert np.abs(red_centre(direct) - red_centre(smaller)).max() < 1.0  # within a pixel of 32
    assert np.abs(red_centre(direct) - ((np.array([100, 200]) + 9.5 - [72, 176] + 0.5) / 2 - 0.5)).max() < 0.5
    # a box past the image's edge is black there, as the padding would be
    edge = crop_square(scene, (0.0, 0.0, 0.2, 0.2))  # rows -40..24 of the image: 40 black rows
    assert edge.shape == (64, 64, 3) and not edge[:40].any() and np.array_equal(edge[40:], scene[:24, :64])


def test_prepare_inputs_applies_the_checkpoints_crop_per_camera(tokenizer):
    config = CFG.replace(image_crops=(("base_0_rgb", (0.25, 0.25, 0.75, 0.75)),))
    image = np.zeros((40, 40, 3), np.uint8)
    image[10:30, 10:30] = 255  # white in the middle, which the crop fills the model's input with
    obs = Observation(images={"base_0_rgb": image, "left_wrist_0_rgb": image}, state=np.zeros(3), task="go")
    batch = prepare_inputs([obs], config, tokenizer)
    assert torch.all(batch.images[0, 0] == 1.0)
    assert torch.equal(batch.images[0, 1], resize_with_pad(image, CFG.vision.image_size))  # not cropped


def test_missing_camera_is_masked_and_zero(tokenizer):
    obs = Observation(images={"base_0_rgb": np.zeros((30, 50, 3), np.uint8)}, state=np.zeros(3), task="go")
    batch = prepare_inputs([obs, obs], CFG, tokenizer)
    assert batch.images.shape == (2, 2, 3, 56, 56)
    assert batch.image_masks.tolist() == [[True, False], [True, False]]
    assert torch.all(batch.images[:, 1] == 0)
    assert batch.tokens.shape == (2, CFG.max_token_len) and batch.token_masks[:, 0].all()
    with pytest.raises(ValueError, match="unknown cameras"):
        prepare_inputs(
            [Observation({"top": np.zeros((4, 4, 3), np.uint8)}, np.zeros(3), "go")], CFG, tokenizer
        )


def test_nan_state_is_rejected_with_a_clear_error(tokenizer):
    obs = Observation({"base_0_rgb": np.zeros((8, 8, 3), np.uint8)}, np.array([0.1, np.nan, 0.2]), "go")
    with pytest.raises(ValueError, match="NaN or infinite"):
        prepare_inputs([obs], CFG, tokenizer)


def test_state_is_quantile_normalized_and_padded():
    stats = {"observation.state": {"q01": np.array([0.0, -2.0]), "q99": np.array([10.0, 2.0])}}
    out = normalized_state(np.array([5.0, 2.0]), CFG, stats)
    np.testing.assert_allclose(out, [0.0, 1.0] + [0.0] * (CFG.state_dim - 2), atol=1e-6)
    with pytest.raises(ValueError, match="at most"):
        normalized_state(np.zeros(CFG.state_dim + 1), CFG, None)


def test_actions_are_cut_to_robot_dims_and_unnormalized():
    q01, q99 = np.array([0.0, -1.0, 5.0]), np.array([2.0, 1.0, 7.0])
    raw = np.array([[1.5, -0.2, 6.0]])
    norm = Normalization({"action": {"q01": q01, "q99": q99}})
    np.testing.assert_allclose(norm.unnormalize("action", norm.normalize("action", raw)), raw)
    model_out = torch.zeros(1, CFG.action_horizon, CFG.action_dim)
    model_out[..., 0] = 1.0
    out = robot_actions(model_out, 3, {"action": {"q01": q01, "q99": q99}})
    assert out.shape == (1, CFG.action_horizon, 3)
    np.testing.assert_allclose(out[0, 0], [2.0, 0.0, 6.0], atol=1e-5)
