"""The models a fleet server serves: how each is named, which of them a server loads, and how.

Each served model id names a source (a preset, a model config JSON, or a LeRobot checkpoint folder, with a seed
for random weights), so "two fine-tuned variants" of one architecture and a second architecture can be
co-located. A server loads only the models its robots use, in its dtype, each with the CPU kernel choice for its
decode step and, on CUDA, CUDA graphs per (bucket, stream) if asked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..engine.frames import power_of_two_buckets
from ..engine.runtime import Served
from ..model.cpu_kernel import apply as apply_cpu_kernel
from ..model.loading import load_model_source, tokenizer_for
from .specs import ModelSpec


class UsesModel(Protocol):
    model_id: str


def models_to_load(specs: Sequence[ModelSpec], robots: Sequence[UsesModel]) -> list[ModelSpec]:
    """Only the models some served robot uses (a GPU of a fleet holds only its robots' models)."""
    if len({s.model_id for s in specs}) != len(specs):
        raise ValueError("model ids must be unique")
    unknown = sorted({r.model_id for r in robots} - {s.model_id for s in specs})
    if unknown:
        raise ValueError(f"robots name models that are not served: {unknown} (served: "
                         f"{sorted(s.model_id for s in specs)})")
    needed = {r.model_id for r in robots}
    return [s for s in specs if s.model_id in needed]


@dataclass
class LoadedModels:
    served: dict[str, Served] = field(default_factory=dict)  # model id -> as the runtime serves it
    cpu_kernel: dict[str, str] = field(default_factory=dict)  # model id -> what its decode step got, and why
    trained_on: dict = field(default_factory=dict)  # model id -> what its checkpoint says of its action space


def load_served(specs: Sequence[ModelSpec], device: str | torch.device, dtype: torch.dtype,
                tokenizer_of: Callable[[object], object] | None = None, cpu_kernel: str = "off",
                graph_buckets: int = 0) -> LoadedModels:
    """Every spec's model as the runtime serves it, what each model's decode step got from `cpu_kernel`, and what
    each checkpoint says it was trained on (None: random weights). `tokenizer_of(model)` gives a model's tokenizer
    (default: the cached stand-in, for random-init models); `graph_buckets` > 0: CUDA graphs of every bucket up to
    it (`use_stage_graphs`)."""
    models = LoadedModels()
    for spec in specs:
        loaded = load_model_source(spec.source, device, dtype, spec.seed, stats_file=spec.norm_stats,
                                   norm_mode=spec.norm_mode)
        models.trained_on[spec.model_id] = loaded.trained_on
        models.cpu_kernel[spec.model_id] = apply_cpu_kernel(loaded.model, cpu_kernel)
        tokenizer = tokenizer_of(loaded.model) if tokenizer_of else tokenizer_for(loaded.model, None)
        if graph_buckets:
            use_stage_graphs(loaded.model, graph_buckets)
        models.served[spec.model_id] = Served(loaded.model, tokenizer, loaded.norm_stats)
    return models


def check_graph_device(device: torch.device | str) -> None:
    """CUDA graphs only on a CUDA device: a clear error elsewhere (a CPU runs every stage eagerly)."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"cuda_graphs needs a CUDA device, not {device}: on a CPU every stage runs eagerly "
                         "(leave cuda_graphs off)")


def use_stage_graphs(model, max_batch: int) -> None:
    """Graphs of a model's action stage (the denoising loop) and decode step per power-of-two bucket up to
    `max_batch` and per stream the call is issued on, so per SM partition of a stage worker: a graph is captured on
    the partition's stream and replayed only there (`model.cuda_graphs.StreamGraphs`). The VLM stage runs
    eagerly. Raises ValueError for a model that is not on a CUDA device."""
    model.use_cuda_graphs(power_of_two_buckets(max_batch), per_stream=True)
