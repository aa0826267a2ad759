"""The runtime's control path for whole-device batches: a batch's prefill and denoising in one call.

Inside the gate (no decode step runs meanwhile, except beside the denoising with `overlap_threads`) the scheduler
hands out the next job, admission is planned for its narrating frames (displacements happen only here, at the
start of a control section, when no decode step is in flight), the model runner prefills and denoises the batch
and the narrating frames hand their slots to their language requests. The chunk is read back outside the gate,
and a frame slot that no request took is freed only then: on a GPU the denoising may read it until its chunk is
on the host, and a slot freed earlier could be prefilled by a resume on the language stream meanwhile.

With `overlap_threads` the decode steps a frame owes run beside its denoising instead of after it: the prefill
keeps every intra-op thread, then the control path denoises on the others while the worker decodes on
`overlap_threads` of them; the next frame waits only for the owed steps that did not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch

from .frames import committed
from .model_runner import ModelRunner
from .outcomes import ActionChunk
from .parts import RuntimeParts
from .planners import WHOLE


class ControlPath:
    def __init__(self, parts: RuntimeParts, overlap_threads: int = 0):
        self.parts = parts
        self.overlap_threads = overlap_threads

    def run(self, emit: Callable[[ActionChunk], None]) -> bool:
        """Run jobs until none can start, each chunk to `emit` as its batch is read back (frames that expired in
        the queue first); False if nothing ran or expired."""
        ran = False
        while (chunks := self.step()) is not None:
            ran = True
            for chunk in chunks:
                emit(chunk)
        return ran

    def step(self) -> list[ActionChunk] | None:
        """One job if one can start: its chunks after those of frames that expired in the queue; None if
        nothing ran or expired."""
        p = self.parts
        with p.gate.control(), p.streams.control():
            with p.frames_lock:
                now = p.clock()
                jobs = p.scheduler.start(now)
                expired = [p.outcomes.expired(f, now) for f in p.scheduler.take_expired()]
            if not jobs:
                return expired or None
            (job,) = jobs
            (batch,) = job.batches
            if batch.stage != WHOLE:
                raise RuntimeError(f"a {batch.stage} stage batch needs a runtime with stage workers")
            runner = p.runners[batch.model_id]
            plan = p.scheduler.plan_admission(batch.model_id, batch.frames, batch.bucket)
            p.outcomes.displace(plan, runner)
            window = self._overlap_window if self.overlap_threads else None
            try:
                with _on_share(batch.share, runner):
                    out = runner.act([f.inputs for f in batch.frames], [f.noise for f in batch.frames], batch.bucket,
                                     plan.admit, denoise_window=window, committed=committed(batch.frames))
            except Exception as error:  # the frames fail; admission already happened (victims are reported)
                self._finish(job)
                return expired + [p.outcomes.failed(f, error) for f in batch.frames]
            with p.state_lock:  # a decode step started beside the denoising may still be running
                p.scheduler.cost.observe(batch.model_id, "action", len(batch.frames), out.seconds)
                handed = [p.outcomes.hand_over(plan, runner, out, i) for i in range(len(batch.frames))]
                if not self.overlap_threads:  # with overlap, the frame's steps were owed when it denoised
                    p.owe_for_frame()
        try:
            with p.streams.control():  # on a GPU: wait for the chunks on the control stream, outside the gate
                actions = out.actions.float().cpu()
        finally:
            runner.free([slot for _, slot in handed if slot is not None])
        now = self._finish(job)
        return expired + p.outcomes.chunks(batch.frames, actions, [request_id for request_id, _ in handed], now)

    def _finish(self, job) -> float:
        p = self.parts
        with p.frames_lock:
            now = p.clock()
            p.scheduler.finish(job, now)
        p.wake.set()
        return now

    @contextmanager
    def _overlap_window(self):
        """A batch's denoising with decode steps beside it: the worker on `overlap_threads` intra-op threads, the
        control path on the rest. The frame owes its steps from here on, so the steps that run beside the
        denoising pay them and the next frame waits only for what is left."""
        p = self.parts
        p.owe_for_frame()
        control_threads = torch.get_num_threads()
        torch.set_num_threads(max(1, control_threads - self.overlap_threads))
        try:
            with p.gate.share():
                p.wake.set()
                yield
        finally:
            torch.set_num_threads(control_threads)


@contextmanager
def _on_share(share: float, runner: ModelRunner):
    """On a CPU, a share below 1 of this thread's intra-op threads for the call (a planner that found fewer threads
    faster on a loaded machine); a GPU call has the whole device."""
    threads = torch.get_num_threads()
    if share >= 1.0 or runner.model.device.type != "cpu":
        yield
        return
    torch.set_num_threads(max(1, round(share * threads)))
    try:
        yield
    finally:
        torch.set_num_threads(threads)
