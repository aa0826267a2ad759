"""Synthetic frame streams for benchmarks and tests: model-space observations, noise and arrival patterns.

Host preprocessing is left out on purpose (it is the same for every setting), so a frame here is already a
`ModelInputs` batch of one. Everything is drawn from a seeded generator: two runs see the same frames.
"""

from __future__ import annotations

import torch

from ...model.config import Pi05Config
from ...model.inputs import ModelInputs

ARRIVAL_PATTERNS = ("every_frame", "every_4", "burst")


def synthetic_frames(config: Pi05Config, num_frames: int, seed: int = 0, prompt_fill: float = 0.6,
                     device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
                     ) -> tuple[list[ModelInputs], list[torch.Tensor]]:
    """`num_frames` observations (all cameras present, a prompt filling `prompt_fill` of the text budget) + noise."""
    generator = torch.Generator().manual_seed(seed)
    size = config.vision.image_size
    prompt_len = max(1, int(config.max_token_len * prompt_fill))
    frames, noises = [], []
    for _ in range(num_frames):
        images = torch.rand(1, config.num_cameras, 3, size, size, generator=generator) * 2 - 1
        tokens = torch.full((1, config.max_token_len), config.pad_id, dtype=torch.long)
        # ids above the special ones, so a prompt never contains EOS/BOS/PAD by accident
        tokens[0, :prompt_len] = torch.randint(4, config.vocab_size, (prompt_len,), generator=generator)
        tokens[0, 0] = config.bos_id
        masks = torch.zeros(1, config.max_token_len, dtype=torch.bool)
        masks[0, :prompt_len] = True
        inputs = ModelInputs(images, torch.ones(1, config.num_cameras, dtype=torch.bool), tokens, masks)
        frames.append(inputs.to(device, dtype))
        noises.append(torch.randn(1, config.action_horizon, config.action_dim, generator=generator).to(device))
    return frames, noises


def arrivals(pattern: str, num_frames: int) -> list[bool]:
    """Which frames start a language request: every frame, every 4th frame, or bursts (4 on, 12 off)."""
    if pattern == "every_frame":
        return [True] * num_frames
    if pattern == "every_4":
        return [i % 4 == 0 for i in range(num_frames)]
    if pattern == "burst":
        return [i % 16 < 4 for i in range(num_frames)]
    raise ValueError(f"unknown arrival pattern {pattern!r}; choose from {ARRIVAL_PATTERNS}")
