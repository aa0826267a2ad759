"""SigLIP image encoder plus the linear projector into the backbone's width.

The tower is Hugging Face's `SiglipVisionModel`, held as `vision_model`, so its parameter names
(`vision_model.encoder.layers.N...`) are those under `vision_tower.` in a PaliGemma / LeRobot pi05 checkpoint.
No pooling head: pi0.5 keeps one token per patch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import SiglipVisionConfig, SiglipVisionModel

from .config import VisionConfig


def _hf_config(cfg: VisionConfig) -> SiglipVisionConfig:
    return SiglipVisionConfig(
        hidden_size=cfg.width,
        intermediate_size=cfg.mlp_dim,
        num_hidden_layers=cfg.depth,
        num_attention_heads=cfg.num_heads,
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=cfg.layer_norm_eps,
        vision_use_head=False,
        attn_implementation="sdpa",
    )


class VisionEncoder(nn.Module):
    """Images [N, 3, H, W] in [-1, 1] -> image tokens [N, num_patches, out_width]."""

    def __init__(self, cfg: VisionConfig, out_width: int):
        super().__init__()
        self.vision_model = SiglipVisionModel(_hf_config(cfg))
        self.projector = nn.Linear(cfg.width, out_width)

    def forward(self, images: Tensor) -> Tensor:
        hidden = self.vision_model(pixel_values=images).last_hidden_state
        return self.projector(hidden)

    def reset_buffers(self) -> None:
        """Recreate the tower's non-persistent position ids, which a meta-device build leaves without data."""
        embeddings = self.vision_model.embeddings
        device = embeddings.position_embedding.weight.device
        embeddings.position_ids = torch.arange(embeddings.num_positions, device=device).expand((1, -1))
