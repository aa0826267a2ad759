"""The engine every front end runs, built in one place from the engine parameters (`robots.engine_params`).

The VLA node (one robot, acting on its own control tick), the fleet node (many robots and models on one device) and
`serve` (openpi's clients, one robot per connection) differ in who drives the control path, not in how the engine is
made: the device is checked, the model, tokenizer and norm stats are loaded in the resolved dtype (a checkpoint with
the tokenizer it was trained with, a preset with the cached stand-in), the profile is checked against what the
checkpoint says it was trained on, and the scheduler's and runtime's configs come from the same parameters. Every
failure is a `ParameterError` with its reason, which each front end reports as its one start-up line.

- `load_policy` loads one model (the VLA node's; `check` sees its shape before the weights are read);
- `build_runtime` makes the runtime that serves it, on the caller's control tick;
- `build_fleet` makes a fleet server (`fleet.server.FleetServer`) over the same configs, for many robots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from oxygen_ros.control.embodiment import Embodiment
from oxygen_ros.engine.runtime import Runtime, RuntimeConfig, Served, TextUpdate
from oxygen_ros.engine.scheduler import SchedulerConfig, node_decode_policy
from oxygen_ros.fleet.server import FleetServer
from oxygen_ros.fleet.specs import ModelSpec, ServedRobot
from oxygen_ros.model import cpu_kernel
from oxygen_ros.model.checkpoint import CheckpointError, checkpoint_config
from oxygen_ros.model.config import Pi05Config, get_preset
from oxygen_ros.model.loading import checkpoint_folder, checkpoint_tokenizer, load_model_source, tokenizer_for
from oxygen_ros.model.normalization import Normalization
from oxygen_ros.model.precision import DtypeChoice, resolve_dtype
from oxygen_ros.model.rtc import RtcConfig
from oxygen_ros.model.tokenizer import Tokenizer

from .engine_params import ParameterError

NO_CUDA = "model.device is cuda but torch sees no CUDA device (use cpu or auto)"


def check_device(device: str) -> None:
    """ParameterError for a CUDA device torch does not see (before any weights are built)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ParameterError(NO_CUDA)


def use_threads(e) -> None:
    """torch's intra-op threads, before anything is measured or loaded (`model.cpu_threads`; 0: torch's default)."""
    if e.cpu_threads:
        torch.set_num_threads(e.cpu_threads)


def scheduler_config(e, *, num_steps: int | None = None, max_batch: int = 1, queue: str = "fifo",
                     deadline_margin_s: float = 0.0) -> SchedulerConfig:
    """The scheduler's config from the engine parameters `e` (`EngineParams`, or the VLA node's `VlaParams`: the
    same fields); `num_steps` the model's own Euler steps, used when `control.denoise_steps` is 0."""
    return SchedulerConfig(num_steps=e.denoise_steps or num_steps, control_period_s=e.period_s,
                           deadline_margin_s=deadline_margin_s, max_new_tokens=e.max_new_tokens,
                           **node_decode_policy(e.tokens_per_frame, e.min_steps_per_frame, e.max_new_tokens),
                           admission=e.admission, max_preempted=e.max_preempted, temperature=e.temperature,
                           seed=e.seed, queue=queue, max_batch=max_batch)


def runtime_config(e, scheduler: SchedulerConfig, *, pool_slots: int, frame_slots: int = 0,
                   stream_every: int = 0, rtc: RtcConfig | None = None) -> RuntimeConfig:
    return RuntimeConfig(scheduler=scheduler, pool_slots=pool_slots, stream_every=stream_every, seed=e.seed,
                         frame_slots=frame_slots, overlap_threads=e.overlap_threads, rtc=rtc)


def embodiment_fit(embodiment: Embodiment, trained_on, action_names: Sequence[str], override: bool,
                   model: str = "model.checkpoint", robot: str = "") -> str:
    """"" when `embodiment` fits what the checkpoint says it was trained on; the reason, when it does not and
    `override` (embodiment_override) allows it; else ParameterError. `model` and `robot` name them in the line."""
    reason = embodiment.mismatch(trained_on, tuple(action_names))
    if reason is None:
        return ""
    line = f"embodiment {embodiment.name}{f' of robot {robot}' if robot else ''} does not fit {model}: {reason}"
    if not override:
        raise ParameterError(f"{line} (set embodiment to the profile it was trained in, or embodiment_override: "
                             "true)")
    return line


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


def dtype_choice(e) -> DtypeChoice:
    """model.dtype for this device; `auto` measures at the preset's shapes (pi05's stand in for a checkpoint's)."""
    return resolve_dtype(e.dtype, e.device, get_preset("pi05" if e.checkpoint else e.preset))


def checkpoint_source(e) -> tuple[str, Pi05Config, Tokenizer | None, str]:
    """Where the model of `e` comes from: (source for `load_model_source`, its shape, the tokenizer a checkpoint
    was trained with (None for a preset: the stand-in, or model.tokenizer), where that tokenizer was found).
    A checkpoint's tokenizer is found and checked against its config before the weights are read."""
    if not e.checkpoint:
        return e.preset, get_preset(e.preset), None, ""
    try:
        folder = checkpoint_folder(e.checkpoint)
        shape = checkpoint_config(folder)
    except (CheckpointError, OSError, ValueError) as err:
        raise ParameterError(f"model.checkpoint {e.checkpoint!r} cannot be loaded: {err}") from err
    tokenizer, where = _tokenizer(e, lambda: checkpoint_tokenizer(folder, shape.vocab_size, e.tokenizer))
    return str(folder), shape, tokenizer, where


def load_policy(e, embodiment: Embodiment, action_names: Sequence[str],
                check: Callable[[Pi05Config, Normalization | None], None] = lambda config, stats: None) -> Policy:
    """The model, tokenizer and norm stats `e` names; ParameterError with the reason. `check(config, norm_stats)`
    sees the model's shape before a preset's weights are built (and a checkpoint's as loaded)."""
    check_device(e.device)
    use_threads(e)
    choice = dtype_choice(e)
    source, shape, tokenizer, where = checkpoint_source(e)
    if e.checkpoint:
        try:
            loaded = load_model_source(source, e.device, choice.dtype, text_head=e.text_head,
                                       stats_file=e.norm_stats, norm_mode=e.norm_mode)
        except (CheckpointError, OSError, ValueError, RuntimeError) as err:  # RuntimeError: out of memory
            raise ParameterError(f"model.checkpoint {e.checkpoint!r} cannot be loaded: {err}") from err
        check(loaded.model.config, loaded.norm_stats)
        warning = embodiment_fit(embodiment, loaded.trained_on, action_names, e.embodiment_override)
        description = f"{loaded.description}, tokenizer {where}"
    else:
        check(shape, None)  # before spending time on the weights
        loaded = load_model_source(source, e.device, choice.dtype, e.seed)
        warning, description = "", loaded.description
        tokenizer, _ = _tokenizer(e, lambda: (tokenizer_for(loaded.model, e.tokenizer), ""))
    try:
        kernel = cpu_kernel.apply(loaded.model, e.cpu_kernel)
    except (cpu_kernel.CpuKernelUnavailable, ValueError) as err:
        raise ParameterError(f"model.cpu_kernel on: {err}") from err
    return Policy(model=loaded.model, tokenizer=tokenizer, norm_stats=loaded.norm_stats,
                  source=f"{description} in {choice}, cpu kernel {kernel}", embodiment_warning=warning)


def _tokenizer(e, find) -> tuple[Tokenizer, str]:
    try:
        return find()
    except (OSError, ValueError, RuntimeError) as err:
        setting = repr(e.tokenizer) if e.tokenizer else "(empty: the checkpoint's own)"
        raise ParameterError(f"model.tokenizer {setting} cannot be used: {err}") from err


def build_runtime(e, policy: Policy, on_text: Callable[[TextUpdate], None], *, stream_every: int = 0,
                  deadline_margin_s: float = 0.0, rtc: RtcConfig | None = None) -> Runtime:
    """The runtime serving `policy` to one robot whose control tick calls `act` (not started); `rtc`: real-time
    chunking's settings, for frames that bring the chunk being executed."""
    scheduler = scheduler_config(e, num_steps=policy.config.num_steps, deadline_margin_s=deadline_margin_s)
    config = runtime_config(e, scheduler, pool_slots=e.pool_slots, stream_every=stream_every, rtc=rtc)
    return Runtime(Served(policy.model, policy.tokenizer, policy.norm_stats), config, on_text=on_text)


def build_fleet(e, specs: Sequence[ModelSpec], robots: Sequence[ServedRobot], *, device: str, max_batch: int,
                queue: str, pool_slots: int, frame_slots: int = 0, stream_every: int = 8,
                tokenizer: Tokenizer | None = None, choose_dtype: bool = False, rtc: RtcConfig | None = None,
                **fleet: Any) -> FleetServer:
    """A fleet server for `robots` on the models `specs`, over the configs the engine parameters `e` give (not
    started); `tokenizer`: every model's (default: model.tokenizer, else the stand-in); `choose_dtype`: model.dtype
    resolved for the device (default: the fleet server's, bfloat16 on CUDA and float32 on a CPU); `fleet` the
    server's own keywords (callbacks, design, profile ...); `rtc`: real-time chunking's settings, for the robots'
    frames that bring the chunk being executed. A model that does not load is a ParameterError."""
    check_device(device)
    use_threads(e)
    if choose_dtype:
        fleet["dtype"] = dtype_choice(e).dtype
    scheduler = scheduler_config(e, max_batch=max_batch, queue=queue)
    config = runtime_config(e, scheduler, pool_slots=pool_slots, frame_slots=frame_slots, stream_every=stream_every,
                            rtc=rtc)
    try:
        return FleetServer(specs, robots, config,
                           lambda model: tokenizer or tokenizer_for(model, e.tokenizer or None), device,
                           cpu_kernel=e.cpu_kernel, **fleet)
    except (cpu_kernel.CpuKernelUnavailable, RuntimeError) as err:  # RuntimeError: a checkpoint that does not load
        raise ParameterError(f"cannot load the model: {err}") from err
