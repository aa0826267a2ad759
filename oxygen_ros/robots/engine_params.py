"""The engine's parameters: one table that the VLA node, the fleet node and `serve` read, and its one validation.

Each `Spec` carries its name, default, description and how its value is checked (`read`); `Reader.value` applies
that check, so a parameter means the same and fails with the same line in every front end. `ENGINE_SPECS` holds
what loads and runs the model (model, embodiment, narration, denoising, default prompt, image budget), under the
VLA node's dotted names; the VLA node declares them beside its ROS wiring (`nodes/parameters.py`), `serve` reads
them from the node's parameter files (`serving/params.py`), and the fleet node declares the ones it shares under
its flat names (`renamed`, `nodes/fleet_parameters.py`). `read_engine` checks them all and gives `EngineParams`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from oxygen_ros.control.embodiment import shipped_names
from oxygen_ros.engine.scheduler import ADMISSION_POLICIES
from oxygen_ros.model.checkpoint import TEXT_HEADS
from oxygen_ros.model.cpu_kernel import CHOICES as CPU_KERNEL_CHOICES
from oxygen_ros.model.normalization import MODES as NORM_MODES
from oxygen_ros.model.precision import DTYPE_NAMES

from .inputs import MAX_PIXELS

PRESET_NAMES = ("tiny", "small", "pi05")
DEVICES = ("auto", "cpu", "cuda")
REQUIRED = object()  # marks a parameter without a default (robot-specific: comes from the parameter file)
OPTIONAL = object()  # marks a string array that may stay unset
WORDS = {False: "off", True: "on"}  # YAML and `-p` read a bare off / on as a boolean


class ParameterError(ValueError):
    """A parameter is missing, of the wrong type or out of range; the message names it."""


@dataclass(frozen=True)
class Spec:
    """One parameter. `read` says how `Reader.value` checks it: ("text",), ("choice", options), ("flag",),
    ("integer", minimum), ("number", minimum), ("positive",), ("names",) (distinct, non-empty), ("strings",);
    () when its front end checks it."""

    name: str
    default: Any  # a value (its type is the parameter's type), or REQUIRED / OPTIONAL for a string array
    description: str
    constraints: str = ""
    read: tuple = ()


def renamed(spec: Spec, name: str, default: Any = None) -> Spec:
    """`spec` under another front end's name (and default, where that front end has its own)."""
    return replace(spec, name=name, default=spec.default if default is None else default)


ENGINE_SPECS = (
    Spec("model.preset", "tiny", "random-init model shape, used when model.checkpoint is empty",
         " | ".join(PRESET_NAMES), ("choice", PRESET_NAMES)),
    Spec("model.checkpoint", "", "pi05 checkpoint (LeRobot's or openpi's PyTorch layout): a folder, or a hub repo "
                                 "id org/name[@revision] resolved into the hub cache (HF_HUB_OFFLINE=1: cached "
                                 "snapshots only); overrides model.preset", read=("text",)),
    Spec("model.text_head", "auto", "matrix a checkpoint decodes narration with; auto: as the stack that wrote it "
                                    "(LeRobot: its lm_head when it differs from the embedding; openpi: the "
                                    "embedding)", " | ".join(TEXT_HEADS), ("choice", TEXT_HEADS)),
    Spec("model.tokenizer", "", "tokenizer (SentencePiece .model or tokenizer.json): a file, a folder holding one, or "
                                "a hub repo id; empty: with a checkpoint, the one it carries or names, else "
                                "PaliGemma's (google/paligemma-3b-pt-224, as LeRobot); with a preset, a stand-in "
                                "trained once into the user cache", read=("text",)),
    # a checkpoint's normalization from the user's own dataset (docs/checkpoints.md, "Norm stats")
    Spec("model.norm_stats", "", "the robot's own dataset stats replacing the checkpoint's (LeRobot's "
                                 "meta/stats.json or openpi's norm_stats.json); empty: the checkpoint's",
         read=("text",)),
    Spec("model.norm_mode", "", "one normalization mode for state and actions instead of the checkpoint's; empty: "
                                "the checkpoint's", " | ".join(("<empty>", *NORM_MODES)), ("text",)),
    Spec("model.device", "auto", "torch device; auto: cuda when torch sees a CUDA device, else cpu",
         " | ".join(DEVICES), ("choice", DEVICES)),
    Spec("model.dtype", "auto", "weights and KV cache dtype; auto: bfloat16 on cuda and on a cpu with native "
                                "bfloat16 where it measures faster, else float32",
         " | ".join(DTYPE_NAMES), ("choice", DTYPE_NAMES)),
    Spec("model.cpu_kernel", "auto", "a decode step's backbone layers and greedy choice as compiled calls on a cpu "
                                     "(built once with the system C++ compiler); auto: where it builds and the cpu "
                                     "has AVX-512 or AVX2 with FMA, else the eager step",
         " | ".join(CPU_KERNEL_CHOICES), ("choice", CPU_KERNEL_CHOICES)),
    Spec("model.seed", 0, "weights of a random-init preset and the flow-matching noise", ">= 0", ("integer", 0)),
    Spec("model.cpu_threads", 0, "torch intra-op threads; 0: torch's default", ">= 0", ("integer", 0)),
    Spec("cameras.max_pixels", MAX_PIXELS, "refuse images larger than this many pixels (width x height, read "
                                           "from the message or the JPEG/PNG header before decoding); 0: no "
                                           "budget", ">= 0", ("integer", 0)),
    Spec("embodiment", "absolute", "what the checkpoint's state and action dims mean on this robot (deltas, "
                                   "velocities, sign flips, gripper units): a shipped profile or a profile YAML "
                                   "file (docs/embodiments.md)", " | ".join(shipped_names()) + " | <file>",
         ("text",)),
    Spec("embodiment_override", False, "start even when the checkpoint says it was trained in another embodiment "
                                       "(a warning instead of the start-up error)", read=("flag",)),
    Spec("control.rate_hz", 10.0, "control ticks per second (one prefill and one action chunk per tick)", "> 0",
         ("positive",)),
    Spec("control.denoise_steps", 0, "flow-matching Euler steps per chunk; 0: the model's default", ">= 0",
         ("integer", 0)),
    Spec("language.max_new_tokens", 32, "token budget of one narration", ">= 1", ("integer", 1)),
    Spec("language.temperature", 0.0, "narration sampling temperature; 0: greedy (each narration samples from its "
         "own stream seeded by model.seed, so batching never changes its text)", ">= 0", ("number", 0.0)),
    Spec("language.tokens_per_frame", 0, "0: adaptive k (narration decodes in the slack before the next tick, "
                                         "so the control rate holds however long the text); N: exactly N decode "
                                         "steps after each frame that leaves narration work, which the next tick "
                                         "waits for (the same tokens per frame on any machine)", ">= 0",
         ("integer", 0)),
    Spec("language.min_steps_per_frame", 1, "with adaptive k: decode steps each frame still owes the narration, "
                                            "slack or not, so the text never starves; 0: none", ">= 0",
         ("integer", 0)),
    Spec("language.overlap_threads", 0, "decode narration beside each chunk's denoising on this many of "
                                        "model.cpu_threads (the control path keeps the rest; on cuda any value > 0 "
                                        "lets the two streams share the device); 0: only between chunks", ">= 0",
         ("integer", 0)),
    Spec("language.pool_slots", 8, "KV cache slots (one for the action path, the rest for narrations)", ">= 2",
         ("integer", 2)),
    Spec("language.admission", "drop_oldest", "what a new narration does when every slot is busy",
         " | ".join(ADMISSION_POLICIES), ("choice", ADMISSION_POLICIES)),
    Spec("language.max_preempted", 16, "with admission preempt: narrations waiting for a slot; past it the "
                                       "oldest waiting one is dropped", ">= 0", ("integer", 0)),
    Spec("instruction.default", "", "task text used until an instruction message arrives", read=("text",)),
)
ENGINE = {spec.name: spec for spec in ENGINE_SPECS}


@dataclass(frozen=True)
class EngineParams:
    """The engine's parameters, checked (the VLA node's `VlaParams` derives from it and adds its own)."""

    preset: str
    checkpoint: str
    text_head: str
    tokenizer: str
    device: str  # cpu or cuda: `auto` resolved
    dtype: str
    cpu_kernel: str
    seed: int
    cpu_threads: int
    max_pixels: int  # 0: no budget
    embodiment_name: str
    embodiment_override: bool
    rate_hz: float
    denoise_steps: int  # 0: the model's
    max_new_tokens: int
    temperature: float
    tokens_per_frame: int  # 0: adaptive k
    min_steps_per_frame: int
    overlap_threads: int
    pool_slots: int
    admission: str
    max_preempted: int
    default_instruction: str
    norm_stats: str = ""  # a stats file replacing the checkpoint's; "": its own
    norm_mode: str = ""  # one mode for state and actions; "": the checkpoint's

    @property
    def period_s(self) -> float:
        return 1.0 / self.rate_hz


FIELDS = {  # EngineParams field -> its parameter
    "preset": "model.preset", "checkpoint": "model.checkpoint", "text_head": "model.text_head",
    "tokenizer": "model.tokenizer", "device": "model.device", "dtype": "model.dtype", "cpu_kernel": "model.cpu_kernel",
    "seed": "model.seed", "cpu_threads": "model.cpu_threads", "max_pixels": "cameras.max_pixels",
    "embodiment_name": "embodiment", "embodiment_override": "embodiment_override", "rate_hz": "control.rate_hz",
    "denoise_steps": "control.denoise_steps", "max_new_tokens": "language.max_new_tokens",
    "temperature": "language.temperature", "tokens_per_frame": "language.tokens_per_frame",
    "min_steps_per_frame": "language.min_steps_per_frame", "overlap_threads": "language.overlap_threads",
    "pool_slots": "language.pool_slots", "admission": "language.admission",
    "max_preempted": "language.max_preempted", "default_instruction": "instruction.default",
    "norm_stats": "model.norm_stats", "norm_mode": "model.norm_mode",
}


def read_engine(values: Mapping[str, Any]) -> EngineParams:
    """Every engine parameter of `values` (dotted names) checked by its spec; ParameterError naming the first bad
    one. `model.device: auto` becomes the device torch has."""
    reader = Reader(values)
    read = {field: reader.value(ENGINE[name]) for field, name in FIELDS.items()}
    if read["norm_mode"] not in ("", *NORM_MODES):
        raise ParameterError(f"model.norm_mode must be empty (the checkpoint's) or one of {' | '.join(NORM_MODES)}, "
                             f"got {read['norm_mode']!r}")
    for field in ("norm_stats", "norm_mode"):
        if read[field] and not read["checkpoint"]:
            raise ParameterError(f"model.{field} applies to a checkpoint's normalization, and model.checkpoint is "
                                 f"empty (a preset normalizes nothing)")
    return EngineParams(**{**read, "device": resolve_device(read["device"])})


def resolve_device(choice: str) -> str:
    """`auto` made concrete: cuda when torch sees a CUDA device, else cpu (the device itself is checked where the
    model is built, `robots.engine.check_device`)."""
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


class Reader:
    """Checked values out of a name -> value mapping; every failure a ParameterError naming the parameter."""

    def __init__(self, values: Mapping[str, Any]):
        self.values = values

    def value(self, spec: Spec, name: str | None = None):
        """`spec`'s value checked as its `read` says (`name`: where it stands in `values`, default its own)."""
        kind, *args = spec.read
        name = name or spec.name
        if kind == "choice":
            return self.choice(name, *args)
        if kind == "positive":
            return self.number(name, positive=True)
        return getattr(self, kind)(name, *args)

    def _get(self, name: str):
        return self.values[name]

    def text(self, name: str) -> str:
        value = self._get(name)
        if not isinstance(value, str):
            raise ParameterError(f"{name} must be a string, got {value!r}")
        return value.strip()

    def choice(self, name: str, options: tuple[str, ...]) -> str:
        value = self._get(name)
        if isinstance(value, bool) and WORDS[value] in options:  # `cpu_kernel: off` unquoted
            return WORDS[value]
        value = self.text(name)
        if value not in options:
            raise ParameterError(f"{name} must be one of {' | '.join(options)}, got {value!r}")
        return value

    def flag(self, name: str) -> bool:
        value = self._get(name)
        if not isinstance(value, bool):
            raise ParameterError(f"{name} must be true or false, got {value!r}")
        return value

    def integer(self, name: str, minimum: int = 0) -> int:
        value = self._get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
        return value

    def number(self, name: str, minimum: float = 0.0, positive: bool = False) -> float:
        value = self._get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ParameterError(f"{name} must be a number, got {value!r}")
        if value < minimum or (positive and value <= 0):
            raise ParameterError(f"{name} must be {'> 0' if positive else f'>= {minimum:g}'}, got {value}")
        return float(value)

    def per_joint(self, name: str, count: int, default: float, finite: bool = True) -> tuple[float, ...]:
        """A number for all `count` joints, or a list with one per joint; unset: `default` for each. NaN is never
        accepted; infinities only with `finite` False."""
        value = self._get(name)
        if value is None:
            return (default,) * count
        numbers = list(value) if isinstance(value, list | tuple) else [value] * count
        if len(numbers) != count or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                            and (math.isfinite(v) or not finite and not math.isnan(v))
                                            for v in numbers):
            kind = "finite number" if finite else "number (not NaN)"
            raise ParameterError(f"{name} must be a {kind} or a list of {count} (one per joint), got {value!r}")
        return tuple(float(v) for v in numbers)

    def strings(self, name: str) -> tuple[str, ...]:
        """A list of strings (empty ones and repeats allowed)."""
        value = self._get(name)
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ParameterError(f"{name} must be a list of strings, got {value!r}")
        return tuple(v.strip() for v in value)

    def names(self, name: str) -> tuple[str, ...]:
        value = self._get(name)
        if value is None:
            raise ParameterError(f"{name} is not set: pass a parameter file (config/aloha.yaml, "
                                 f"config/droid.yaml) or -p {name}:=[...]")
        names = tuple(str(v).strip() for v in value)
        if not names or not all(names):
            raise ParameterError(f"{name} must be a non-empty list of non-empty names, got {list(value)}")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ParameterError(f"{name} lists {duplicates} more than once")
        return names
