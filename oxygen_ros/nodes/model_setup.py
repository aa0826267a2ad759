"""Build what the VLA node runs from its parameters: the model (preset or checkpoint), tokenizer and norm stats.

Loading itself is `model.loading` (shared with the fleet server); this module checks the parameters against the
model and turns every failure into a `ParameterError` with its reason. A checkpoint (a folder or a hub id) needs the
tokenizer it was trained with (PaliGemma's for real pi05 weights): `model.tokenizer` names it, or it is found from
the checkpoint (`loading.checkpoint_tokenizer`); a random-init preset without one gets the cached stand-in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oxygen_ros.model import cpu_kernel
from oxygen_ros.model.checkpoint import CheckpointError, checkpoint_config
from oxygen_ros.model.config import Pi05Config, get_preset
from oxygen_ros.model.loading import checkpoint_folder, checkpoint_tokenizer, load_model_source, tokenizer_for
from oxygen_ros.model.normalization import Normalization
from oxygen_ros.model.precision import DtypeChoice
from oxygen_ros.model.precision import resolve_dtype as resolve_model_dtype
from oxygen_ros.model.tokenizer import Tokenizer

from .parameters import ParameterError, VlaParams, check_against_model


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: Tokenizer
    norm_stats: Normalization | None
    source: str  # "preset tiny in float32 (...)" or "checkpoint <dir> ... in <dtype> (...)", for logs
    embodiment_warning: str = ""  # why the profile does not fit the checkpoint, when embodiment_override allowed it

    @property
    def config(self) -> Pi05Config:
        return self.model.config


def resolve_dtype(params: VlaParams) -> DtypeChoice:
    """model.dtype for this device; `auto` measures at the preset's shapes (pi05's stand in for a checkpoint's)."""
    return resolve_model_dtype(params.dtype, params.device, get_preset("pi05" if params.checkpoint else params.preset))


def load_policy(params: VlaParams) -> Policy:
    """The model, tokenizer and norm stats the parameters name; raises ParameterError with the reason. A
    checkpoint's tokenizer is found and checked against its config before the weights are read."""
    if params.device == "cuda" and not torch.cuda.is_available():
        raise ParameterError("model.device is cuda but torch sees no CUDA device (use cpu or auto)")
    choice = resolve_dtype(params)
    dtype = choice.dtype
    if params.checkpoint:
        try:
            folder = checkpoint_folder(params.checkpoint)
            vocab_size = checkpoint_config(folder).vocab_size
        except (CheckpointError, OSError, ValueError) as err:
            raise ParameterError(f"model.checkpoint {params.checkpoint!r} cannot be loaded: {err}") from err
        tokenizer, where = _tokenizer(params, lambda: checkpoint_tokenizer(folder, vocab_size, params.tokenizer))
        try:
            loaded = load_model_source(str(folder), params.device, dtype, text_head=params.text_head,
                                       stats_file=params.norm_stats, norm_mode=params.norm_mode)
        except (CheckpointError, OSError, ValueError, RuntimeError) as err:  # RuntimeError: out of memory
            raise ParameterError(f"model.checkpoint {params.checkpoint!r} cannot be loaded: {err}") from err
        model, norm_stats, source = loaded.model, loaded.norm_stats, f"{loaded.description}, tokenizer {where}"
        check_against_model(params, model.config, norm_stats)
        warning = embodiment_mismatch(params, loaded.trained_on)
    else:
        check_against_model(params, get_preset(params.preset))  # before spending time on the weights
        loaded = load_model_source(params.preset, params.device, dtype, params.seed)
        model, norm_stats, source, warning = loaded.model, None, loaded.description, ""
        tokenizer, _ = _tokenizer(params, lambda: (tokenizer_for(model, params.tokenizer), ""))
    try:
        kernel = cpu_kernel.apply(model, params.cpu_kernel)
    except (cpu_kernel.CpuKernelUnavailable, ValueError) as err:
        raise ParameterError(f"model.cpu_kernel on: {err}") from err
    return Policy(model=model, tokenizer=tokenizer, norm_stats=norm_stats,
                  source=f"{source} in {choice}, cpu kernel {kernel}", embodiment_warning=warning)


def _tokenizer(params: VlaParams, find) -> tuple[Tokenizer, str]:
    try:
        return find()
    except (OSError, ValueError, RuntimeError) as err:
        setting = repr(params.tokenizer) if params.tokenizer else "(empty: the checkpoint's own)"
        raise ParameterError(f"model.tokenizer {setting} cannot be used: {err}") from err


def embodiment_mismatch(params: VlaParams, trained_on) -> str:
    """"" when `embodiment` fits what the checkpoint says it was trained on; the reason, when it does not and
    `embodiment_override` allows it; else ParameterError."""
    reason = params.embodiment.mismatch(trained_on, params.action_names)
    if reason is None:
        return ""
    line = f"embodiment {params.embodiment.name} does not fit model.checkpoint: {reason}"
    if not params.embodiment_override:
        raise ParameterError(f"{line} (set embodiment to the profile it was trained in, or embodiment_override: "
                             "true)")
    return line
