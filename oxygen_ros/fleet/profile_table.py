"""The profile table (LUT): stage latency per (model, stage, batch bucket, partition share), and the cost model
the scheduler plans with from it.

Planners never time anything at decision time; they look latencies up here. A *share* is the fraction of the
device a stage gets (SM share on a GPU, thread budget on a CPU). The table comes from either timing the served
models' stages (`profiler.py`), or ``synthetic_table`` (a documented latency model, used when no measured profile
is available). Batch sizes between profiled buckets are linearly interpolated; shares are discrete partition
choices and must be looked up exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.cost_models import LearnedCost
from ..engine.planners import Stage


def _share_key(share: float) -> float:
    return round(float(share), 6)


@dataclass
class ProfileTable:
    """Latency lookup table; ``meta`` records where the numbers came from (measured or synthetic, and how)."""

    entries: dict[tuple[str, str, int, float], float] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    # solo lookups, asked at every planning decision: cleared by `add`
    _solo: dict[tuple[str, str, int], tuple[float, float]] = field(default_factory=dict, repr=False, compare=False)

    def add(self, model_id: str, stage: Stage, batch: int, share: float, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError("a stage latency must be positive")
        self._solo.clear()
        self.entries[(model_id, Stage(stage).value, int(batch), _share_key(share))] = float(seconds)

    def models(self) -> list[str]:
        return sorted({key[0] for key in self.entries})

    def shares(self, model_id: str, stage: Stage) -> list[float]:
        stage = Stage(stage).value
        return sorted({k[3] for k in self.entries if k[0] == model_id and k[1] == stage})

    def batches(self, model_id: str, stage: Stage, share: float) -> list[int]:
        stage, share = Stage(stage).value, _share_key(share)
        return sorted(k[2] for k in self.entries if k[0] == model_id and k[1] == stage and k[3] == share)

    def latency(self, model_id: str, stage: Stage, batch: int, share: float = 1.0) -> float:
        """Seconds for one ``stage`` batch of ``batch`` requests on ``share`` of the device.

        Exact hit if profiled; otherwise linear in batch between the neighbouring buckets, and linear
        extrapolation from the last two buckets beyond the largest (batch cost is close to affine there)."""
        stage = Stage(stage)
        key = (model_id, stage.value, int(batch), _share_key(share))
        if key in self.entries:
            return self.entries[key]
        sizes = self.batches(model_id, stage, share)
        if not sizes:
            raise KeyError(f"no profile for model={model_id} stage={stage.value} share={share}")
        if batch < sizes[0]:
            raise KeyError(f"batch {batch} below the smallest profiled batch {sizes[0]}")
        if len(sizes) == 1:
            raise KeyError(
                f"batch {batch} not profiled and only batch {sizes[0]} is known to interpolate from"
            )
        upper = next((s for s in sizes if s > batch), None)
        lo, hi = (sizes[-2], sizes[-1]) if upper is None else (max(s for s in sizes if s < batch), upper)
        t_lo = self.entries[(model_id, stage.value, lo, _share_key(share))]
        t_hi = self.entries[(model_id, stage.value, hi, _share_key(share))]
        return t_lo + (t_hi - t_lo) * (batch - lo) / (hi - lo)

    def fastest_share(self, model_id: str, stage: Stage, batch: int) -> float:
        """The profiled share on which ``stage`` alone runs fastest: what a call that has the device to itself
        should use. On a GPU that is the whole device; on a loaded CPU fewer threads can beat all of them."""
        shares = self.shares(model_id, stage)
        if not shares:
            raise KeyError(f"no profile for model={model_id} stage={Stage(stage).value}")
        return min(shares, key=lambda share: (self.latency(model_id, stage, batch, share), -share))

    def solo(self, model_id: str, stage: Stage, batch: int) -> tuple[float, float]:
        """(share, seconds) of ``stage`` with the device to itself: on its fastest share."""
        key = (model_id, Stage(stage).value, batch)
        if key not in self._solo:
            share = self.fastest_share(model_id, stage, batch)
            self._solo[key] = share, self.latency(model_id, stage, batch, share)
        return self._solo[key]

    def scaled(self, factor: float) -> ProfileTable:
        """Every latency times ``factor`` (e.g. the slowdown a loaded machine showed during a run)."""
        meta = {**self.meta, "scaled_by": factor * self.meta.get("scaled_by", 1.0)}
        return ProfileTable({k: v * factor for k, v in self.entries.items()}, meta)

    def to_dict(self) -> dict:
        rows = [
            {"model": m, "stage": s, "batch": b, "share": sh, "seconds": t}
            for (m, s, b, sh), t in sorted(self.entries.items())
        ]
        return {"meta": self.meta, "entries": rows}

    @classmethod
    def from_dict(cls, data: dict) -> ProfileTable:
        table = cls(meta=dict(data.get("meta", {})))
        for row in data["entries"]:
            table.add(row["model"], Stage(row["stage"]), row["batch"], row["share"], row["seconds"])
        return table

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> ProfileTable:
        return cls.from_dict(json.loads(Path(path).read_text()))


def mean_table(a: ProfileTable, b: ProfileTable) -> ProfileTable:
    """Two profiles of the same entries averaged entry by entry (and their co-run slowdowns): on a machine whose
    load changes, a profile taken before a run and one taken after it bracket the run better than either."""
    if set(a.entries) != set(b.entries):
        raise ValueError("the two profiles do not cover the same (model, stage, batch, share) entries")
    meta = {"source": "mean of two measured profiles"}
    if "co_run_slowdown" in a.meta and "co_run_slowdown" in b.meta:
        meta["co_run_slowdown"] = (a.meta["co_run_slowdown"] + b.meta["co_run_slowdown"]) / 2
    return ProfileTable({key: (t + b.entries[key]) / 2 for key, t in a.entries.items()}, meta)


class ProfileCost:
    """A profile table as the scheduler's cost model. A batch's prefill + denoising in one call (the monolithic
    planner) is its VLM stage then its action stage on one share of the device, the one where the two together are
    fastest (the whole GPU; on a loaded CPU fewer threads than all can win). Decode steps are not in the table:
    they are learned as the runtime runs them (`LearnedCost`)."""

    def __init__(self, table: ProfileTable):
        self.table = table
        self._decode = LearnedCost()
        self._whole: dict[tuple[str, int], tuple[float, float]] = {}

    def _fastest_whole(self, model_id: str, batch: int) -> tuple[float, float]:
        """(share, seconds) of both stages back to back on the one share where that is fastest."""
        key = (model_id, batch)
        if key not in self._whole:
            shares = set(self.table.shares(model_id, Stage.VLM)) & set(self.table.shares(model_id, Stage.ACTION))
            if not shares:
                raise KeyError(f"no share with both stages of model={model_id} profiled")
            self._whole[key] = min(((s, sum(self.table.latency(model_id, stage, batch, s) for stage in Stage))
                                    for s in shares), key=lambda item: (item[1], -item[0]))
        return self._whole[key]

    def action_s(self, model_id: str, batch: int) -> float:
        return self._fastest_whole(model_id, batch)[1]

    def action_share(self, model_id: str, batch: int) -> float:
        return self._fastest_whole(model_id, batch)[0]

    def decode_s(self, model_id: str, batch: int) -> float:
        return self._decode.decode_s(model_id, batch)

    def observe(self, model_id: str, kind: str, batch: int, seconds: float) -> None:
        if kind == "decode":
            self._decode.observe(model_id, kind, batch, seconds)


def find_inversions(table: ProfileTable, tolerance: float = 0.05) -> list[str]:
    """Entries that break what a clean profile shows: a bigger batch faster than a smaller one, or more of the
    device slower than less, each by more than ``tolerance`` (relative). On a shared machine these are noise or
    real effects (too many threads for the cores free); either way a scheduler reading the table should know."""
    found = []
    for model_id in table.models():
        for stage in Stage:
            shares = table.shares(model_id, stage)
            for share in shares:
                sizes = table.batches(model_id, stage, share)
                for small, big in zip(sizes, sizes[1:]):
                    t_small, t_big = (table.latency(model_id, stage, b, share) for b in (small, big))
                    if t_big < t_small * (1 - tolerance):
                        found.append(f"{model_id} {stage.value} share {share:g}: batch {big} "
                                     f"{1e3 * t_big:.2f} ms < batch {small} {1e3 * t_small:.2f} ms")
            for less, more in zip(shares, shares[1:]):
                for batch in set(table.batches(model_id, stage, less)) & set(table.batches(model_id, stage, more)):
                    t_less, t_more = (table.latency(model_id, stage, batch, s) for s in (less, more))
                    if t_more > t_less * (1 + tolerance):
                        found.append(f"{model_id} {stage.value} batch {batch}: share {more:g} {1e3 * t_more:.2f} ms"
                                     f" > share {less:g} {1e3 * t_less:.2f} ms")
    return sorted(found)


@dataclass(frozen=True)
class SyntheticLatencyModel:
    """Latency model for the synthetic LUT (used only when no measured profile is given).

    ``t(b, s) = overhead + scale * per_item * b**batch_exponent * s**(-share_exponent)`` per stage, where

    - ``overhead`` is a fixed per-call cost (launches, host work) that neither batching nor compute removes;
    - ``batch_exponent < 1``: sublinear batching, a bigger batch uses the device better;
    - ``share_exponent``: how much a stage slows down on a fraction ``s`` of the device. The VLM prefill (hundreds
      of prefix tokens through the 2B backbone) is compute bound, close to 1; the action expert (a small model,
      a few dozen tokens, ten denoising steps) is launch/latency bound and barely notices a smaller share.
      That asymmetry is what makes running both stages side by side on partitions beat running them back to
      back on the whole device.
    Defaults are of the order of a ~3B pi0.5 on one data-center GPU (tens of ms per call); ``scale`` per model
    stands for variants / architectures of different size."""

    vlm_overhead_s: float = 0.004
    vlm_per_item_s: float = 0.016
    vlm_share_exponent: float = 0.9
    action_overhead_s: float = 0.004
    action_per_item_s: float = 0.008
    action_share_exponent: float = 0.35
    batch_exponent: float = 0.6

    def latency(self, stage: Stage, batch: int, share: float, scale: float = 1.0) -> float:
        if Stage(stage) is Stage.VLM:
            overhead, per_item, exponent = self.vlm_overhead_s, self.vlm_per_item_s, self.vlm_share_exponent
        else:
            overhead, per_item, exponent = (
                self.action_overhead_s,
                self.action_per_item_s,
                self.action_share_exponent,
            )
        return overhead + scale * per_item * batch**self.batch_exponent * share ** (-exponent)


def synthetic_table(
    model_scales: dict[str, float],
    buckets: Iterable[int] = (1, 2, 4, 8),
    shares: Iterable[float] = tuple(round(0.1 * i, 1) for i in range(1, 11)),
    latency_model: SyntheticLatencyModel = SyntheticLatencyModel(),
) -> ProfileTable:
    """A LUT computed from ``latency_model`` instead of measured; ``meta`` says so, and how."""
    table = ProfileTable(
        meta={
            "source": "synthetic",
            "formula": "overhead + scale*per_item*b**batch_exponent*share**(-share_exponent)",
            "latency_model": latency_model.__dict__,
            "model_scales": dict(model_scales),
        }
    )
    buckets, shares = list(buckets), list(shares)
    for model_id, scale in model_scales.items():
        for stage in Stage:
            for bucket in buckets:
                for share in shares:
                    table.add(
                        model_id, stage, bucket, share, latency_model.latency(stage, bucket, share, scale)
                    )
    return table
