"""The tensors one prefill consumes, produced by `preprocess.py` and read by `Pi05Model.prefill`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class ModelInputs:
    """A batch of observations in model space.

    images [B, n_cams, 3, H, W] in [-1, 1]; image_masks [B, n_cams] bool (False = camera missing);
    tokens [B, L] long, the prompt right-padded to `max_token_len`; token_masks [B, L] bool.
    """

    images: Tensor
    image_masks: Tensor
    tokens: Tensor
    token_masks: Tensor

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> ModelInputs:
        """Move to `device`; only the images take `dtype` (masks and token ids keep theirs)."""
        return ModelInputs(
            images=self.images.to(device=device, dtype=dtype or self.images.dtype),
            image_masks=self.image_masks.to(device),
            tokens=self.tokens.to(device),
            token_masks=self.token_masks.to(device),
        )
