"""Load what a node serves from a model source: the model, its norm stats, and the tokenizer for its text.

A source is a preset name (random weights from `seed`), a model config JSON (random weights too), a pi05
checkpoint folder (its weights and norm stats) or a hub id naming one (`hub.py`: its cached snapshot). A
random-init model with no tokenizer file gets the deterministic stand-in SentencePiece model, trained once into the
user cache (`user_cache.py`) and reused. A checkpoint needs the tokenizer it was trained with, found in this order
(`checkpoint_tokenizer`): the one the user names (a file, a folder holding one, or a hub id); the one the checkpoint
folder carries (train-tiny's `tokenizer.model`, LeRobot's saved `tokenizer/`); the tokenizer repo the checkpoint's
LeRobot preprocessor names; and, for PaliGemma's vocabulary, the repo LeRobot's pi05 processor loads
(`PALIGEMMA_TOKENIZER`). It must have exactly the checkpoint's vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch

from .checkpoint import WEIGHTS_FILE, TextHead, TrainedOn, load_checkpoint
from .config import PRESETS, Pi05Config
from .hub import HubError, parse_hub_id, snapshot
from .norm_stats import PIPELINE_FILES, pipeline_steps
from .normalization import Normalization
from .pi05 import Pi05Model, build_model
from .tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from .user_cache import cached_file

# lerobot/policies/pi05/processor_pi05.py (TokenizerProcessorStep(tokenizer_name=...)): the repo whose tokenizer
# LeRobot's pi05 loads with transformers' AutoTokenizer. Gated on the hub: its terms must be accepted once.
PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"
PALIGEMMA_VOCAB = 257_152
# A tokenizer file in a folder, in order of preference, at its top or in LeRobot's saved `tokenizer/` artifact.
TOKENIZER_FILES = ("tokenizer.model", "paligemma_tokenizer.model", "tokenizer.json")
TOKENIZER_DIRS = ("", "tokenizer")
# What a checkpoint repo download takes: config, weights, LeRobot's processor files (norm stats, tokenizer name),
# openpi's norm stats, and a tokenizer the repo carries; never optimizer states or training logs.
CHECKPOINT_FILES = ("config.json", WEIGHTS_FILE, "policy_*.json", "policy_*.safetensors", "assets/*norm_stats.json",
                    *(f"{d}/{f}".lstrip("/") for d in TOKENIZER_DIRS for f in TOKENIZER_FILES))


@dataclass
class LoadedModel:
    model: Pi05Model
    norm_stats: Normalization | None  # None for random weights
    description: str  # "preset tiny", "config <file>" or "checkpoint <dir> (...)", for logs
    text_head: TextHead | None = None  # a checkpoint's choice of text head
    trained_on: TrainedOn | None = None  # what a checkpoint says about its action space


def checkpoint_folder(source: str) -> Path:
    """The checkpoint folder `source` names: a folder, or the cached snapshot of a hub id (fetched when the hub can
    be reached). ValueError (`HubError` from the hub), one line, for anything else, a snapshot that cannot be had,
    or a repo without `model.safetensors`."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    hub_id = parse_hub_id(source)
    if hub_id is None:
        raise ValueError(f"{source!r} is neither a checkpoint folder nor a hub repo id (org/name or "
                       f"org/name@revision)")
    try:
        folder = snapshot(hub_id, CHECKPOINT_FILES)
    except HubError as err:
        raise HubError(f"{source!r} is not a folder; as a hub id: {err}") from None
    if not (folder / WEIGHTS_FILE).is_file():
        raise HubError(f"{hub_id} has no {WEIGHTS_FILE} (snapshot {folder}): not a pi05 PyTorch checkpoint (LeRobot's "
                       f"layout or openpi's converted one)")
    return folder


def load_model_source(source: str, device: torch.device | str, dtype: torch.dtype, seed: int = 0,
                      text_head: str = "auto", stats_file: str = "", norm_mode: str = "") -> LoadedModel:
    """The model a source names; raises ValueError for a source that is none of the four kinds (a checkpoint
    that cannot be loaded raises `CheckpointError`, OSError or RuntimeError). `stats_file` and `norm_mode` (a
    checkpoint's only; ValueError with a preset or config) replace its stats and modes (`load_checkpoint`)."""
    if (stats_file or norm_mode) and (source in PRESETS or Path(source).is_file()):
        raise ValueError(f"norm stats and a normalization mode apply to a checkpoint, and {source!r} is a random-init "
                         f"model (it normalizes nothing)")
    if source in PRESETS:
        return LoadedModel(build_model(PRESETS[source], device, dtype, seed), None, f"preset {source}")
    path = Path(source)
    if path.is_file():
        return LoadedModel(build_model(Pi05Config.load_json(path), device, dtype, seed), None, f"config {path}")
    folder = checkpoint_folder(source)
    loaded = load_checkpoint(folder, device, dtype, text_head=text_head, stats_file=stats_file or None,
                             norm_mode=norm_mode)
    head = loaded.text_head
    where = str(folder) if folder == path else f"{source} ({folder})"
    return LoadedModel(loaded.model, loaded.norm_stats,
                       f"checkpoint {where} ({loaded.layout} layout; text head {head.choice}: {head.reason})", head,
                       loaded.trained_on)


def standin_tokenizer(vocab_size: int) -> Tokenizer:
    """The stand-in tokenizer for random-init models, trained on first use and cached."""
    path = cached_file(f"standin_tokenizer_{vocab_size}.model", lambda tmp: train_tokenizer(tmp, vocab_size))
    return load_tokenizer(path)


def tokenizer_for(model: Pi05Model, path: str | Path | None) -> Tokenizer:
    """The tokenizer `path` names (a file, a folder holding one, or a hub id), or the cached stand-in (random-init
    models only); ValueError if it does not fit the model's vocabulary (OSError / RuntimeError if the file cannot
    be read)."""
    tokenizer = load_tokenizer(tokenizer_file(str(path))) if path else standin_tokenizer(model.config.vocab_size)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model's vocabulary only "
                         f"{model.config.vocab_size}")
    return tokenizer


def checkpoint_tokenizer(checkpoint: Path, vocab_size: int, setting: str = "") -> tuple[Tokenizer, str]:
    """The tokenizer of a checkpoint folder, found in the module docstring's order, and a line saying where from;
    ValueError (one line) when none is found or its vocabulary is not exactly `vocab_size`."""
    file = tokenizer_file(setting) if setting else _checkpoint_tokenizer_file(checkpoint, vocab_size)
    tokenizer = load_tokenizer(file)
    if tokenizer.vocab_size != vocab_size:
        raise ValueError(f"the tokenizer {file} has {tokenizer.vocab_size} tokens, the checkpoint's vocabulary "
                         f"{vocab_size}: it is not the tokenizer the checkpoint was trained with")
    return tokenizer, str(file)


def tokenizer_file(source: str) -> Path:
    """The tokenizer file `source` names: a file, a folder holding one (`TOKENIZER_FILES`), or a hub id (its
    cached snapshot, fetched when the hub can be reached); ValueError (one line) otherwise."""
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return _file_in(path) or _no_file(path)
    hub_id = parse_hub_id(source)
    if hub_id is None:
        raise ValueError(f"{source!r} is neither a tokenizer file or folder nor a hub repo id (org/name or "
                         f"org/name@revision)")
    folder = snapshot(hub_id, TOKENIZER_FILES)
    return _file_in(folder) or _no_file(folder, f"{hub_id}'s snapshot ")


def _checkpoint_tokenizer_file(checkpoint: Path, vocab_size: int) -> Path:
    if file := _file_in(checkpoint):
        return file
    named = [step["config"]["tokenizer_name"] for pipeline in PIPELINE_FILES
             for step in pipeline_steps(checkpoint, pipeline)
             if isinstance(step.get("config"), dict) and isinstance(step["config"].get("tokenizer_name"), str)]
    if named:  # a path inside the folder (LeRobot's saved artifact) or a hub id
        inside = checkpoint / named[0]
        return tokenizer_file(str(inside) if inside.exists() else named[0])
    if vocab_size == PALIGEMMA_VOCAB:
        return tokenizer_file(PALIGEMMA_TOKENIZER)
    raise ValueError(f"the checkpoint {checkpoint} carries no tokenizer ({', '.join(TOKENIZER_FILES)}) and names none, "
                     f"and its vocabulary ({vocab_size} tokens) is not PaliGemma's: set model.tokenizer")


def _file_in(folder: Path) -> Path | None:
    for sub in TOKENIZER_DIRS:
        for name in TOKENIZER_FILES:
            if (folder / sub / name).is_file():
                return folder / sub / name
    return None


def _no_file(folder: Path, what: str = "") -> NoReturn:
    raise ValueError(f"{what}{folder} holds no tokenizer file ({', '.join(TOKENIZER_FILES)}, at its top or in "
                     f"tokenizer/)")


def build_on_device(config: Pi05Config, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> Pi05Model:
    """A randomly initialised model made on `device` itself, then cast to `dtype` there: on a GPU the initialisers
    run on the GPU (pi05's 3.35 B parameters never pass through host memory, where `build_model` makes them in
    float32 on the CPU first). The same seed gives the same weights on the same kind of device; a GPU's generator is
    not the CPU's, so they are not `build_model`'s weights."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    forked = [device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked, device_type=device.type if forked else "cuda"):
        torch.manual_seed(seed)
        with device:
            model = Pi05Model(config)
    return model.to(dtype=dtype).eval()
