"""The engine options `oxygen-ros serve` reads from the VLA node's parameter files, without ROS.

A node parameter file (`config/aloha.yaml`, `config/droid.yaml`) nests its parameters under
``<node>: ros__parameters:``; the server reads the sections ``/**`` and ``vla_node``, flattens them to the node's
dotted names and takes the engine's options below (model, embodiment, narration, denoising, default prompt, the
image budget), with the node's defaults (`nodes/parameters.py`, which a test keeps equal). The node's ROS wiring
(topics, joint names, hand-over, output groups) means nothing to the server and is ignored, except
``joints.action_names``, whose length is the reply width for a profile of any width. Later files and ``name=value``
overrides (YAML values, as ``-p name:=value``) win; an override naming anything else is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from oxygen_ros.robots.inputs import MAX_PIXELS

SECTIONS = ("/**", "vla_node", "/vla_node")
ENGINE_DEFAULTS: dict[str, Any] = {
    "model.preset": "tiny",
    "model.checkpoint": "",
    "model.text_head": "auto",
    "model.tokenizer": "",
    "model.norm_stats": "",
    "model.norm_mode": "",
    "model.device": "auto",
    "model.dtype": "auto",
    "model.cpu_kernel": "auto",
    "model.seed": 0,
    "model.cpu_threads": 0,
    "cameras.max_pixels": MAX_PIXELS,
    "embodiment": "absolute",
    "embodiment_override": False,
    "control.rate_hz": 10.0,
    "control.denoise_steps": 0,
    "language.max_new_tokens": 32,
    "language.temperature": 0.0,
    "language.tokens_per_frame": 0,
    "language.min_steps_per_frame": 1,
    "language.overlap_threads": 0,
    "language.pool_slots": 8,
    "language.admission": "drop_oldest",
    "language.max_preempted": 16,
    "instruction.default": "",
}
ACTION_NAMES = "joints.action_names"
WORDS = {False: "off", True: "on"}  # YAML reads a bare off / on as a boolean (model.cpu_kernel: off)


def _flatten(table: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        flat.update(_flatten(value, f"{name}.") if isinstance(value, dict) else {name: value})
    return flat


def read_file(path: str | Path) -> dict[str, Any]:
    """The node parameters a file sets (all of them, dotted names); ValueError for a file that is not one."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"parameter file {path} cannot be read: {' '.join(str(err).split())}") from None
    sections = [data[s]["ros__parameters"] for s in SECTIONS if isinstance(data, dict)
                and isinstance(data.get(s), dict) and isinstance(data[s].get("ros__parameters"), dict)]
    if not sections:
        raise ValueError(f"parameter file {path} has no ros__parameters under {' or '.join(SECTIONS)}")
    values = {}
    for section in sections:
        values.update(_flatten(section))
    return values


def engine_parameters(files: Sequence[str | Path], overrides: Sequence[str]) -> dict[str, Any]:
    """The defaults, then each file's engine options, then each ``name=value``; ValueError naming the parameter."""
    values = dict(ENGINE_DEFAULTS, **{ACTION_NAMES: None})
    for path in files:
        values.update({k: v for k, v in read_file(path).items() if k in values})
    for text in overrides:
        name, separator, raw = text.partition("=")
        name = name.strip()
        if not separator or name not in values:
            raise ValueError(f"--param {text!r}: expected NAME=VALUE with NAME one of {', '.join(values)}")
        try:
            values[name] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            raise ValueError(f"--param {text!r}: the value is not a YAML scalar or list") from None
    for name, default in ENGINE_DEFAULTS.items():
        values[name] = _checked(name, values[name], default)
    names = values[ACTION_NAMES]
    if names is not None and (not isinstance(names, list) or not names or not all(isinstance(n, str) and n
                                                                                  for n in names)):
        raise ValueError(f"{ACTION_NAMES} must be a non-empty list of names, got {names!r}")
    return values


def _checked(name: str, value: Any, default: Any) -> Any:
    if isinstance(default, str):
        value = WORDS.get(value, value) if isinstance(value, bool) else "" if value is None else value
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        return value.strip()
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)
