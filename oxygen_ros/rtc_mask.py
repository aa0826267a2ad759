"""Real-time chunking's prefix mask (Black, Galliker, Levine 2025, arXiv 2506.07339, eq. 5), in one place for both
of its users: the guided sampler (`model/rtc.py`), which weights its guidance with it, and the chunk executor's
`rtc` blend (`control/chunk_executor.py`), which blends a new chunk into the committed plan with it. NumPy only,
so the control side stays free of torch.

Over a chunk's indices i: 1 for the `delay` actions committed while the model ran, the schedule's decay over
delay <= i < end, 0 from `end` on (the previous chunk's left-over is not followed past it). The decay starts from
c_i = (end - i) / (end - delay + 1), below 1 and above 0.
"""

from __future__ import annotations

import math
from enum import StrEnum

import numpy as np


class Schedule(StrEnum):
    """The decay between the committed actions and `end` (eq. 5 is EXP; LeRobot's `RTCAttentionSchedule` names
    the same four)."""

    ZEROS = "zeros"  # nothing: only the committed actions count
    ONES = "ones"  # every action up to `end` counts fully
    LINEAR = "linear"  # c_i
    EXP = "exp"  # c_i (e^c_i - 1) / (e - 1)


def prefix_weights(schedule: Schedule | str, delay: int, end: int, total: int) -> np.ndarray:
    """The mask [total] float64; a delay past `end` counts as `end` (nothing beyond `end` is weighted)."""
    schedule = Schedule(schedule)
    delay = min(delay, end)
    i = np.arange(total, dtype=np.float64)
    c = (end - i) / (end - delay + 1)
    if schedule is Schedule.ZEROS:
        soft = np.zeros(total)
    elif schedule is Schedule.ONES:
        soft = np.ones(total)
    elif schedule is Schedule.LINEAR:
        soft = c
    else:
        soft = c * np.expm1(c) / (math.e - 1)
    return np.where(i < delay, 1.0, np.where(i < end, soft, 0.0))
