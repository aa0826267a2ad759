"""Load what a node serves from a model source: the model, its norm stats, and the tokenizer for its text.

A source is a preset name (random weights from `seed`), a model config JSON (random weights too) or a pi05
checkpoint folder (its weights and norm stats). A random-init model with no tokenizer file gets the deterministic
stand-in SentencePiece model, trained once into the user cache (`user_cache.py`) and reused. A checkpoint needs
the tokenizer it was trained with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import TextHead, TrainedOn, load_checkpoint
from .config import PRESETS, Pi05Config
from .pi05 import Pi05Model, build_model
from .preprocess import NormStats
from .tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from .user_cache import cached_file


@dataclass
class LoadedModel:
    model: Pi05Model
    norm_stats: NormStats | None  # None for random weights
    description: str  # "preset tiny", "config <file>" or "checkpoint <dir> (...)", for logs
    text_head: TextHead | None = None  # a checkpoint's choice of text head
    trained_on: TrainedOn | None = None  # what a checkpoint says about its action space


def is_checkpoint(source: str) -> bool:
    return source not in PRESETS and Path(source).is_dir()


def load_model_source(source: str, device: torch.device | str, dtype: torch.dtype, seed: int = 0,
                      text_head: str = "auto") -> LoadedModel:
    """The model a source names; raises ValueError for a source that is none of the three kinds (a checkpoint
    that cannot be loaded raises `CheckpointError`, OSError or RuntimeError)."""
    if source in PRESETS:
        return LoadedModel(build_model(PRESETS[source], device, dtype, seed), None, f"preset {source}")
    path = Path(source)
    if path.is_file():
        return LoadedModel(build_model(Pi05Config.load_json(path), device, dtype, seed), None, f"config {path}")
    if path.is_dir():
        loaded = load_checkpoint(path, device, dtype, text_head=text_head)
        head = loaded.text_head
        return LoadedModel(loaded.model, loaded.norm_stats,
                           f"checkpoint {path} ({loaded.layout} layout; text head {head.choice}: {head.reason})",
                           head, loaded.trained_on)
    raise ValueError(f"model source {source!r} is neither a preset ({sorted(PRESETS)}) nor a file or folder")


def standin_tokenizer(vocab_size: int) -> Tokenizer:
    """The stand-in tokenizer for random-init models, trained on first use and cached."""
    path = cached_file(f"standin_tokenizer_{vocab_size}.model", lambda tmp: train_tokenizer(tmp, vocab_size))
    return load_tokenizer(path)


def tokenizer_for(model: Pi05Model, path: str | Path | None) -> Tokenizer:
    """The tokenizer file at `path`, or the cached stand-in (random-init models only); ValueError if it does not
    fit the model's vocabulary (OSError / RuntimeError if the file cannot be read)."""
    tokenizer = load_tokenizer(path) if path else standin_tokenizer(model.config.vocab_size)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model's vocabulary only "
                         f"{model.config.vocab_size}")
    return tokenizer
