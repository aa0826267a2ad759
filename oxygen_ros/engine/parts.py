"""What the runtime's threads share: the scheduler, the model runners, the gate, the outcomes and the clock.

The runtime builds these once and hands them to its control path (`control_path.py`, or `stage_control.py` with a
stage split) and its language worker (`language_worker.py`); each of those uses only what is here, so none of
them reaches into another's state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .control_gate import ControlGate
from .model_runner import ModelRunner, PriorityStreams
from .outcomes import Outcomes
from .scheduler import Scheduler


@dataclass
class RuntimeParts:
    scheduler: Scheduler
    runners: Mapping[str, ModelRunner]
    gate: ControlGate  # the control path first, the language worker in what it leaves
    streams: PriorityStreams  # on a GPU: the control path's high-priority stream and the worker's low one
    outcomes: Outcomes
    clock: Callable[[], float]  # the scheduler's clock: arrivals, deadlines, plans, chunks (the wall clock)
    # frames arrive from any thread: the planner's queues change under this lock
    frames_lock: threading.Lock = field(default_factory=threading.Lock)
    # the scheduler's and pools' state, for the moments both threads may run (decode steps beside a denoising)
    state_lock: threading.RLock = field(default_factory=threading.RLock)
    wake: threading.Event = field(default_factory=threading.Event)  # something for the language worker to do

    def owe_for_frame(self) -> None:
        """A frame's action ran: it owes the language worker the decode steps the scheduler says (fixed k, or
        adaptive k's floor), which the next control section waits for."""
        owed = self.scheduler.owe_for_frame()
        if owed is not None:
            self.gate.owe(owed)
