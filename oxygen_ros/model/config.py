"""Shapes of a pi0.5-style model as frozen dataclasses, the named presets, and JSON load/save.

Every other module reads its sizes from here so that the real pi05 model, a CPU-sized benchmark model and the
tiny test model run through exactly the same code.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

# PaliGemma's SentencePiece ids; the random-init presets train their tokenizer with the same ids.
PAD_ID = 0
EOS_ID = 1
BOS_ID = 2


@dataclass(frozen=True)
class GemmaConfig:
    """One Gemma transformer stack (the VLM backbone or the action expert)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-6


@dataclass(frozen=True)
class VisionConfig:
    """A SigLIP vision tower without pooling head: one token per image patch."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int
    image_size: int
    layer_norm_eps: float = 1e-6

    @property
    def num_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def resized_shape(height: int, width: int, size: int) -> tuple[int, int]:
    """(height, width) of an image inside the size x size model input, aspect ratio kept (0 when too thin). Here,
    apart from the resizing itself (`preprocess.py`), so that a node can check an image's size without torch."""
    ratio = max(height / size, width / size)
    return int(height / ratio), int(width / ratio)


@dataclass(frozen=True)
class Pi05Config:
    """The whole Mixture-of-Transformers model plus the prompt and action shapes it was trained with."""

    backbone: GemmaConfig
    expert: GemmaConfig
    vision: VisionConfig
    vocab_size: int
    max_token_len: int
    action_horizon: int
    action_dim: int
    state_dim: int
    camera_names: tuple[str, ...]
    num_steps: int = 10
    # camera name -> (top, left, bottom, right): the part of the image the model sees, as fractions of the image
    # padded to a square (centred, as `preprocess.resize_with_pad` pads), so a robot that sent its image already
    # resized with padding to any square size sends the same part; a camera not named is seen whole
    image_crops: tuple[tuple[str, tuple[float, float, float, float]], ...] = ()
    rope_theta: float = 10_000.0
    time_min_period: float = 4e-3
    time_max_period: float = 4.0
    pad_id: int = PAD_ID
    eos_id: int = EOS_ID
    bos_id: int = BOS_ID

    def __post_init__(self) -> None:
        # Joint attention concatenates both experts' Q/K/V along the sequence, and the expert reads the
        # backbone's K/V of the same layer: the attention geometry of the two stacks must be identical.
        b, e = self.backbone, self.expert
        for name in ("depth", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(b, name) != getattr(e, name):
                raise ValueError(
                    f"backbone and expert must share {name}: {getattr(b, name)} != {getattr(e, name)}"
                )
        if b.num_heads % b.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if b.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        if e.width % 2:
            raise ValueError("expert width must be even for the sin-cos time embedding")
        if self.vision.image_size % self.vision.patch_size:
            raise ValueError("image_size must be a multiple of patch_size")
        if not self.camera_names:
            raise ValueError("at least one camera is required")
        for name, box in self.image_crops:
            if name not in self.camera_names:
                raise ValueError(f"image_crops names camera {name!r}, not one of {list(self.camera_names)}")
            if len(box) != 4:
                raise ValueError(f"image_crops[{name!r}] = {list(box)}: need four numbers, top, left, bottom, right")
            top, left, bottom, right = box
            if not (0.0 <= top < bottom <= 1.0 and 0.0 <= left < right <= 1.0):
                raise ValueError(f"image_crops[{name!r}] = {list(box)}: need 0 <= top < bottom <= 1 and "
                                 f"0 <= left < right <= 1")

    def image_crop(self, name: str) -> tuple[float, float, float, float] | None:
        """The part of camera `name`'s image the model sees (`image_crops`), or None: all of it."""
        return dict(self.image_crops).get(name)

    @property
    def num_cameras(self) -> int:
        return len(self.camera_names)

    @property
    def tokens_per_image(self) -> int:
        return self.vision.num_tokens

    @property
    def prefix_len(self) -> int:
        """Cache positions one frame's prefix occupies: all camera tokens, then the padded prompt."""
        return self.num_cameras * self.tokens_per_image + self.max_token_len

    def replace(self, **changes) -> Pi05Config:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["camera_names"] = list(self.camera_names)
        data["image_crops"] = {name: list(box) for name, box in self.image_crops}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Pi05Config:
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown Pi05Config fields: {unknown}")
        data["backbone"] = GemmaConfig(**data["backbone"])
        data["expert"] = GemmaConfig(**data["expert"])
        data["vision"] = VisionConfig(**data["vision"])
        data["camera_names"] = tuple(data["camera_names"])
        data["image_crops"] = tuple((name, tuple(float(v) for v in box))
                                    for name, box in dict(data.get("image_crops") or {}).items())
        return cls(**data)

    def save_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load_json(cls, path: str | Path) -> Pi05Config:
        return cls.from_dict(json.loads(Path(path).read_text()))


PI05_CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")

GEMMA_2B = GemmaConfig(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256)
GEMMA_300M = GemmaConfig(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256)
SIGLIP_SO400M_14 = VisionConfig(
    width=1152, depth=27, mlp_dim=4304, num_heads=16, patch_size=14, image_size=224
)

PRESETS: dict[str, Pi05Config] = {
    # The released pi0.5 shape (LeRobot `pi05`, openpi `pi05_*`).
    "pi05": Pi05Config(
        backbone=GEMMA_2B,
        expert=GEMMA_300M,
        vision=SIGLIP_SO400M_14,
        vocab_size=257_152,
        max_token_len=200,
        action_horizon=50,
        action_dim=32,
        state_dim=32,
        camera_names=PI05_CAMERAS,
    ),
    # A few million parameters: big enough for CPU timings to mean something, small enough to run on a laptop.
    "small": Pi05Config(
        backbone=GemmaConfig(width=256, depth=6, mlp_dim=1024, num_heads=4, num_kv_heads=1, head_dim=64),
        expert=GemmaConfig(width=128, depth=6, mlp_dim=512, num_heads=4, num_kv_heads=1, head_dim=64),
        vision=VisionConfig(width=128, depth=4, mlp_dim=512, num_heads=4, patch_size=14, image_size=112),
        vocab_size=1024,
        max_token_len=64,
        action_horizon=50,
        action_dim=32,
        state_dim=16,  # room for a 14-joint ALOHA state
        camera_names=PI05_CAMERAS,
    ),
    # Tiny stacks under pi0.5's real 257,152-token vocabulary and three 224 px cameras: the text head dominates a
    # decode step as it does for the released model, yet a frame runs in tens of milliseconds on two CPU cores.
    "fullvocab": Pi05Config(
        backbone=GemmaConfig(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
        expert=GemmaConfig(width=64, depth=4, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
        vision=VisionConfig(width=128, depth=2, mlp_dim=512, num_heads=4, patch_size=14, image_size=224),
        vocab_size=257_152,
        max_token_len=100,
        action_horizon=10,
        action_dim=32,
        state_dim=32,
        camera_names=PI05_CAMERAS,
    ),
    # A policy for gym-aloha's transfer_cube trained on a shared 2-core CPU (`oxygen-ros train-tiny --preset sim`):
    # the top camera only, 96 px in 8-px patches (a 96x128 view as 12x9 patches, the cube a few pixels of one),
    # a vision tower twice tiny's width and depth, and 50-step chunks (1 s at 50 Hz, pi0.5's and ACT's span) so a
    # chunk outlasts a late hand-over. Its cost and why: docs/sim.md.
    "sim": Pi05Config(
        backbone=GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16),
        expert=GemmaConfig(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16),
        vision=VisionConfig(width=64, depth=2, mlp_dim=128, num_heads=2, patch_size=8, image_size=96),
        vocab_size=1024,
        max_token_len=64,
        action_horizon=50,
        action_dim=16,
        state_dim=16,  # the 14 ALOHA joints
        camera_names=PI05_CAMERAS[:1],
        num_steps=10,
    ),
    # For tests: every code path, well under a second per call.
    "tiny": Pi05Config(
        backbone=GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16),
        expert=GemmaConfig(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16),
        vision=VisionConfig(width=32, depth=1, mlp_dim=64, num_heads=2, patch_size=14, image_size=56),
        vocab_size=1024,
        max_token_len=64,
        action_horizon=8,
        action_dim=16,
        state_dim=16,  # room for a 14-joint ALOHA state (and its prompt)
        camera_names=PI05_CAMERAS[:2],
        num_steps=4,
    ),
}


def get_preset(name: str) -> Pi05Config:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
