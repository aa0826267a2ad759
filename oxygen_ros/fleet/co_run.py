"""The co-run figures everything that plans a fleet uses: the lockstep's guard and the interference it expects.

Two stages side by side on complementary shares run slower than the table's solo latencies say. A measured table
records by how much (`profiler.co_run_slowdown`: ``meta["co_run_slowdown"]``, the median over model, share and
bucket). Every planner reads the figure from here, so a fleet node, the placement (`fleet-assign`, the fleet
controller) and the simulator plan with the same numbers:

- the guard: co-running stages are predicted at table latency x max(the configured guard, the measured
  slowdown); a guard below the real slowdown splits the device where back to back is faster;
- the interference: what a co-running stage really costs, the measured slowdown; a table that measured none (the
  synthetic table) gets `ASSUMED_INTERFERENCE`, and `interference_source` says which it is.
"""

from __future__ import annotations

from .profile_table import ProfileTable

DEFAULT_GUARD = 1.1
"""The lockstep's headroom when the table measured a lower slowdown, or none."""
ASSUMED_INTERFERENCE = 1.05
"""The co-run slowdown assumed for a table that measured none (the synthetic table): an assumption, not a
measurement."""


def measured_slowdown(table: ProfileTable) -> float | None:
    """The table's measured co-run slowdown (>= 1), or None when it has none."""
    value = table.meta.get("co_run_slowdown")
    if value is None:
        return None
    value = float(value)
    if not value >= 1.0:  # also refuses NaN
        raise ValueError(f"the profile table's co_run_slowdown must be >= 1, got {value}")
    return value


def planning_guard(table: ProfileTable, guard: float = DEFAULT_GUARD) -> float:
    """The guard a lockstep plans with on `table`: `guard`, raised to the measured co-run slowdown."""
    if guard < 1.0:
        raise ValueError("the interference guard is a latency inflation factor and must be >= 1")
    return max(guard, measured_slowdown(table) or 1.0)


def planning_interference(table: ProfileTable) -> float:
    """The slowdown of co-running stages to expect on `table`: measured, else `ASSUMED_INTERFERENCE`."""
    measured = measured_slowdown(table)
    return ASSUMED_INTERFERENCE if measured is None else measured


def interference_source(table: ProfileTable) -> str:
    """Where `planning_interference` comes from, for a report."""
    measured = measured_slowdown(table)
    if measured is None:
        return f"assumed {ASSUMED_INTERFERENCE:g} (the table measured no co-run slowdown)"
    return f"measured {measured:.3f} (the table's co-run slowdown)"
