"""The runtime's language worker: decode steps in what the control path leaves, and every text update.

Inside the gate the scheduler's decode policy plans the next decode batch (`Scheduler.plan_language`: owed steps
first, then with adaptive k what fits in the slack before the next control tick), preempted requests it resumes
get their slots back, and the runner decodes; finished requests free their slots. The model calls run outside the
state lock, so a control path that shares its section (`overlap_threads`) runs beside them. What adaptive k's
floor steps cost the arm (the time they ran past the tick's due time) is counted (`RuntimeStats.floor_steps`).
"""

from __future__ import annotations

import threading

import torch

from .parts import RuntimeParts


class LanguageWorker:
    def __init__(self, parts: RuntimeParts, overlap_threads: int = 0):
        self.parts = parts
        self.overlap_threads = overlap_threads
        self.draining = False  # decode without waiting for frames (the end of a run)
        self.error: BaseException | None = None
        self._intra_op_threads = 1

    def loop(self, stop: threading.Event, intra_op_threads: int) -> None:
        p = self.parts
        self._intra_op_threads = intra_op_threads
        torch.set_num_threads(intra_op_threads)
        with p.streams.language():
            try:
                while not stop.is_set():
                    p.outcomes.emit_finished()
                    if not p.scheduler.has_language_requests():
                        p.gate.forgive()
                        p.wake.wait(timeout=0.05)
                        p.wake.clear()
                        continue
                    if not p.gate.acquire_decode():
                        continue
                    steps = 0
                    try:
                        steps = self.decode()
                    finally:
                        p.gate.release_decode(steps)
                    if steps == 0:  # no slack (adaptive) or no steps owed (fixed k): wait for the next frame
                        p.wake.wait(timeout=p.scheduler.idle_wait_s())
                        p.wake.clear()
            except BaseException as error:  # surfaced by the owner through worker_error / stats
                self.error = error
                p.gate.close()  # never leave the control path waiting for owed steps
                raise

    def decode(self) -> int:
        """Plan and run decode steps inside the gate; returns how many ran."""
        p = self.parts
        if self.overlap_threads:  # beside a denoising: the worker's own cores; alone: all of them
            torch.set_num_threads(self.overlap_threads if p.gate.sharing else self._intra_op_threads)
        owed = p.gate.owed
        with p.state_lock:
            plan = p.scheduler.plan_language(p.clock(), owed, p.gate.last_control_start, self.draining)
            if plan is None:
                if owed:  # nothing can decode: owing steps would only stall the control path
                    p.gate.forgive()
                return 0
            runner = p.runners[plan.model_id]
            for request, inputs in plan.resume:
                runner.resume(request, inputs)
        steps = 0
        while steps < plan.steps:
            started = p.clock()
            produced = runner.decode(plan.requests)
            now = p.clock()
            with p.state_lock:
                p.scheduler.cost.observe(plan.model_id, "decode", len(plan.requests), now - started)
                if plan.floor_due is not None and now > plan.floor_due:
                    p.outcomes.floor_step(now - max(started, plan.floor_due))
                steps += 1
                p.outcomes.produced(plan.requests, produced, now)
                finished = p.scheduler.retire(plan.model_id)
                runner.free([r.slot for r in finished])
                p.outcomes.finished(finished)
                plan.requests = [r for r in plan.requests if not r.done]
            if not plan.requests or (p.gate.control_wants_in and owed - steps <= 0):
                break
        p.scheduler.decoded(steps)
        p.outcomes.stream_partials(plan.requests)
        return steps
