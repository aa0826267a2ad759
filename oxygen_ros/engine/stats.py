"""Percentiles of latency samples, the one definition every report uses (nearest rank on the sorted samples)."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(samples: Iterable[float], q: float, empty: float = 0.0) -> float:
    """The `q` quantile (0..1) of `samples`; `empty` when there are none."""
    ordered = sorted(samples)
    if not ordered:
        return empty
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
