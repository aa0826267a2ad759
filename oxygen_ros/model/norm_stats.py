"""Normalisation stats of a checkpoint folder, read from wherever the stack that wrote it keeps them, then checked.

- LeRobot with processor pipelines: `policy_preprocessor.json` and `policy_postprocessor.json` list their steps;
  the normalizer and unnormalizer steps name a `state_file` of tensors `<feature>.<stat>`. Every
  `policy_*normalizer_processor.safetensors` in the folder is read as well (a folder may lack the pipeline JSON).
- LeRobot before the processors: buffers inside `model.safetensors` named
  `{normalize_inputs,normalize_targets,unnormalize_outputs}.buffer_<feature with _ for .>.<stat>`.
- openpi: `assets/<asset_id>/norm_stats.json` (the asset id may contain a slash), holding
  `{"norm_stats": {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}`.

- a user's own file (`user_stats`), which replaces the folder's: LeRobot's dataset `meta/stats.json`
  (`{"observation.state": {"mean": [...], ...}, "action": {...}}`) or openpi's `norm_stats.json` (above).

The same statistic found in two places must agree. The mode of each feature (`normalization.py`) comes from a
LeRobot folder's pipeline steps (`norm_map`, `eps`), else its `config.json` `normalization_mapping`, else pi0.5's
quantiles; an openpi folder uses openpi's quantiles. State and action then need the statistics of their mode,
finite, of one width, no wider than the model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .config import Pi05Config
from .normalization import (
    ACTION_KEY,
    CONVENTION_MODES,
    FEATURE_TYPES,
    IDENTITY,
    LEROBOT,
    LEROBOT_EPS,
    MODES,
    OPENPI,
    OPENPI_EPS,
    QUANTILES,
    REQUIRED,
    STATE_KEY,
    Normalization,
    NormStats,
)

PIPELINE_FILES = ("policy_preprocessor.json", "policy_postprocessor.json")
STATS_GLOB = "policy_*normalizer_processor.safetensors"
BUFFER_PREFIXES = ("normalize_inputs.", "normalize_targets.", "unnormalize_outputs.")
OPENPI_STATS_GLOB = "assets/**/norm_stats.json"
_OPENPI_FEATURES = {"state": STATE_KEY, "actions": ACTION_KEY}
# The pipeline step that applies each feature at inference: the preprocessor normalizes the state, the
# postprocessor unnormalizes the actions (lerobot/processor/factory.py lines 118-125, LeRobot 7427f31).
PI05_DEFAULT_MAPPING = {"VISUAL": IDENTITY, "STATE": QUANTILES, "ACTION": QUANTILES}
_MODE_STEPS = {STATE_KEY: ("policy_preprocessor.json", "normalizer_processor"),
               ACTION_KEY: ("policy_postprocessor.json", "unnormalizer_processor")}


class NormStatsError(ValueError):
    """A checkpoint's normalisation stats are missing, unreadable, inconsistent or unusable; names what and where."""


def is_buffer_stat(name: str) -> bool:
    """Whether a tensor of `model.safetensors` is an older LeRobot normalisation buffer rather than a weight."""
    return name.startswith(BUFFER_PREFIXES)


class _Collected:
    """Stats gathered from several sources, remembering where each came from so a conflict names both."""

    def __init__(self) -> None:
        self.stats: NormStats = {}
        self.origin: dict[tuple[str, str], str] = {}

    def add(self, feature: str, stat: str, value: np.ndarray, source: str) -> None:
        known = self.stats.get(feature, {}).get(stat)
        if known is not None and (known.shape != value.shape or not np.array_equal(known, value, equal_nan=True)):
            raise NormStatsError(f"{feature}.{stat} differs between {self.origin[feature, stat]} and {source}")
        if known is None:
            self.stats.setdefault(feature, {})[stat] = value
            self.origin[feature, stat] = source


def lerobot_stats(folder: str | Path, buffers: dict[str, torch.Tensor]) -> tuple[NormStats, str]:
    """Stats of a LeRobot folder from its processor files and the older buffers (`buffers`, from the weights),
    and the files they came from, for messages."""
    folder = Path(folder)
    collected = _Collected()
    files = _processor_state_files(folder)
    for file in files:
        for key, value in _read_safetensors(file).items():
            feature, _, stat = key.rpartition(".")
            collected.add(feature, stat, _array(value), file.name)
    for name, value in buffers.items():
        rest = name.split(".", 1)[1]  # buffer_<feature>.<stat>
        feature, _, stat = rest.rpartition(".")
        feature = feature.removeprefix("buffer_").replace("_", ".")
        collected.add(feature, stat, _array(value), f"model.safetensors ({name})")
    sources = [f.name for f in files] + (["model.safetensors buffers"] if buffers else [])
    where = ", ".join(sources) if sources else (f"the folder (no {STATS_GLOB}, processor pipeline JSON naming "
                                                 f"one, or normalization buffers in model.safetensors)")
    return collected.stats, where


def openpi_stats(folder: str | Path) -> tuple[NormStats, str]:
    """Stats of an openpi folder from its single `assets/<asset_id>/norm_stats.json`, and that file's name."""
    folder = Path(folder)
    files = sorted(folder.glob(OPENPI_STATS_GLOB))
    if not files:
        raise NormStatsError("no normalization stats: the folder has no assets/<asset_id>/norm_stats.json")
    if len(files) > 1:
        names = ", ".join(str(f.relative_to(folder)) for f in files)
        raise NormStatsError(f"several norm_stats.json files ({names}): keep the one of this robot")
    name = str(files[0].relative_to(folder))
    return _openpi_features(_read_json(files[0], name), name), name


def user_stats(file: str | Path) -> tuple[NormStats, str]:
    """Stats from a user's file: LeRobot's `stats.json` (features at the top) or openpi's `norm_stats.json` (under
    `norm_stats`, `state` / `actions` renamed to ours), and the file's name for messages."""
    path = Path(file).expanduser()
    name = str(path)
    if not path.is_file():
        raise NormStatsError(f"the stats file {name} does not exist")
    data = _read_json(path, name)
    if not isinstance(data, dict):
        raise NormStatsError(f"{name} holds a JSON {type(data).__name__}, not an object of features")
    if "norm_stats" in data:
        return _openpi_features(data, name), name
    stats: NormStats = {}
    for feature, values in data.items():
        if not isinstance(values, dict):
            raise NormStatsError(f"{name}: {feature} is not an object of statistics (LeRobot's stats.json layout)")
        for stat, value in values.items():
            stats.setdefault(feature, {})[stat] = _numbers(value, f"{name}: {feature}.{stat}")
    return stats, name


def lerobot_modes(folder: str | Path, config: dict) -> tuple[dict[str, str], float]:
    """The mode of the state and the actions of a LeRobot folder, and the eps: from the pipeline step that applies
    each at inference (`norm_map`, `eps`), else `config.json`'s `normalization_mapping`, else pi0.5's default
    (QUANTILES, `lerobot/policies/pi05/configuration_pi05.py` lines 89-95). A VISUAL mode other than IDENTITY is
    refused: the model scales its images itself."""
    folder = Path(folder)
    mapping = config.get("normalization_mapping", PI05_DEFAULT_MAPPING)
    if not isinstance(mapping, dict):
        raise NormStatsError(f"config.json: normalization_mapping must be an object, got {mapping!r}")
    modes, eps = {}, LEROBOT_EPS
    for feature, (pipeline, step_name) in _MODE_STEPS.items():
        step = next((s for s in pipeline_steps(folder, pipeline) if s.get("registry_name") == step_name), None)
        step_config = step.get("config") if step and isinstance(step.get("config"), dict) else {}
        source, norm_map = (pipeline, step_config["norm_map"]) if "norm_map" in step_config else ("config.json",
                                                                                                 mapping)
        if not isinstance(norm_map, dict):
            raise NormStatsError(f"{source}: the norm_map must be an object, got {norm_map!r}")
        # A type the map leaves out is IDENTITY (normalize_processor.py line 329).
        modes[feature] = _mode(norm_map.get(FEATURE_TYPES[feature], IDENTITY), f"{source} {FEATURE_TYPES[feature]}")
        visual = norm_map.get("VISUAL", IDENTITY)
        if visual != IDENTITY:
            raise NormStatsError(f"{source} normalizes VISUAL features with {visual}: not supported (pi0.5 scales "
                                 f"its images itself; LeRobot's pi05 uses IDENTITY)")
        if "eps" in step_config:
            eps = step_config["eps"]
            if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
                raise NormStatsError(f"{pipeline}: {step_name}'s eps must be a positive number, got {eps!r}")
    return modes, float(eps)


def normalization(stats: NormStats, layout: str, modes: dict[str, str] | None = None, eps: float | None = None,
                  mode: str = "") -> Normalization:
    """The `Normalization` of a folder of `layout` (LEROBOT or OPENPI): `modes` read from it (`lerobot_modes`;
    openpi: pi0.5's quantiles), or `mode` for both features when given (the user's choice, checked)."""
    convention = OPENPI if layout == OPENPI else LEROBOT
    modes = dict(modes or {STATE_KEY: QUANTILES, ACTION_KEY: QUANTILES})
    if mode:
        allowed = CONVENTION_MODES[convention]
        if mode not in allowed:
            raise NormStatsError(f"normalization mode {mode!r} is not one of {' | '.join(allowed)} (the modes "
                                 f"{convention}'s formulas know)")
        modes = {STATE_KEY: mode, ACTION_KEY: mode}
    return Normalization(stats, modes, OPENPI_EPS if convention == OPENPI else (eps or LEROBOT_EPS), convention)


def check_norm_stats(norm: Normalization, config: Pi05Config, where: str) -> None:
    """Raise NormStatsError unless state and action have the finite statistics their mode needs, vectors of one
    width within the model's; `where` names the files the stats came from."""
    for feature, limit, what in ((STATE_KEY, config.state_dim, "state"), (ACTION_KEY, config.action_dim, "action")):
        mode = norm.mode(feature)
        needed = REQUIRED[mode]
        if not needed:
            continue
        found = norm.stats.get(feature)
        if not found:
            raise NormStatsError(f"no normalization stats for {feature} in {where}")
        absent = [s for s in needed if s not in found]
        if absent:
            raise NormStatsError(f"normalization stats of {feature} in {where} lack {' and '.join(absent)} "
                                 f"(found {', '.join(sorted(found)) or 'none'}); its mode {mode} needs "
                                 f"{' and '.join(needed)}")
        widths = {s: np.asarray(found[s]).size for s in needed}
        if any(np.asarray(found[s]).ndim != 1 for s in needed) or len(set(widths.values())) != 1:
            shapes = ", ".join(f"{s} {tuple(np.asarray(found[s]).shape)}" for s in needed)
            raise NormStatsError(f"normalization stats of {feature} in {where} must be vectors of one width, got {shapes}")
        width = widths[needed[0]]
        if not 0 < width <= limit:
            raise NormStatsError(f"normalization stats of {feature} in {where} have width {width}; the model's {what} "
                                 f"takes 1 to {limit} dims")
        for s in needed:
            if not np.all(np.isfinite(found[s])):
                raise NormStatsError(f"normalization stat {feature}.{s} in {where} contains NaN or infinite values")


def pipeline_steps(folder: Path, pipeline: str) -> list[dict]:
    """The steps of one LeRobot processor pipeline file in `folder` (none when the file is absent); also where a
    checkpoint names its tokenizer (`loading.py`)."""
    path = folder / pipeline
    if not path.is_file():
        return []
    data = _read_json(path, pipeline)
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise NormStatsError(f"{pipeline} has no list of processor steps")
    return steps


def _processor_state_files(folder: Path) -> list[Path]:
    files = set(folder.glob(STATS_GLOB))
    for pipeline in PIPELINE_FILES:
        for step in pipeline_steps(folder, pipeline):
            kind = str(step.get("registry_name") or step.get("class") or "").lower()
            state_file = step.get("state_file")
            if "normalizer" not in kind or not state_file:
                continue
            named = folder / str(state_file)
            if not named.is_file():
                raise NormStatsError(f"{pipeline} names the stats file {state_file}, which is not in the folder")
            files.add(named)
    return sorted(files)


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise NormStatsError(f"{file.name} cannot be read: {err}") from None


def _read_json(path: Path, name: str):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise NormStatsError(f"{name} is not valid JSON: {err}") from None


def _openpi_features(data, name: str) -> NormStats:
    if not isinstance(data, dict) or not isinstance(data.get("norm_stats"), dict):
        raise NormStatsError(f"{name} has no \"norm_stats\" object")
    stats: NormStats = {}
    for feature, values in data["norm_stats"].items():
        if not isinstance(values, dict):
            raise NormStatsError(f"{name}: norm_stats.{feature} is not an object of statistics")
        ours = _OPENPI_FEATURES.get(feature, feature)
        for stat, value in values.items():
            if value is None:  # q01/q99 are optional in openpi's format
                continue
            stats.setdefault(ours, {})[stat] = _numbers(value, f"{name}: norm_stats.{feature}.{stat}")
    return stats


def _numbers(value, what: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise NormStatsError(f"{what} is not a list of numbers") from None
    if array.dtype == object:
        raise NormStatsError(f"{what} is not a list of numbers")
    return array


def _mode(value, where: str) -> str:
    if value not in MODES:
        raise NormStatsError(f"{where}: unknown normalization mode {value!r} (known: {' | '.join(MODES)})")
    return value


def _array(value: torch.Tensor) -> np.ndarray:
    return value.detach().float().cpu().numpy().astype(np.float64)
