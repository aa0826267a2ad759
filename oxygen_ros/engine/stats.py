"""Percentiles of latency samples, the one definition every report uses (nearest rank on the sorted samples)."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(samples: Iterable[float], q: float, empty: float = 0.0) -> float:
    """The `q` quantile (0..1) of `samples`; `empty` when there are none."""
    ordered = sorted(samples)
    if not ordered:
        return empty
    return float(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))])


def percentile_ms(samples_s: Iterable[float], q: float, empty: float = 0.0) -> float:
    """`percentile` of samples in seconds, in milliseconds; `empty` (as is) when there are none."""
    ordered = sorted(samples_s)
    return 1e3 * percentile(ordered, q) if ordered else empty
