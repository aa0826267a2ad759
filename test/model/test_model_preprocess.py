"""Observation preprocessing: padding resize, camera masks, quantile normalisation, action post-processing."""

import numpy as np
import pytest
import torch

from oxygen_ros.model.config import get_preset
from oxygen_ros.model.normalization import Normalization
from oxygen_ros.model.preprocess import (
    Observation,
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
