"""Robot observations (numpy, as they arrive from ROS) -> `ModelInputs`, and model actions -> robot actions.

The conventions are pi0.5's: each camera image is resized with padding (aspect ratio kept, centred, black
borders) to the model resolution and scaled to [-1, 1] (of the part of it a checkpoint's `image_crops` names, when
it names one; none of openpi's or LeRobot's checkpoints does); a camera the robot lacks becomes a zero image with mask
False; state and actions are normalized as the checkpoint says (`normalization.py`: its mode per feature and
its stats); the model's padded action dimensions are cut back to the robot's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .config import Pi05Config, resized_shape
from .inputs import ModelInputs
from .normalization import ACTION_KEY, STATE_KEY, Normalization, NormStats, as_normalization
from .prompt import tokenize_prompt
from .tokenizer import Tokenizer

__all__ = ["ACTION_KEY", "STATE_KEY", "NormStats", "Observation", "crop_square", "normalized_state",
           "prepare_inputs", "resize_with_pad", "robot_actions"]


@dataclass
class Observation:
    """One robot observation: camera name -> HxWx3 RGB image (uint8, or float in [0, 1]), raw state, task text."""

    images: dict[str, np.ndarray]
    state: np.ndarray
    task: str


def crop_square(image: np.ndarray, box: tuple[float, float, float, float]) -> np.ndarray:
    """The part `box` (top, left, bottom, right, fractions of the image padded to a centred square, as
    `resize_with_pad` pads) of an HxWxC image, black where the box leaves the image. The same box gives the same
    part of the scene whether the image comes as the camera made it or already resized with padding to a square."""
    height, width = image.shape[:2]
    side = max(height, width)
    top, left, bottom, right = (round(v * side) for v in box)
    top, bottom = top - (side - height) // 2, bottom - (side - height) // 2
    left, right = left - (side - width) // 2, right - (side - width) // 2
    out = np.zeros((max(bottom - top, 1), max(right - left, 1), *image.shape[2:]), dtype=image.dtype)
    y0, y1, x0, x1 = max(top, 0), min(bottom, height), max(left, 0), min(right, width)
    if y0 < y1 and x0 < x1:
        out[y0 - top: y1 - top, x0 - left: x1 - left] = image[y0:y1, x0:x1]
    return out


def resize_with_pad(image: np.ndarray | torch.Tensor, size: int,
                    crop: tuple[float, float, float, float] | None = None) -> torch.Tensor:
    """HxWx3 image -> [3, size, size] float32 in [-1, 1], aspect ratio kept, centred on a black background;
    with `crop`, of that part of the image (`crop_square`; a checkpoint's `Pi05Config.image_crops`).

    A tensor is taken as this function's own output and returned as is (its shape checked): a node resizes each
    image as it arrives, off its control path, and the frame then carries the model's input."""
    if isinstance(image, torch.Tensor):
        if tuple(image.shape) != (3, size, size):
            raise ValueError(f"expected a resized [3, {size}, {size}] image, got shape {tuple(image.shape)}")
        return image
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an HxWx3 RGB image, got shape {image.shape}")
    if crop is not None:
        image = crop_square(image, crop)
    pixels = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float()
    if image.dtype != np.uint8:
        pixels = pixels * 255.0
    height, width = image.shape[:2]
    if (height, width) != (size, size):
        new_h, new_w = resized_shape(height, width, size)
        if not (new_h and new_w):
            raise ValueError(f"a {width}x{height} image is too thin to resize to {size}x{size}")
        resized = F.interpolate(
            pixels[None], size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False
        )
        top, left = (size - new_h) // 2, (size - new_w) // 2
        pixels = torch.zeros(3, size, size)
        pixels[:, top : top + new_h, left : left + new_w] = resized[0].clamp(0.0, 255.0)
    return pixels / 127.5 - 1.0


def normalized_state(state: np.ndarray, config: Pi05Config, norm_stats: Normalization | NormStats | None) -> np.ndarray:
    """Raw robot state -> normalized state (`as_normalization`) zero-padded to the model's `state_dim`."""
    state = np.asarray(state, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(state)):
        raise ValueError(f"robot state contains NaN or infinite values: {state.tolist()}")
    if state.size > config.state_dim:
        raise ValueError(f"robot state has {state.size} dims, the model takes at most {config.state_dim}")
    if norm_stats is not None:
        state = as_normalization(norm_stats).normalize(STATE_KEY, state)
    return np.pad(state, (0, config.state_dim - state.size))


def prepare_inputs(
    observations: list[Observation],
    config: Pi05Config,
    tokenizer: Tokenizer,
    norm_stats: Normalization | NormStats | None = None,
) -> ModelInputs:
    """A batch of observations -> CPU `ModelInputs` (float32 images); the caller moves them to the model."""
    size = config.vision.image_size
    batch_images, batch_masks, batch_tokens, batch_token_masks = [], [], [], []
    for obs in observations:
        unknown = sorted(set(obs.images) - set(config.camera_names))
        if unknown:
            raise ValueError(f"unknown cameras {unknown}; the model takes {list(config.camera_names)}")
        images, masks = [], []
        for name in config.camera_names:
            present = name in obs.images
            images.append(resize_with_pad(obs.images[name], size, config.image_crop(name)) if present
                          else torch.zeros(3, size, size))
            masks.append(present)
        if not any(masks):
            raise ValueError("an observation needs at least one camera image")
        state = normalized_state(obs.state, config, norm_stats)
        tokens, token_mask = tokenize_prompt(tokenizer, obs.task, state, config.max_token_len)
        batch_images.append(torch.stack(images))
        batch_masks.append(torch.tensor(masks))
        batch_tokens.append(torch.from_numpy(tokens))
        batch_token_masks.append(torch.from_numpy(token_mask))
    return ModelInputs(
        images=torch.stack(batch_images),
        image_masks=torch.stack(batch_masks),
        tokens=torch.stack(batch_tokens),
        token_masks=torch.stack(batch_token_masks),
    )


def robot_actions(
    actions: torch.Tensor, robot_action_dim: int, norm_stats: Normalization | NormStats | None = None
) -> np.ndarray:
    """Model actions [B, horizon, action_dim] (normalised) -> robot actions [B, horizon, robot_action_dim]."""
    if robot_action_dim > actions.shape[-1]:
        raise ValueError(f"robot has {robot_action_dim} action dims, the model only {actions.shape[-1]}")
    out = actions[..., :robot_action_dim].detach().float().cpu().numpy().astype(np.float64)
    if norm_stats is not None:
        out = as_normalization(norm_stats).unnormalize(ACTION_KEY, out)
    return out


def normalized_action_offsets(offsets: np.ndarray, norm_stats: NormStats | None = None) -> np.ndarray:
    """Differences between robot actions [..., dims] -> the same differences in the model's normalised action space
    (every normalization mode is affine per dim, so a difference maps to a difference)."""
    offsets = np.asarray(offsets, dtype=np.float64)
    norm = as_normalization(norm_stats)
    if norm is None:
        return offsets.copy()
    return norm.normalize(ACTION_KEY, offsets) - norm.normalize(ACTION_KEY, np.zeros(offsets.shape[-1]))
