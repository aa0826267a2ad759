"""A fleet server: the engine's runtime serving many robots from several co-located models.

Robots are registered with their model and latency budget (SLO); each frame becomes an action frame of that
robot, due at its camera stamp + the robot's SLO. Frames of robots on the same model are prefilled and denoised
together (power-of-two buckets), models take turns by earliest-SLO-first (or another queue policy), and narration
of every robot decodes in the same batches as everyone else's. The ROS node (`nodes/fleet_node.py`) is a thin
layer over this; nothing here knows about ROS.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..engine.runtime import ActionChunk, Runtime, RuntimeConfig, RuntimeStats, Served, TextUpdate
from ..model.preprocess import Observation
from .model_runner import ModelSpec, load_model


@dataclass(frozen=True)
class ServedRobot:
    robot_id: str
    model_id: str
    slo_s: float


class FleetServer:
    def __init__(self, specs: Sequence[ModelSpec], robots: Sequence[ServedRobot], config: RuntimeConfig,
                 tokenizer_for: Callable[[int], object], device: str = "cpu", dtype: torch.dtype = torch.float32,
                 on_chunk: Callable[[ActionChunk], None] | None = None,
                 on_text: Callable[[TextUpdate], None] | None = None):
        """`tokenizer_for(vocab_size)` gives the tokenizer of a random-init model (checkpoints need theirs too)."""
        if len({s.model_id for s in specs}) != len(specs):
            raise ValueError("model ids must be unique")
        served: dict[str, Served] = {}
        for spec in specs:
            model, norm_stats = load_model(spec, device, dtype)
            served[spec.model_id] = Served(model, tokenizer_for(model.config.vocab_size), norm_stats)
        unknown = sorted({r.model_id for r in robots} - set(served))
        if unknown:
            raise ValueError(f"robots name models that are not served: {unknown} (served: {sorted(served)})")
        self.robots: Mapping[str, ServedRobot] = {r.robot_id: r for r in robots}
        self.runtime = Runtime(served, config, on_text=on_text, on_chunk=on_chunk)

    def model_config(self, robot_id: str):
        return self.runtime.served[self.robots[robot_id].model_id].model.config

    def start(self) -> FleetServer:
        self.runtime.start(control_thread=True)
        return self

    def submit(self, robot_id: str, observation: Observation, narrate: bool, stamp_ns: int, age_s: float,
               context=None) -> None:
        """Queue a robot's frame (any thread); raises ValueError when the observation does not fit its model."""
        robot = self.robots[robot_id]
        arrival = time.perf_counter()  # latency counts preprocessing too
        inputs = self.runtime.prepare(observation, robot.model_id)
        self.runtime.submit(self.runtime.frame(inputs, narrate, model_id=robot.model_id, robot_id=robot_id,
                                               stamp_ns=stamp_ns, age_s=age_s, budget_s=robot.slo_s,
                                               context=context, arrival=arrival))

    def robot_actions(self, chunk: ActionChunk, dims: int) -> np.ndarray:
        return self.runtime.robot_actions(chunk, dims, self.robots[chunk.robot_id].model_id)

    def stats(self, robot_id: str, window_s: float = 5.0) -> RuntimeStats:
        return self.runtime.stats(window_s, robot_id)

    def close(self) -> None:
        self.runtime.close()
