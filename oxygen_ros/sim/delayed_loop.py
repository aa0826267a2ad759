"""A policy on the simulator with an inference delay: chunks arrive `delay` control steps after their frame, while the
robot goes on executing, and a hand-over turns them into one command per step (what `vla_node` does on a robot).

At step s the loop takes a frame and asks the policy for a chunk whose action i is meant for step s + i; the chunk
takes effect at step s + delay (its first `delay` actions are already past and skipped, `ChunkExecutor`), and the
next frame is taken once it arrived and `execute` steps have passed since the last one (one request in flight, as
real-time chunking's paper runs it). Until the first chunk arrives the robot holds its initial position. Hand-overs:
the executor's `newest_wins`, `temporal_ensemble` and `rtc` (the post-hoc blend), and `rtc_guided`, where the
policy samples each chunk with real-time chunking toward the chunk being executed (its offset in it and the delay
given, `policy.chunk(..., previous=(offset, delay))`) and the executor takes it as `newest_wins`.

The executor's statistics are the smoothness measures: the switch discontinuity (largest joint jump between the
command before and the first after a chunk takes effect) and the jerk (third difference of the commands over dt^3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..control.chunk_executor import ChunkExecutor
from ..control.handover import NEWEST_WINS, RTC_GUIDED

HANDOVERS = ("newest_wins", "temporal_ensemble", "rtc", RTC_GUIDED)


@dataclass
class DelayedEpisode:
    success_step: int | None
    steps: int
    stats: dict  # ChunkExecutor's summary: switch discontinuities, jerk, held steps, chunks accepted / rejected


def run_delayed(env, observation, policy, delay: int, execute: int, handover: str, dt: float) -> DelayedEpisode:
    """One episode from `observation` (the env's reset's); `policy.chunk(images, qpos, task, previous=None)` gives
    [horizon, dof] absolute targets, action i for the frame's step + i."""
    if handover not in HANDOVERS:
        raise ValueError(f"hand-over must be one of {' | '.join(HANDOVERS)}, got {handover!r}")
    if delay < 0 or execute < 1:
        raise ValueError(f"need delay >= 0 and execute >= 1, got {delay}, {execute}")
    executor = ChunkExecutor(len(observation.qpos), dt, NEWEST_WINS if handover == RTC_GUIDED else handover,
                             initial_command=observation.qpos)
    pending: tuple[int, int, np.ndarray] | None = None  # (arrival step, source step, chunk)
    source = None  # the step of the frame of the chunk being executed
    next_frame, success = 0, None
    while env.steps < env.max_steps:
        step = env.steps
        if pending is not None and step >= pending[0]:
            arrival = executor.add_chunk(pending[2], pending[1] * dt, dt)
            if arrival.accepted:
                source = pending[1]
            pending = None
        if pending is None and step >= next_frame:
            previous = (step - source, delay) if handover == RTC_GUIDED and source is not None else None
            chunk = policy.chunk(observation.images, observation.qpos, env.instruction, previous=previous)
            pending = (step + delay, step, chunk)
            next_frame = step + max(execute, delay)
            if delay == 0:
                continue  # it takes effect at once: this very step
        result = env.step(executor.next_command())
        observation = result.observation
        if result.success:  # ended there, as every path ends an episode at gym-aloha's top stage
            success = env.steps
            break
        if result.truncated:
            break
    return DelayedEpisode(success, env.steps, executor.stats.summary())
