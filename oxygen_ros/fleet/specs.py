"""What a fleet server is asked to serve, as plain values: its models (`ModelSpec`) and its robots (`ServedRobot`).

Light on purpose (no torch, no runtime): the placement and the pool's ingress and controller name models and robots
without loading anything; `models.py` loads what a `ModelSpec` names and `server.py` serves the robots.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """A served model: ``source`` is a preset name, a model config JSON file or a LeRobot pi05 checkpoint folder;
    ``seed`` picks the random weights of a preset or config (ignored for a checkpoint)."""

    model_id: str
    source: str
    seed: int = 0
    norm_stats: str = ""  # a checkpoint's: the user's stats file replacing its own (`model.norm_stats`)
    norm_mode: str = ""  # a checkpoint's: one normalization mode for state and actions (`model.norm_mode`)

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """``id=source[:seed]`` or ``source[:seed]`` (then the id is the whole text), e.g. ``a=tiny:1``."""
        model_id, _, rest = text.partition("=")
        if not rest:
            model_id, rest = text, text
        source, _, seed = rest.rpartition(":") if ":" in rest else (rest, "", "0")
        if not model_id or not source:
            raise ValueError(f"bad model spec {text!r}; expected id=source[:seed]")
        return cls(model_id, source, int(seed or 0))


@dataclass(frozen=True)
class ServedRobot:
    """A robot a server serves: its model and its latency budget (SLO)."""

    robot_id: str
    model_id: str
    slo_s: float
