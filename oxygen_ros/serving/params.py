"""The engine options `oxygen-ros serve` reads from the VLA node's parameter files, without ROS.

A node parameter file (`config/aloha.yaml`, `config/droid.yaml`) nests its parameters under
``<node>: ros__parameters:``; the server reads the sections ``/**`` and ``vla_node``, flattens them to the node's
dotted names and takes the engine's options (`robots.engine_params.ENGINE_SPECS`: model, embodiment, narration,
denoising, default prompt, the image budget) with the node's defaults and checks, from the same table, and the
output parameters (`robot_description`, `limits.policy`, `output.*`: `robots.output_params`), whose groups and
joint limits the server then applies to every reply (`commands/serve.py`). The rest of the node's ROS wiring
(topics, state joint names) means nothing to the server and is ignored; ``joints.action_names`` is the reply
width for a profile of any width, and the joints the output groups name. Later files and ``name=value``
overrides (YAML values, as ``-p name:=value``) win; an override naming anything else is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from oxygen_ros.robots.engine_params import ENGINE_SPECS, OPTIONAL, Reader
from oxygen_ros.robots.output_params import OUTPUT_SPECS, group_defaults

SECTIONS = ("/**", "vla_node", "/vla_node")
ENGINE_DEFAULTS: dict[str, Any] = {spec.name: spec.default for spec in ENGINE_SPECS}
OUTPUT_DEFAULTS: dict[str, Any] = {spec.name: None if spec.default is OPTIONAL else spec.default
                                   for spec in OUTPUT_SPECS}
ACTION_NAMES = "joints.action_names"


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
    values = dict(ENGINE_DEFAULTS, **OUTPUT_DEFAULTS, **{ACTION_NAMES: None})
    for path in files:
        values.update({k: v for k, v in read_file(path).items() if k in values or k.startswith("output.")})
    for text in overrides:
        name, separator, raw = text.partition("=")
        name = name.strip()
        if not separator or not (name in values or name.startswith("output.")):
            raise ValueError(f"--param {text!r}: expected NAME=VALUE with NAME one of {', '.join(values)}")
        try:
            values[name] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            raise ValueError(f"--param {text!r}: the value is not a YAML scalar or list") from None
    values.update(group_defaults(values))
    reader = Reader(values)
    values.update({spec.name: reader.value(spec) for spec in ENGINE_SPECS})  # one check, as the nodes'
    names = values[ACTION_NAMES]
    if names is not None and (not isinstance(names, list) or not names or not all(isinstance(n, str) and n
                                                                                  for n in names)):
        raise ValueError(f"{ACTION_NAMES} must be a non-empty list of names, got {names!r}")
    return values
