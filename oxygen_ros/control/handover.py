"""The plan a node hands to trajectory controllers after each action chunk, on the node's clock.

`newest_wins` passes each chunk on as computed, and so does `rtc_guided`, whose chunks were made to continue the
plan inside the sampler (real-time chunking, `robots/rtc_guide.py`, `docs/rtc.md`): point i is for
`first_ns + i * time_step`, so a controller that honours the header stamp (joint_trajectory_controller does) skips
what already passed. The blending modes (`temporal_ensemble`, `rtc`; `ChunkExecutor` says how each blends) keep the
received chunks on a grid of control steps `origin + k * time_step` (origin: the first point of the first chunk
since the last restart) and, for each new chunk, publish the blended commands from the first step not yet past
(`now`, rounded up to the grid) onward. Every point of such a plan is in the future when it is made and comes from
a received chunk: none is held, none from before a restart. The clock going backwards (a bag looping, a simulator
reset) restarts the grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .chunk_executor import BLENDING_MODES, ChunkExecutor

NEWEST_WINS = "newest_wins"
RTC_GUIDED = "rtc_guided"
HANDOVERS = (*BLENDING_MODES, RTC_GUIDED)


@dataclass(frozen=True)
class Plan:
    first_ns: int  # node-clock time of point 0
    step_ns: int  # between points
    values: np.ndarray  # [n, dof], n >= 1


class Handover:
    """`add(actions, first_ns, now_ns)` -> the Plan to publish, or the reason (text) the chunk is not used."""

    def __init__(self, mode: str, dof: int, time_step_s: float, ensemble_m: float = 0.01, rtc_overlap: int = 0):
        if mode not in HANDOVERS:
            raise ValueError(f"unknown hand-over {mode!r}; choose from {' | '.join(HANDOVERS)}")
        self.mode, self.dof = mode, dof
        self.step_ns = round(time_step_s * 1e9)
        if self.step_ns <= 0:
            raise ValueError(f"time step must be positive, got {time_step_s}")
        self._executor_args = dict(dof=dof, dt=self.step_ns / 1e9, mode=mode, ensemble_m=ensemble_m,
                                   rtc_overlap=rtc_overlap)
        self.executor: ChunkExecutor | None = None
        self.origin_ns = 0
        self.restarts = 0  # the clock went backwards

    def add(self, actions: np.ndarray, first_ns: int, now_ns: int) -> Plan | str:
        """`actions` [H, dof], point i meant for `first_ns + i * time_step` (node clock, ns); `now_ns`: the time
        the plan goes out."""
        actions = np.asarray(actions, dtype=np.float64)
        if actions.ndim != 2 or actions.shape[1] != self.dof or len(actions) == 0:
            return f"expected actions [H, {self.dof}], got {actions.shape}"
        if not np.isfinite(actions).all():
            return "non-finite actions"
        if self.mode in (NEWEST_WINS, RTC_GUIDED):
            return Plan(first_ns, self.step_ns, actions)
        if self.executor is not None and self._step_at(now_ns) < self.executor.step:
            self.executor = None  # the clock went backwards: what was planned belongs to another timeline
            self.restarts += 1
        if self.executor is None:
            self.origin_ns = first_ns
            self.executor = ChunkExecutor(**self._executor_args, start_step=self._step_at(now_ns))
        executor = self.executor
        executor.advance_to(self._step_at(now_ns))
        arrival = executor.add_chunk(actions, (first_ns - self.origin_ns) / self.step_ns * executor.dt,
                                     executor.dt)
        if not arrival.accepted:
            return arrival.reason
        first_step, values = executor.plan()
        if len(values) == 0:
            return "no step of it is still ahead"
        return Plan(self.origin_ns + first_step * self.step_ns, self.step_ns, values)

    def _step_at(self, now_ns: int) -> int:
        """The first grid step at or after `now_ns`."""
        return -((self.origin_ns - now_ns) // self.step_ns)
