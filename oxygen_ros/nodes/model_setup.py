"""Build what the VLA node runs from its parameters: the model (preset or checkpoint), tokenizer and norm stats.

A random-init preset with no tokenizer file gets the deterministic stand-in SentencePiece model, trained once
into the user cache (`$XDG_CACHE_HOME/oxygen_ros`, else `~/.cache/oxygen_ros`) and reused; it is written under a
temporary name and renamed, so nodes starting together never read a half-written file. A checkpoint needs the
tokenizer it was trained with (PaliGemma's for real pi05 weights), so there `model.tokenizer` is required.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from oxygen_ros.model.checkpoint import CheckpointError, load_checkpoint
from oxygen_ros.model.config import Pi05Config, get_preset
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.precision import DtypeChoice
from oxygen_ros.model.precision import resolve_dtype as resolve_model_dtype
from oxygen_ros.model.preprocess import NormStats
from oxygen_ros.model.tokenizer import Tokenizer, load_tokenizer, train_tokenizer

from .parameters import ParameterError, VlaParams, check_against_model


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: Tokenizer
    norm_stats: NormStats | None
    source: str  # "preset tiny in float32 (...)" or "checkpoint <dir> ... in <dtype> (...)", for logs

    @property
    def config(self) -> Pi05Config:
        return self.model.config


def resolve_dtype(params: VlaParams) -> DtypeChoice:
    """model.dtype for this device; `auto` measures at the preset's shapes (pi05's stand in for a checkpoint's)."""
    return resolve_model_dtype(params.dtype, params.device, get_preset("pi05" if params.checkpoint else params.preset))


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "oxygen_ros"


def standin_tokenizer(vocab_size: int) -> Tokenizer:
    """The stand-in tokenizer for random-init presets, trained on first use and cached."""
    path = cache_dir() / f"standin_tokenizer_{vocab_size}.model"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        os.close(fd)
        try:
            train_tokenizer(tmp, vocab_size)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return load_tokenizer(path)


def load_policy(params: VlaParams) -> Policy:
    """The model, tokenizer and norm stats the parameters name; raises ParameterError with the reason."""
    if params.device == "cuda" and not torch.cuda.is_available():
        raise ParameterError("model.device is cuda but torch sees no CUDA device (use cpu)")
    choice = resolve_dtype(params)
    dtype = choice.dtype
    if params.checkpoint:
        if not params.tokenizer:
            raise ParameterError("model.checkpoint needs model.tokenizer: the SentencePiece file the checkpoint "
                                 "was trained with (paligemma_tokenizer.model for pi05 weights)")
        try:
            loaded = load_checkpoint(params.checkpoint, device=params.device, dtype=dtype,
                                     text_head=params.text_head)
        except (CheckpointError, OSError, ValueError, RuntimeError) as err:  # RuntimeError: out of memory
            raise ParameterError(f"model.checkpoint {params.checkpoint!r} cannot be loaded: {err}") from err
        model, norm_stats = loaded.model, loaded.norm_stats
        head = loaded.text_head
        source = (f"checkpoint {params.checkpoint} ({loaded.layout} layout; text head {head.choice}: "
                  f"{head.reason})")
        check_against_model(params, model.config, norm_stats)
    else:
        config = get_preset(params.preset)
        check_against_model(params, config)  # before spending time on the weights
        model = build_model(config, device=params.device, dtype=dtype, seed=params.seed)
        norm_stats, source = None, f"preset {params.preset}"
    if params.tokenizer:
        try:
            tokenizer = load_tokenizer(params.tokenizer)
        except (OSError, ValueError, RuntimeError) as err:
            raise ParameterError(f"model.tokenizer {params.tokenizer!r} cannot be loaded: {err}") from err
    else:
        tokenizer = standin_tokenizer(model.config.vocab_size)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ParameterError(f"model.tokenizer has {tokenizer.vocab_size} tokens, the model's vocabulary only "
                             f"{model.config.vocab_size}")
    return Policy(model=model, tokenizer=tokenizer, norm_stats=norm_stats, source=f"{source} in {choice}")
