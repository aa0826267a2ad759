"""How a fleet device runs its frames: the serving designs, each a stage planner of the engine's scheduler.

- `monolithic`: the engine's own path (`engine.planners.MonolithicPlanner`): a batch's prefill and denoise in one
  call on the whole device, models taking turns by the queue policy;
- `robion`: the lockstep (`lockstep.LockstepPlanner`): one VLM batch and one action batch side by side on
  complementary shares chosen from the profile table with a guard, or a batch's two stages back to back where the
  device measures that faster or its frames' deadlines do not allow pipelining;
- `disaggregated`: the static split (`static_split.StaticSplitPlanner`): each stage on a fixed share.

A fleet server runs these on the wall clock and the simulator on a simulated one, with the same queue policy and
the profile table as the cost model, so the simulator's figures describe what a server runs.
"""

from __future__ import annotations

from collections.abc import Callable

from ..engine.cost_models import CostModel
from ..engine.planners import MonolithicPlanner, StagePlanner
from ..engine.scheduler import SchedulerConfig
from .co_run import DEFAULT_GUARD
from .lockstep import LockstepPlanner
from .profile_table import ProfileTable
from .static_split import StaticSplitPlanner

DESIGNS = ("monolithic", "robion", "disaggregated")
DEFAULT_DESIGN = "monolithic"
"""The one default design of every node, command and simulation: it needs no profile table and runs anywhere;
`robion` is the choice where a table is measured (whether it serves more robots than monolithic is a measurement:
docs/fleet.md)."""
STAGE_SPLITS = {"robion": LockstepPlanner, "disaggregated": StaticSplitPlanner}


def make_planner(design: str, config: SchedulerConfig, cost: CostModel, lut: ProfileTable | None = None,
                 guard: float = DEFAULT_GUARD, vlm_room: Callable[[str], int] | None = None) -> StagePlanner:
    """The planner of `design` with `config`'s queue policy, batch limit and deadline drops. A stage split plans
    from `lut` with `guard`; `vlm_room` bounds its VLM batches by the frame slots left (real serving)."""
    if design == "monolithic":
        return MonolithicPlanner(config.queue, config.max_batch, config.drop_expired, cost)
    if design not in STAGE_SPLITS:
        raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")
    if lut is None:
        raise ValueError(f"the {design} design plans from a profile table")
    return STAGE_SPLITS[design](lut, policy=config.queue, max_batch=config.max_batch, guard=guard,
                                drop_expired=config.drop_expired, vlm_room=vlm_room)
