"""The robot side's fence: only the replica that owns the robot now may command it.

Every reply from the pool carries ``placement: {"epoch", "replica"}`` (`routing.Route`). The fence keeps the newest
ownership it has seen for its robot and drops a chunk with an older epoch (a replica the robot was moved away from,
answering late or from the far side of a partition), or with the same epoch from another replica (which no placement
makes). A chunk without the field is dropped too: nothing unfenced reaches the robot. Drops are counted by reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

PLACEMENT_KEY = "placement"


class ChunkFence:
    def __init__(self):
        self.epoch = -1
        self.replica: str | None = None
        self.dropped: Counter = Counter()

    def admit(self, reply: Mapping) -> bool:
        """True when `reply` comes from the robot's current owner (which it may make current); False, counted,
        otherwise."""
        placement = reply.get(PLACEMENT_KEY)
        if not isinstance(placement, Mapping) or not isinstance(placement.get("epoch"), int) \
                or not isinstance(placement.get("replica"), str):
            self.dropped["unfenced"] += 1
            return False
        epoch, replica = placement["epoch"], placement["replica"]
        if epoch < self.epoch:
            self.dropped["stale_epoch"] += 1
            return False
        if epoch == self.epoch and replica != self.replica:
            self.dropped["other_replica"] += 1
            return False
        self.epoch, self.replica = epoch, replica
        return True
