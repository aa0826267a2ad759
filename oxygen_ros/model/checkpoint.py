"""Load and save pi0.5 checkpoints in LeRobot's folder layout and tensor names.

A folder holds `config.json`, `model.safetensors` and the normalisation stats (`policy_*processor*.safetensors`,
tensors named `<feature>.<stat>`). Our module names differ from LeRobot's only by a few prefixes, so mapping is a
table of prefix pairs. Loading is strict: a missing, unknown or mis-shaped tensor is an error that names every
offending key, because a silently half-loaded robot policy is worse than none.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from .config import GEMMA_2B, GEMMA_300M, PI05_CAMERAS, SIGLIP_SO400M_14, Pi05Config
from .pi05 import Pi05Model
from .preprocess import NormStats

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
STATS_FILE = "policy_preprocessor_step_0_normalizer_processor.safetensors"  # stats only, no pipeline JSON
STATS_GLOB = "policy_*processor*.safetensors"

_PALIGEMMA = "model.paligemma_with_expert.paligemma."
# (our prefix, LeRobot prefix), most specific first; the last pair covers the action/time heads.
PREFIXES = (
    ("vision.vision_model.", _PALIGEMMA + "model.vision_tower.vision_model."),
    ("vision.projector.", _PALIGEMMA + "model.multi_modal_projector.linear."),
    ("backbone.", _PALIGEMMA + "model.language_model."),
    ("expert.", "model.paligemma_with_expert.gemma_expert.model."),
    ("", "model."),
)
EMBED_KEY = _PALIGEMMA + "model.language_model.embed_tokens.weight"
LM_HEAD_KEY = _PALIGEMMA + "lm_head.weight"  # tied to the embedding
# Older pi0-era names for the same tensors.
ALIASES = (
    ("model.action_time_mlp_in.", "model.time_mlp_in."),
    ("model.action_time_mlp_out.", "model.time_mlp_out."),
)
# Present in real files, unused by pi0.5 inference: the expert never emits tokens; pi0.5 has no state projection.
IGNORED_PREFIXES = ("model.paligemma_with_expert.gemma_expert.lm_head.", "model.state_proj.")
_VARIANTS = {"gemma_2b": GEMMA_2B, "gemma_300m": GEMMA_300M}


class CheckpointError(ValueError):
    """The checkpoint's tensors do not match the model its config describes."""


@dataclass
class LoadedCheckpoint:
    model: Pi05Model
    norm_stats: NormStats


def to_lerobot_name(name: str) -> str:
    for ours, theirs in PREFIXES:
        if name.startswith(ours):
            return theirs + name[len(ours) :]
    raise AssertionError("unreachable: the last prefix pair matches every name")


def from_lerobot_name(name: str) -> str | None:
    """Our parameter name for a LeRobot tensor name, or None when the name is outside our layout."""
    for old, new in ALIASES:
        if name.startswith(old):
            name = new + name[len(old) :]
    for ours, theirs in PREFIXES:
        if name.startswith(theirs):
            return ours + name[len(theirs) :]
    return None


def config_from_lerobot(data: dict) -> Pi05Config:
    """Our config from a LeRobot pi05 `config.json` (named Gemma variants, So400m vision, PaliGemma vocab)."""
    try:
        backbone = _VARIANTS[data.get("paligemma_variant", "gemma_2b")]
        expert = _VARIANTS[data.get("action_expert_variant", "gemma_300m")]
    except KeyError as err:
        raise CheckpointError(f"unknown Gemma variant {err} in {CONFIG_FILE}") from None
    resolution = data.get("image_resolution", [224, 224])
    if resolution[0] != resolution[1]:
        raise CheckpointError(f"pi05 needs square images, config has {resolution}")
    prefix = "observation.images."
    cameras = tuple(k[len(prefix) :] for k in data.get("input_features", {}) if k.startswith(prefix))
    return Pi05Config(
        backbone=backbone,
        expert=expert,
        vision=dataclasses.replace(SIGLIP_SO400M_14, image_size=resolution[0]),
        vocab_size=257_152,
        max_token_len=data.get("tokenizer_max_length", 200),
        action_horizon=data.get("chunk_size", 50),
        action_dim=data.get("max_action_dim", 32),
        state_dim=data.get("max_state_dim", 32),
        camera_names=cameras or PI05_CAMERAS,
        num_steps=data.get("num_inference_steps", 10),
        time_min_period=data.get("min_period", 4e-3),
        time_max_period=data.get("max_period", 4.0),
    )


def _lerobot_config(config: Pi05Config) -> dict:
    variant = {v: k for k, v in _VARIANTS.items()}
    return {
        "type": "pi05",
        "paligemma_variant": variant.get(config.backbone, "custom"),
        "action_expert_variant": variant.get(config.expert, "custom"),
        "chunk_size": config.action_horizon,
        "n_action_steps": config.action_horizon,
        "max_state_dim": config.state_dim,
        "max_action_dim": config.action_dim,
        "num_inference_steps": config.num_steps,
        "image_resolution": [config.vision.image_size, config.vision.image_size],
        "tokenizer_max_length": config.max_token_len,
        "min_period": config.time_min_period,
        "max_period": config.time_max_period,
        "input_features": {f"observation.images.{name}": {"type": "VISUAL"} for name in config.camera_names},
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"},
        # Our full shape description, so non-standard (random-init) sizes round-trip exactly.
        "oxygen_ros": config.to_dict(),
    }


def save_checkpoint(model: Pi05Model, path: str | Path, norm_stats: NormStats | None = None) -> Path:
    """Write `model` (and norm stats) as a LeRobot pi05 folder; returns the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps(_lerobot_config(model.config), indent=2) + "\n")
    tensors = {to_lerobot_name(k): v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors[LM_HEAD_KEY] = tensors[EMBED_KEY].clone()
    save_file(tensors, str(path / WEIGHTS_FILE))
    if norm_stats:
        flat = {
            f"{feature}.{stat}": torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
            for feature, stats in norm_stats.items()
            for stat, value in stats.items()
        }
        save_file(flat, str(path / STATS_FILE))
    return path


def load_checkpoint(
    path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> LoadedCheckpoint:
    """Build the model a LeRobot pi05 folder describes and load its weights strictly; see module docstring."""
    path = Path(path)
    data = json.loads((path / CONFIG_FILE).read_text())
    if data.get("type") != "pi05":
        raise CheckpointError(f"{CONFIG_FILE} describes a {data.get('type')!r} policy, not pi05")
    config = Pi05Config.from_dict(data["oxygen_ros"]) if "oxygen_ros" in data else config_from_lerobot(data)

    with torch.device("meta"):
        model = Pi05Model(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = _match_tensors(load_file(str(path / WEIGHTS_FILE)), expected)
    model.load_state_dict(
        {k: v.to(device=device, dtype=dtype) for k, v in state.items()}, strict=True, assign=True
    )
    model.vision.reset_buffers()
    return LoadedCheckpoint(model=model.eval(), norm_stats=load_norm_stats(path))


def _match_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """Rename a LeRobot state dict to ours, checking it covers `expected` exactly; raises listing all problems."""
    tensors = dict(tensors)
    if EMBED_KEY not in tensors and LM_HEAD_KEY in tensors:
        tensors[EMBED_KEY] = tensors[LM_HEAD_KEY]
    tensors.pop(LM_HEAD_KEY, None)
    state, seen, unexpected, wrong_shape = {}, set(), [], []
    for name, tensor in tensors.items():
        if name.startswith(IGNORED_PREFIXES):
            continue
        ours = from_lerobot_name(name)
        if ours not in expected:
            unexpected.append(name)
            continue
        seen.add(ours)
        if tuple(tensor.shape) != expected[ours]:
            wrong_shape.append(f"{name} (file {tuple(tensor.shape)}, model {expected[ours]})")
        else:
            state[ours] = tensor
    missing = [to_lerobot_name(k) for k in expected if k not in seen]
    problems = [
        f"{label} ({len(keys)}): " + ", ".join(sorted(keys))
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape))
        if keys
    ]
    if problems:
        raise CheckpointError("checkpoint does not match the model: " + "; ".join(problems))
    return state


def load_norm_stats(path: str | Path) -> NormStats:
    """Normalisation stats from every `policy_*processor*.safetensors` in the folder ({} if there are none)."""
    stats: NormStats = {}
    for file in sorted(Path(path).glob(STATS_GLOB)):
        for key, value in load_file(str(file)).items():
            feature, _, stat = key.rpartition(".")
            stats.setdefault(feature, {})[stat] = value.float().numpy()
    return stats
