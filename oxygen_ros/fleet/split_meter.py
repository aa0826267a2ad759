"""What a Robion device measures of its two ways to run a VLM batch, and the choice between them it makes from that.

A VLM batch of one model and bucket can be pipelined (the lockstep splits the device: this batch beside an action
batch, its own action stage in a later lockstep) or run back to back (its two stages one after the other, each
with the device to itself: the monolithic step). The profile table predicts both, but a co-run on a loaded CPU
or a busy GPU is not what the profile saw, so the device keeps, per (model, bucket), what each way really took:
the ratio of a finished job's measured time (its end minus its start, on the clock the planner is told) to the
table's prediction for it, a running median over the last `WINDOW` jobs. The table seeds it: a split starts at
the planning guard (the co-run slowdown the profile measured, or the configured guard), back to back at 1.

The choice (`pipeline_pays`): pipelining a batch pays when a split lockstep of it (beside an action batch of its
own model and bucket, on the best share) measures faster than its two stages back to back, and its frames still
make their deadline that way: a pipelined frame's stages run in two locksteps, so its chunk is at least two split
locksteps away; where back to back would miss the deadline too, the faster way is taken. No margin: the latency
a pipelined frame pays is checked against its own deadline, not covered by a tuned constant.

Exploration: the way that measures worse for a (model, bucket) still runs once in every `EXPLORE_EVERY` of its
VLM batches (a split only where its frames are predicted to make their deadline), so a measurement that has gone
stale (the machine's load changed) is renewed. That bounds what exploring costs to one batch in `EXPLORE_EVERY`.
`WINDOW` and `EXPLORE_EVERY` are chosen, not tuned on the simulator: together they say how many jobs it takes
for a change in the machine to move the choice (about `WINDOW / 2` of a way's jobs move its median).
"""

from __future__ import annotations

import statistics
from collections import deque
from enum import StrEnum

WINDOW = 8
"""Jobs per (model, bucket) and way whose measured/predicted ratio the running median is taken over."""
EXPLORE_EVERY = 8
"""A (model, bucket)'s VLM batches that run the way measuring worse: one in this many."""

Key = tuple[str, int]
"""(model id, batch bucket) of a VLM batch."""


class Way(StrEnum):
    SPLIT = "split"  # pipelined: the device split between this VLM batch and an action batch
    BACK_TO_BACK = "back_to_back"  # the batch's two stages one after the other (the monolithic step)


def pipeline_pays(split_s: float, back_to_back_s: float, slack_s: float) -> bool:
    """Whether to pipeline a VLM batch whose split lockstep takes `split_s` and whose two stages back to back take
    `back_to_back_s`, with `slack_s` until its most urgent frame's deadline: the split is faster and a pipelined
    frame (two locksteps) still makes the deadline, or the split is faster and back to back would miss it too."""
    if split_s >= back_to_back_s:
        return False
    return 2.0 * split_s <= slack_s or back_to_back_s > slack_s


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
