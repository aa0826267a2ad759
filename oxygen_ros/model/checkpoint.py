"""Load and save pi0.5 checkpoints: LeRobot's pi05 folders and openpi's PyTorch conversions, read strictly.

Two layouts are recognised by their tensor names:
- LeRobot: `config.json` with `"type": "pi05"`, `model.safetensors` with names under `model.` (the policy's
  attribute), norm stats in the processor files (see `norm_stats`);
- openpi's JAX -> PyTorch converter: `config.json` with `action_dim`, `action_horizon` and the Gemma variants,
  `model.safetensors` with the same names without the leading `model.`, norm stats in
  `assets/<asset_id>/norm_stats.json`. Its writer stores tied tensors once, under `...paligemma.lm_head.weight`.
Our module names differ from those only by a few prefixes, so mapping is a table of prefix pairs. Loading is strict:
a missing, unknown, mis-shaped or non-finite tensor, an unreadable file or missing norm stats is an error that names
the file and every offending key, because a silently half-loaded robot policy is worse than none. The only tensors
left unused are named in `IGNORED`: the action expert's LM head (the expert never emits tokens) and pi0's state
projection (pi0.5 has none).

The text head follows the stack that wrote the file: LeRobot keeps `lm_head` as a parameter of its own, and since
pi0.5 training has no text loss a fine-tuned checkpoint's head keeps its pretrained values while the embedding
moves; LeRobot decodes with that `lm_head`, openpi with the embedding table. `text_head="auto"` does the same (an
`lm_head` equal to the embedding, or absent, is tied: one tensor in memory); `"lm_head"` or `"embedding"` choose.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .config import GEMMA_2B, GEMMA_300M, PI05_CAMERAS, SIGLIP_SO400M_14, Pi05Config
from .norm_stats import (
    OPENPI_STATS_GLOB,
    NormStatsError,
    check_norm_stats,
    is_buffer_stat,
    lerobot_modes,
    lerobot_stats,
    normalization,
    openpi_stats,
    user_stats,
)
from .normalization import Normalization, NormStats
from .pi05 import Pi05Model

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
STATS_FILE = "policy_preprocessor_step_0_normalizer_processor.safetensors"  # what save_checkpoint writes
TEXT_HEADS = ("auto", "lm_head", "embedding")
EMBODIMENT_KEY = "oxygen_ros_embodiment"  # config.json: the embodiment profile save_checkpoint was told
LEROBOT, OPENPI = "lerobot", "openpi"
LEROBOT_PREFIX = "model."  # LeRobot's names are openpi's under the policy's `model` attribute

_PALIGEMMA = "paligemma_with_expert.paligemma."
# (our prefix, openpi's prefix), most specific first; the last pair covers the action/time heads.
PREFIXES = (
    ("vision.vision_model.", _PALIGEMMA + "model.vision_tower.vision_model."),
    ("vision.projector.", _PALIGEMMA + "model.multi_modal_projector.linear."),
    ("backbone.", _PALIGEMMA + "model.language_model."),
    ("expert.", "paligemma_with_expert.gemma_expert.model."),
    ("", ""),
)
EMBED_NAME = _PALIGEMMA + "model.language_model.embed_tokens.weight"
LM_HEAD_NAME = _PALIGEMMA + "lm_head.weight"
# Older pi0-era names for the same tensors.
ALIASES = (("action_time_mlp_in.", "time_mlp_in."), ("action_time_mlp_out.", "time_mlp_out."))
IGNORED = ("paligemma_with_expert.gemma_expert.lm_head.", "state_proj.")
_VARIANTS = {"gemma_2b": GEMMA_2B, "gemma_300m": GEMMA_300M}
log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """The checkpoint's files do not describe a loadable pi0.5 model; the message names the file and the problem."""


@dataclass(frozen=True)
class TextHead:
    """Which matrix the backbone decodes text with (`lm_head` or `embedding`) and why."""

    choice: str
    reason: str


@dataclass(frozen=True)
class TrainedOn:
    """What a checkpoint folder says about the action space it was trained in, for checking the robot's embodiment
    profile against it (`control.embodiment`); None fields say nothing.

    - `embodiment`: the profile this package trained it in (`save_checkpoint`'s `embodiment`, config.json key
      `oxygen_ros_embodiment`);
    - `openpi_config`: openpi's train config name from config.json's `config_name` (openpi's converter takes
      it but writes none), and `openpi_folders`, the names of the folder and its two parents, where openpi's
      training puts it (`checkpoints/<config>/<exp>/<step>`; `control.openpi_configs` knows the names);
    - `openpi_asset_id`: openpi's norm-stats folder `assets/<asset_id>` (`trossen`: ALOHA, `droid`: DROID);
    - `lerobot_relative`: a LeRobot folder's `use_relative_actions` (its default false: absolute actions), with
      `lerobot_exclude` (`relative_exclude_joints`) and `lerobot_action_names` (`action_feature_names`).
    """

    embodiment: str | None = None
    openpi_config: str | None = None
    openpi_folders: tuple[str, ...] = ()
    openpi_asset_id: str | None = None
    lerobot_relative: bool | None = None
    lerobot_exclude: tuple[str, ...] = ()
    lerobot_action_names: tuple[str, ...] | None = None


@dataclass
class LoadedCheckpoint:
    model: Pi05Model
    norm_stats: Normalization
    layout: str  # LEROBOT or OPENPI
    text_head: TextHead
    trained_on: TrainedOn = TrainedOn()


def to_lerobot_name(name: str) -> str:
    """LeRobot's tensor name for one of our parameter names."""
    if name == "backbone.lm_head":
        return LEROBOT_PREFIX + LM_HEAD_NAME
    for ours, theirs in PREFIXES:
        if name.startswith(ours):
            return LEROBOT_PREFIX + theirs + name[len(ours) :]
    raise AssertionError("unreachable: the last prefix pair matches every name")


def _ours(name: str) -> str:
    """Our parameter name for a tensor name in openpi's form (LeRobot's without `model.`)."""
    for old, new in ALIASES:
        if name.startswith(old):
            name = new + name[len(old) :]
    for ours, theirs in PREFIXES:
        if name.startswith(theirs):
            return ours + name[len(theirs) :]
    raise AssertionError("unreachable: the last prefix pair matches every name")


def config_from_lerobot(data: dict) -> Pi05Config:
    """Our config from a LeRobot pi05 `config.json` (named Gemma variants, So400m vision, PaliGemma vocab)."""
    fields = _Fields(data)
    resolution = data.get("image_resolution", [224, 224])
    if (not isinstance(resolution, list) or len(resolution) != 2
            or not all(_positive_int(r) for r in resolution) or resolution[0] != resolution[1]):
        raise CheckpointError(f"{CONFIG_FILE}: image_resolution must be a square [size, size], got {resolution!r}")
    features = data.get("input_features", {})
    if not isinstance(features, dict):
        raise CheckpointError(f"{CONFIG_FILE}: input_features must be an object, got {type(features).__name__}")
    prefix = "observation.images."
    cameras = tuple(k[len(prefix) :] for k in features if k.startswith(prefix))
    return Pi05Config(
        backbone=fields.variant("paligemma_variant", "gemma_2b"),
        expert=fields.variant("action_expert_variant", "gemma_300m"),
        vision=dataclasses.replace(SIGLIP_SO400M_14, image_size=resolution[0]),
        vocab_size=257_152,
        max_token_len=fields.integer("tokenizer_max_length", 200),
        action_horizon=fields.integer("chunk_size", 50),
        action_dim=fields.integer("max_action_dim", 32),
        state_dim=fields.integer("max_state_dim", 32),
        camera_names=cameras or PI05_CAMERAS,
        num_steps=fields.integer("num_inference_steps", 10),
        time_min_period=fields.number("min_period", 4e-3),
        time_max_period=fields.number("max_period", 4.0),
    )


def config_from_openpi(data: dict) -> Pi05Config:
    """Our config from the `config.json` openpi's converter writes (pi05: the state is as wide as the actions)."""
    fields = _Fields(data)
    action_dim = fields.integer("action_dim", 32)
    return Pi05Config(
        backbone=fields.variant("paligemma_variant", "gemma_2b"),
        expert=fields.variant("action_expert_variant", "gemma_300m"),
        vision=SIGLIP_SO400M_14,
        vocab_size=257_152,
        max_token_len=fields.integer("max_token_len", 200),
        action_horizon=fields.integer("action_horizon", 50),
        action_dim=action_dim,
        state_dim=action_dim,
        camera_names=PI05_CAMERAS,
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


def save_checkpoint(model: Pi05Model, path: str | Path, norm_stats: NormStats | None = None,
                    embodiment: str | None = None) -> Path:
    """Write `model` (and norm stats) as a LeRobot pi05 folder; returns the folder.

    `lm_head` is the matrix the model decodes with: its own head when untied, else a copy of the embedding (LeRobot
    keeps the two as separate tensors), so the folder loads back decoding the same way. `embodiment` names the
    profile the model was trained in (`TrainedOn`), so a node with another one refuses to start.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = _lerobot_config(model.config)
    if embodiment is not None:
        config[EMBODIMENT_KEY] = embodiment
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    tensors = {to_lerobot_name(k): v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.backbone.lm_head is None:
        tensors[LEROBOT_PREFIX + LM_HEAD_NAME] = tensors[LEROBOT_PREFIX + EMBED_NAME].clone()
    save_file(tensors, str(path / WEIGHTS_FILE))
    if norm_stats:
        flat = {
            f"{feature}.{stat}": torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
            for feature, stats in norm_stats.items()
            for stat, value in stats.items()
        }
        save_file(flat, str(path / STATS_FILE))
    return path


def checkpoint_config(path: str | Path) -> Pi05Config:
    """The model shape a checkpoint folder's `config.json` describes, read without its weights (to check what
    depends on it, the tokenizer's vocabulary say, before the slow load)."""
    return _config(_read_config(Path(path) / CONFIG_FILE))


def load_checkpoint(
    path: str | Path,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    text_head: str = "auto",
    stats_file: str | Path | None = None,
    norm_mode: str = "",
) -> LoadedCheckpoint:
    """Build the model a LeRobot or openpi pi05 folder describes and load it strictly; see the module docstring.
    `stats_file` (a user's stats, `norm_stats.user_stats`) replaces the folder's stats, `norm_mode` its modes."""
    if text_head not in TEXT_HEADS:
        raise ValueError(f"text_head must be one of {' | '.join(TEXT_HEADS)}, got {text_head!r}")
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a checkpoint folder")
    data = _read_config(path / CONFIG_FILE)
    tensors = _read_weights(path / WEIGHTS_FILE)
    layout = _layout(tensors)
    buffers = {k: v for k, v in tensors.items() if layout == LEROBOT and is_buffer_stat(k)}
    config = _config(data)
    prefix = LEROBOT_PREFIX if layout == LEROBOT else ""

    with torch.device("meta"):
        model = Pi05Model(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    weights = {k: v for k, v in tensors.items() if k not in buffers}
    embed, head = weights.get(prefix + EMBED_NAME), weights.pop(prefix + LM_HEAD_NAME, None)
    stored_once = embed is None and head is not None  # older LeRobot files, openpi's writer
    if stored_once:
        weights[prefix + EMBED_NAME], head = head, None
    state = _match_tensors(weights, expected, prefix, head)
    if stored_once:
        why = "the file stores the embedding once, as lm_head (tied)"
        chosen = TextHead("embedding", f"model.text_head is lm_head, but {why}" if text_head == "lm_head" else why)
    else:
        chosen = _choose_text_head(layout, text_head, state["backbone.embed_tokens.weight"], head, prefix)
    norm, where = _normalization(path, data, layout, buffers, config, stats_file, norm_mode)

    model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()}, strict=True, assign=True)
    if chosen.choice == "lm_head":
        model.backbone.set_text_head(head.to(device=device, dtype=dtype))
    model.vision.reset_buffers()
    log.info("%s: %s layout, text head %s (%s)", path, layout, chosen.choice, chosen.reason)
    log.info("%s: normalization %s from %s", path, norm.describe(), where)
    return LoadedCheckpoint(model=model.eval(), norm_stats=norm, layout=layout, text_head=chosen,
                            trained_on=_trained_on(data, layout, path))


def checkpoint_normalization(path: str | Path, stats_file: str | Path | None = None,
                             norm_mode: str = "") -> tuple[Normalization, str]:
    """What `load_checkpoint` would normalize with, and where the stats came from, read without the weights (only
    their names, and older LeRobot files' stats buffers); CheckpointError, one line, naming what is missing."""
    path = Path(path)
    data = _read_config(path / CONFIG_FILE)
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise CheckpointError(f"{WEIGHTS_FILE} not found in {path}")
    try:
        with safe_open(str(file), framework="pt") as weights:
            names = list(weights.keys())
            layout = _layout(dict.fromkeys(names))
            buffers = {k: weights.get_tensor(k) for k in names if layout == LEROBOT and is_buffer_stat(k)}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{WEIGHTS_FILE} is not a readable safetensors file: {err}") from None
    return _normalization(path, data, layout, buffers, _config(data), stats_file, norm_mode)


def _normalization(path: Path, data: dict, layout: str, buffers: dict, config: Pi05Config,
                   stats_file: str | Path | None, norm_mode: str) -> tuple[Normalization, str]:
    try:
        if stats_file:
            stats, where = user_stats(stats_file)
        else:
            stats, where = openpi_stats(path) if layout == OPENPI else lerobot_stats(path, buffers)
        modes, eps = lerobot_modes(path, data) if layout == LEROBOT else (None, None)
        norm = normalization(stats, layout, modes, eps, norm_mode)
        check_norm_stats(norm, config, where)
    except NormStatsError as err:
        raise CheckpointError(str(err)) from None
    return norm, where


def _trained_on(data: dict, layout: str, folder: Path) -> TrainedOn:
    """`TrainedOn` from config.json and, for openpi, the folder's `assets/<asset_id>/` (its norm stats' folder;
    none when the folder has no single norm_stats.json, as after openpi's converter)."""
    ours = data.get(EMBODIMENT_KEY)
    if ours is not None:
        if not isinstance(ours, str) or not ours:
            raise CheckpointError(f"{CONFIG_FILE}: {EMBODIMENT_KEY} must be a profile name, got {ours!r}")
        return TrainedOn(embodiment=ours)
    if layout == OPENPI:
        files = sorted(folder.glob(OPENPI_STATS_GLOB))
        asset = files[0].parent.relative_to(folder / "assets").as_posix() if len(files) == 1 else None
        folders = tuple(p.name for p in (folder.resolve(), *list(folder.resolve().parents)[:2]))
        return TrainedOn(openpi_config=_openpi_config(data), openpi_folders=folders, openpi_asset_id=asset)
    relative, exclude = data.get("use_relative_actions", False), data.get("relative_exclude_joints", ["gripper"])
    names = data.get("action_feature_names")
    if not isinstance(relative, bool) or not _strings(exclude) or not (names is None or _strings(names)):
        raise CheckpointError(f"{CONFIG_FILE}: use_relative_actions must be a bool, relative_exclude_joints and "
                              f"action_feature_names lists of names, got {relative!r}, {exclude!r}, {names!r}")
    return TrainedOn(lerobot_relative=relative, lerobot_exclude=tuple(exclude),
                     lerobot_action_names=None if names is None else tuple(names))


def _openpi_config(data: dict) -> str | None:
    named = data.get("config_name")
    if named is not None and (not isinstance(named, str) or not named):
        raise CheckpointError(f"{CONFIG_FILE}: config_name must be openpi's train config name, got {named!r}")
    return named


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _choose_text_head(layout: str, wanted: str, embed: torch.Tensor, head: torch.Tensor | None,
                      prefix: str) -> TextHead:
    if head is None:
        if wanted == "lm_head":
            raise CheckpointError(f"model.text_head is lm_head but {WEIGHTS_FILE} has no {prefix + LM_HEAD_NAME}")
        return TextHead("embedding", "the file has no lm_head")
    if torch.equal(head, embed):
        return TextHead("embedding", "lm_head equals the embedding (tied)")
    if wanted == "lm_head" or (wanted == "auto" and layout == LEROBOT):
        why = "model.text_head is lm_head" if wanted == "lm_head" else "LeRobot decodes with its own lm_head"
        return TextHead("lm_head", f"{why}; it differs from the embedding")
    why = "model.text_head is embedding" if wanted == "embedding" else "openpi decodes with the embedding"
    return TextHead("embedding", f"{why}; the file's lm_head differs from it and is not used")


def _read_config(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{CONFIG_FILE} not found in {file.parent}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{CONFIG_FILE} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{CONFIG_FILE} holds a JSON {type(data).__name__}, not a policy config object")
    return data


def _config(data: dict) -> Pi05Config:
    """Our config from a LeRobot config (`"type": "pi05"`) or openpi's converter config (no type). Either may carry
    our own full shape description under `oxygen_ros` (written by `save_checkpoint`, for non-standard sizes)."""
    if "type" in data and data["type"] != "pi05":
        raise CheckpointError(f"{CONFIG_FILE} describes policy type {data['type']!r}, not pi05")
    if "oxygen_ros" in data:
        try:
            return Pi05Config.from_dict(data["oxygen_ros"])
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            raise CheckpointError(f"{CONFIG_FILE}: the oxygen_ros shape description is invalid: {err!r}") from None
    if "type" in data:
        return config_from_lerobot(data)
    if {"action_dim", "action_horizon", "paligemma_variant"} & set(data):
        return config_from_openpi(data)
    raise CheckpointError(f"{CONFIG_FILE} is neither a LeRobot pi05 config (\"type\": \"pi05\") nor openpi's "
                          f"(action_dim, action_horizon, paligemma_variant); its keys: {sorted(data)[:10]}")


class _Fields:
    """Typed reads of config.json fields with defaults; a wrong type is a CheckpointError naming the field."""

    def __init__(self, data: dict):
        self.data = data

    def integer(self, name: str, default: int) -> int:
        value = self.data.get(name, default)
        if not _positive_int(value):
            raise CheckpointError(f"{CONFIG_FILE}: {name} must be a positive integer, got {value!r}")
        return value

    def number(self, name: str, default: float) -> float:
        value = self.data.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise CheckpointError(f"{CONFIG_FILE}: {name} must be a positive number, got {value!r}")
        return float(value)

    def variant(self, name: str, default: str):
        value = self.data.get(name, default)
        if not isinstance(value, str) or value not in _VARIANTS:
            raise CheckpointError(f"{CONFIG_FILE}: unknown Gemma variant {value!r} for {name}; "
                                  f"known: {', '.join(_VARIANTS)}")
        return _VARIANTS[value]


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise CheckpointError(f"{WEIGHTS_FILE} not found in {file.parent}")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as err:
        size = file.stat().st_size
        raise CheckpointError(f"{WEIGHTS_FILE} ({size} bytes) is not a readable safetensors file, truncated or "
                              f"corrupt: {err}") from None


def _layout(tensors: dict[str, torch.Tensor]) -> str:
    if any(k.startswith(LEROBOT_PREFIX + "paligemma_with_expert.") for k in tensors):
        return LEROBOT
    if any(k.startswith("paligemma_with_expert.") for k in tensors):
        return OPENPI
    raise CheckpointError(f"{WEIGHTS_FILE} holds no pi05 tensors (neither LeRobot's model.paligemma_with_expert.* "
                          f"nor openpi's paligemma_with_expert.* names; {len(tensors)} tensors)")


def _match_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple], prefix: str,
                   head: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The file's weights (names under `prefix`) as our state dict, checked to cover `expected` exactly with finite
    values, the separate text head included; raises listing every problem by the file's names."""
    state, file_names, unexpected, wrong_shape = {}, {}, [], []
    for name, tensor in tensors.items():
        canonical = name[len(prefix) :] if name.startswith(prefix) else None
        if canonical is not None and canonical.startswith(IGNORED):
            continue
        ours = None if canonical is None else _ours(canonical)
        if ours not in expected:
            unexpected.append(name)
            continue
        file_names[ours] = name
        if tuple(tensor.shape) != expected[ours]:
            wrong_shape.append(f"{name} (file {tuple(tensor.shape)}, model {expected[ours]})")
        else:
            state[ours] = tensor
    embed_shape = expected["backbone.embed_tokens.weight"]
    if head is not None and tuple(head.shape) != embed_shape:
        wrong_shape.append(f"{prefix + LM_HEAD_NAME} (file {tuple(head.shape)}, model {embed_shape})")
    missing = [prefix + to_lerobot_name(k).removeprefix(LEROBOT_PREFIX) for k in expected if k not in file_names]
    _raise_if("does not match the model", ("missing", missing), ("unexpected", unexpected),
              ("wrong shape", wrong_shape))
    non_finite = [file_names[k] for k, v in state.items() if not bool(torch.isfinite(v).all())]
    if head is not None and not bool(torch.isfinite(head).all()):
        non_finite.append(prefix + LM_HEAD_NAME)
    _raise_if("holds NaN or infinite values", ("tensors", non_finite))
    return state


def _raise_if(problem: str, *groups: tuple[str, list[str]], shown: int = 8) -> None:
    problems = []
    for label, names in groups:
        if names:
            names = sorted(names)
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            problems.append(f"{label} ({len(names)}): " + ", ".join(names[:shown]) + more)
    if problems:
        raise CheckpointError(f"{WEIGHTS_FILE} {problem}: " + "; ".join(problems))
