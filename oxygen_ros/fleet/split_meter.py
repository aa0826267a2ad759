"""What a Robion device measures of its two ways to run a VLM batch, and the choice between them it makes from that.

A VLM batch of one model and bucket can be pipelined (the lockstep splits the device: this batch beside an action
batch, its own action stage in a later lockstep) or run back to back (its two stages one after the other, each
with the device to itself: the monolithic step). The profile table predicts both, but a co-run on a loaded CPU
or a busy GPU is not what the profile saw, so the device keeps, per (model, bucket), what each way really took:
the ratio of a finished job's measured time (its end minus its start, on the clock the planner is told) to the
table's prediction for it, a running median over the last `WINDOW` jobs. The table seeds it: a split starts at
the planning guard (the co-run slowdown the profile measured, or the configured guard), back to back at 1.

The choice (`pipeline_pays`): pipelining a batch pays when a split lockstep of it (beside an action batch of its
own model and bucket, on the best share) measures faster than its two stages back to back: more frames through
the device per second. No margin: a pipelined frame does wait a lockstep more between its stages, a known cost.

Exploration: the way that measures worse for a (model, bucket) is tried again once `EXPLORE_EVERY` of its VLM
batches have run since it was last tried, at the first such batch that leaves no frame waiting behind it (nothing
queued for a VLM stage, no action batch waiting), and a split only where the batch's frames would still make their
deadline through two split locksteps. So the way not taken is measured again only when the device has a moment to
spare; the way taken is measured at every job. Two other rules were tried and dropped, both in the simulator on
the measured CPU table (`test/data/fleet_cpu_lut.json`, interference 1.18), where they took Robion from 24 robots
at 98 % to 12: exploring one batch in 8 whatever the queue, and running a batch back to back wherever its most
urgent frame would miss its deadline through two locksteps but not back to back. Each put a longer back-to-back
job into a saturated stream of split locksteps, the other model's queued frames could then no longer make their
deadlines, and earliest-SLO-first ranks such frames last, so they expired.
`WINDOW` and `EXPLORE_EVERY` are chosen, not tuned on the simulator: they say how many jobs it takes for a change in
the machine to move the choice (about `WINDOW / 2` of a way's jobs move its median).
"""

from __future__ import annotations

import statistics
from collections import deque
from enum import StrEnum

WINDOW = 8
"""Jobs per (model, bucket) and way whose measured/predicted ratio the running median is taken over."""
EXPLORE_EVERY = 8
"""VLM batches of a (model, bucket) after which the way measuring worse is tried again (when the device is idle)."""

Key = tuple[str, int]
"""(model id, batch bucket) of a VLM batch."""


class Way(StrEnum):
    SPLIT = "split"  # pipelined: the device split between this VLM batch and an action batch
    BACK_TO_BACK = "back_to_back"  # the batch's two stages one after the other (the monolithic step)


def pipeline_pays(split_s: float, back_to_back_s: float) -> bool:
    """Whether to pipeline a VLM batch whose split lockstep takes `split_s` and whose two stages back to back take
    `back_to_back_s` (as measured): the split is faster."""
    return split_s < back_to_back_s


class SplitMeter:
    """Per (model, bucket) and way: the running median of measured / predicted job time, seeded by the table."""

    def __init__(self, split_prior: float, window: int = WINDOW):
        if split_prior <= 0 or window < 1:
            raise ValueError("the split prior must be > 0 and the window at least 1 job")
        self.priors = {Way.SPLIT: split_prior, Way.BACK_TO_BACK: 1.0}
        self.window = window
        self._ratios: dict[tuple[Key, Way], deque[float]] = {}
        self._measured: dict[tuple[Key, Way], int] = {}

    def _window(self, key: Key, way: Way) -> deque[float]:
        if (key, way) not in self._ratios:  # the table's figure counts as one job until measured ones push it out
            self._ratios[key, way] = deque([self.priors[way]], maxlen=self.window)
        return self._ratios[key, way]

    def ratio(self, key: Key, way: Way) -> float:
        """What `way` takes for `key` relative to the table's prediction (the prior until measured)."""
        return statistics.median(self._window(key, way))

    def record(self, key: Key, way: Way, measured_s: float, predicted_s: float) -> None:
        """A job of `key` run `way` took `measured_s` where the table predicted `predicted_s`."""
        if predicted_s <= 0 or measured_s < 0:
            return  # nothing to learn from (a job with no predicted time, a clock that went back)
        self._window(key, way).append(measured_s / predicted_s)
        self._measured[key, way] = self._measured.get((key, way), 0) + 1

    def measured(self, key: Key, way: Way) -> int:
        """How many jobs of `key` run `way` were measured."""
        return self._measured.get((key, way), 0)

    def report(self) -> dict[str, dict[str, float | int]]:
        """Per "model/bucket": each way's current ratio and how many jobs measured it."""
        keys = sorted({key for key, _ in self._ratios})
        return {f"{m}/{b}": {**{f"{w}_ratio": self.ratio((m, b), w) for w in Way},
                             **{f"{w}_jobs": self.measured((m, b), w) for w in Way}} for m, b in keys}
