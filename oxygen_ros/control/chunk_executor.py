"""Turn asynchronously arriving action chunks into one joint command per control step.

Time alignment. A chunk is planned from one camera frame: its action i is meant for time
`stamp + i * time_step` (stamp = that frame's time plus the first point's offset). By the time it arrives the robot
has already executed some of those steps, so they are skipped: a chunk sourced at step s that arrives at step
a = s + d (a model delay of d steps) commands `chunk[t - s]` at every step t >= a, never `chunk[t - a]`. Chunks
whose time step differs from the control period are resampled linearly onto the control steps.

Hand-over between chunks (`mode`):
- `newest_wins`: the newest chunk replaces the rest of the plan when it arrives.
- `temporal_ensemble`: ACT's temporal ensembling (Zhao et al. 2023): the command is the average of every received
  chunk's prediction for the current step, weighted exp(-m * i) with i = 0 for the oldest prediction (ACT's m is
  0.01, so older predictions weigh slightly more).
- `rtc`: the post-hoc counterpart of real-time chunking (Black et al. 2025). RTC inpaints the new chunk toward the
  actions the robot has already committed to, with the soft mask `w_i` of its eq. 5: 1 for the d steps executed
  while the model ran, decaying over the overlap with the previous plan (`w * (e^w - 1) / (e - 1)` on a linear ramp,
  the paper's exponential schedule), 0 after. RTC applies the mask as guidance inside the flow-matching sampler;
  here the model is a black box, so the executor applies the same mask as a blend weight between the committed
  plan and the new chunk: `command = w_i * committed + (1 - w_i) * new`.

When no chunk covers a step the last command is held. The executor reports the switch discontinuity (the largest
joint jump between the command before and the first command after a chunk takes effect) and jerk (the third
difference of the commands, divided by dt^3).

Two ways to drive it: a simulator takes one command per step (`next_command`); a node that hands whole plans to a
trajectory controller moves the step to the present (`advance_to`) before each chunk and publishes `plan()`, the
blended commands from the present step on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..rtc_mask import Schedule, prefix_weights

BLENDING_MODES = ("newest_wins", "temporal_ensemble", "rtc")
_EPS = 1e-6  # steps: stamps built from integer nanoseconds land within this of a control step


@dataclass(frozen=True)
class ChunkArrival:
    """What became of one received chunk."""

    accepted: bool
    reason: str            # why it was rejected ("" if accepted)
    source_step: float     # control step its first action is for
    arrival_step: int      # first control step it can influence
    latency_steps: float   # arrival_step - the step of the camera frame it was computed from


@dataclass
class ExecutorStats:
    steps: int = 0
    held_steps: int = 0
    chunks_accepted: int = 0
    chunks_rejected: int = 0
    latencies: list[float] = field(default_factory=list)
    switch_discontinuities: list[float] = field(default_factory=list)
    jerk_max: float = 0.0
    jerk_sq_sum: float = 0.0
    jerk_count: int = 0

    def summary(self) -> dict:
        lat, disc = np.asarray(self.latencies), np.asarray(self.switch_discontinuities)
        return {
            "steps": self.steps, "held_steps": self.held_steps,
            "chunks_accepted": self.chunks_accepted, "chunks_rejected": self.chunks_rejected,
            "latency_steps": _describe(lat),
            "switch_discontinuity": _describe(disc),
            "jerk_rms": math.sqrt(self.jerk_sq_sum / self.jerk_count) if self.jerk_count else 0.0,
            "jerk_max": self.jerk_max,
        }


def _snap(steps: float) -> float:
    """A step count from nanosecond stamps: whole when within `_EPS` of a whole number (2.9999999999999716 -> 3)."""
    whole = round(steps) if math.isfinite(steps) else steps
    return float(whole) if abs(steps - whole) <= _EPS else steps


def _describe(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"count": 0, "mean": 0.0, "median": 0.0, "min": 0.0, "max": 0.0}
    return {"count": int(values.size), "mean": float(values.mean()), "median": float(np.median(values)),
            "min": float(values.min()), "max": float(values.max())}


@dataclass
class _Segment:
    """Commands for the consecutive control steps first, first + 1, ... (a chunk resampled, or a plan)."""

    first: int
    values: np.ndarray  # [n, dof]

    @property
    def end(self) -> int:  # one past the last covered step
        return self.first + len(self.values)

    def at(self, step: int) -> np.ndarray | None:
        return self.values[step - self.first] if self.first <= step < self.end else None


def rtc_prefix_weights(delay: int, end: int, total: int) -> np.ndarray:
    """RTC's soft mask (eq. 5, exponential schedule, `rtc_mask.py`) over chunk indices 0..total-1.

    Indices before `delay` were executed while the model ran (weight 1), indices from `end` on do not overlap the
    committed plan (weight 0), and in between a linear ramp w is shaped to w * (e^w - 1) / (e - 1).
    """
    return prefix_weights(Schedule.EXP, delay, end, total)


class ChunkExecutor:
    """Holds the received chunks and yields the command for each control step (`next_command`).

    Not thread-safe: callers that receive chunks on another thread serialize `add_chunk` and `next_command`.
    """

    def __init__(self, dof: int, dt: float, mode: str = "rtc", ensemble_m: float = 0.01, rtc_overlap: int = 0,
                 initial_command: np.ndarray | None = None, start_step: int = 0):
        if mode not in BLENDING_MODES:
            raise ValueError(f"unknown blending mode {mode!r}; choose from {BLENDING_MODES}")
        if dt <= 0 or dof <= 0 or rtc_overlap < 0:
            raise ValueError("dt and dof must be positive, rtc_overlap >= 0")
        self.dof, self.dt, self.mode = dof, dt, mode
        self.ensemble_m = ensemble_m
        self.rtc_overlap = rtc_overlap  # 0: blend over the whole remaining committed plan
        self.step = start_step          # the next control step to command
        self.stats = ExecutorStats()
        self._plan: _Segment | None = None            # newest_wins / rtc: the committed future
        self._chunks: list[_Segment] = []             # temporal_ensemble: every live chunk, oldest first
        self._last: np.ndarray | None = None
        self._history: list[np.ndarray] = []          # last 3 commands, for jerk
        self._newest_source = -math.inf
        self._min_source = -math.inf
        self._switch_pending = False
        if initial_command is not None:
            self.reset(initial_command)

    def reset(self, hold_command: np.ndarray | None) -> None:
        """Start a new episode at the current step: drop all chunks, hold `hold_command` until one arrives (None:
        nothing to hold, for a caller that only reads `plan()`).

        Chunks sourced before this step belong to the previous episode and are rejected when they arrive.
        """
        self._plan, self._chunks = None, []
        self._last = None if hold_command is None else np.asarray(hold_command, dtype=np.float64).copy()
        self._history = []
        self._newest_source = -math.inf
        self._min_source = self.step - _EPS
        self._switch_pending = False

    def add_chunk(self, actions: np.ndarray, stamp: float, time_step: float,
                  frame_stamp: float | None = None) -> ChunkArrival:
        """Receive a chunk whose action i is for time `stamp + i * time_step` (seconds on the control clock,
        where control step t is at t * dt). It takes effect from the next `next_command` call.

        `frame_stamp` is the time of the camera frame it was computed from (default `stamp`: a chunk whose first
        action is for the frame's own step); latency is counted from it. A policy whose first action is for the
        step after its frame (trajectory points from time_from_start = dt) thus reports its true delay, not
        one step less.
        """
        actions = np.asarray(actions, dtype=np.float64)
        source = stamp / self.dt
        arrival = self.step
        latency = _snap(arrival - (source if frame_stamp is None else frame_stamp / self.dt))

        def reject(reason: str) -> ChunkArrival:
            self.stats.chunks_rejected += 1
            return ChunkArrival(False, reason, source, arrival, latency)

        if actions.ndim != 2 or actions.shape[1] != self.dof or len(actions) == 0:
            return reject(f"expected actions [H, {self.dof}], got {actions.shape}")
        if not np.all(np.isfinite(actions)) or not math.isfinite(stamp):
            return reject("non-finite actions or stamp")
        if len(actions) > 1 and not time_step > 0:
            return reject(f"time_step must be positive, got {time_step}")
        if source < self._min_source:
            return reject("sourced before the episode started")
        if source < self._newest_source:
            return reject("older than a chunk already received")
        segment = _resample(actions, source, time_step / self.dt if len(actions) > 1 else 1.0, arrival)
        if segment is None:
            return reject("every action is for a step already executed")
        self._newest_source = source
        if self.mode == "temporal_ensemble":
            self._chunks.append(segment)
        else:
            self._plan = self._handover(segment, source)
        self.stats.chunks_accepted += 1
        self.stats.latencies.append(latency)
        self._switch_pending = True
        return ChunkArrival(True, "", source, arrival, latency)

    def _handover(self, new: _Segment, source: float) -> _Segment:
        old = self._plan
        if self.mode == "newest_wins" or old is None or old.end <= new.first:
            return new
        # rtc: blend toward the committed plan where the two overlap, with RTC's weights indexed from the source.
        overlap_end = min(old.end, new.end)
        if self.rtc_overlap:
            overlap_end = min(overlap_end, new.first + self.rtc_overlap)
        start = math.ceil(source - _EPS)
        weights = rtc_prefix_weights(new.first - start, overlap_end - start, new.end - start)[new.first - start:]
        values = new.values.copy()
        n = overlap_end - new.first
        committed = old.values[new.first - old.first: new.first - old.first + n]
        values[:n] = weights[:n, None] * committed + (1.0 - weights[:n, None]) * values[:n]
        return _Segment(new.first, values)

    def next_command(self) -> np.ndarray:
        """The command for control step `self.step`; advances to the next step."""
        step = self.step
        command = self._blend(step)
        held = command is None
        if held:
            if self._last is None:
                raise RuntimeError("no chunk covers the first step and no initial command was given")
            command = self._last
        self._record(command, held)
        self._last = command
        self.step += 1
        self._chunks = [c for c in self._chunks if c.end > self.step]
        return command.copy()

    def advance_to(self, step: int) -> None:
        """Move to control step `step` as if every step before it had been commanded (a trajectory controller
        executed the published plan meanwhile). Steps past everything planned are counted as held in one go, so
        a long gap costs nothing."""
        while self.step < step and self._covered_end() > self.step:
            if self._last is None and self._blend(self.step) is None:  # before the first command: nothing to hold
                self._skip(1)
            else:
                self.next_command()
        if self.step < step:
            self._skip(step - self.step)

    def _skip(self, steps: int) -> None:
        self.stats.steps += steps
        self.stats.held_steps += steps
        if self._last is not None:  # holding: the jerk history sees a still command
            self._history = [*self._history, *[self._last] * min(steps, 4)][-4:]
        self.step += steps
        self._chunks = [c for c in self._chunks if c.end > self.step]

    def plan(self) -> tuple[int, np.ndarray]:
        """(first step, commands [n, dof]) for the consecutive steps from the current one (or from the first later
        step a chunk covers) that the received chunks cover, blended as `next_command` would; n = 0 when none
        does. Nothing is held or invented: every row comes from a received chunk. Does not advance."""
        end = self._covered_end()
        first = next((t for t in range(self.step, end) if self._blend(t) is not None), end)
        rows = []
        for t in range(first, end):
            command = self._blend(t)
            if command is None:  # a gap between chunks: the plan stops before it
                break
            rows.append(command)
        return first, np.array(rows).reshape(len(rows), self.dof)

    def _covered_end(self) -> int:
        """One past the last step any received chunk covers."""
        if self.mode != "temporal_ensemble":
            return self._plan.end if self._plan is not None else self.step
        return max((c.end for c in self._chunks), default=self.step)

    def _blend(self, step: int) -> np.ndarray | None:
        """The command for `step` from the chunks held now (reads only: chunks that ended are pruned on advance)."""
        if self.mode != "temporal_ensemble":
            return None if self._plan is None else self._plan.at(step)
        predictions = [v for v in (c.at(step) for c in self._chunks) if v is not None]
        if not predictions:
            return None
        weights = np.exp(-self.ensemble_m * np.arange(len(predictions)))
        return (weights[:, None] * np.stack(predictions)).sum(axis=0) / weights.sum()

    def _record(self, command: np.ndarray, held: bool) -> None:
        stats = self.stats
        stats.steps += 1
        stats.held_steps += int(held)
        if self._switch_pending and not held and self._last is not None:
            stats.switch_discontinuities.append(float(np.abs(command - self._last).max()))
        self._switch_pending = self._switch_pending and held
        self._history = [*self._history[-3:], command]
        if len(self._history) == 4:
            h0, h1, h2, h3 = self._history
            jerk = float(np.abs(h3 - 3 * h2 + 3 * h1 - h0).max()) / self.dt**3
            stats.jerk_max = max(stats.jerk_max, jerk)
            stats.jerk_sq_sum += jerk**2
            stats.jerk_count += 1


def _resample(actions: np.ndarray, source: float, stride: float, first_allowed: int) -> _Segment | None:
    """The chunk's commands for the control steps from `first_allowed` on that it covers (linear in between)."""
    last_position = source + (len(actions) - 1) * stride
    first = max(first_allowed, math.ceil(source - _EPS))
    last = math.floor(last_position + _EPS)
    if last < first:
        return None
    u = np.clip((np.arange(first, last + 1) - source) / stride, 0.0, len(actions) - 1)
    lo = np.minimum(np.floor(u + _EPS).astype(np.int64), len(actions) - 1)
    frac = u - lo
    frac[frac < _EPS] = 0.0  # on a control step: the action itself, bit for bit
    hi = np.minimum(lo + 1, len(actions) - 1)
    return _Segment(first, actions[lo] * (1.0 - frac[:, None]) + actions[hi] * frac[:, None])
