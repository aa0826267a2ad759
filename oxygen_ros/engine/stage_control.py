"""The runtime's control path with a stage split: a planner's stage batches run on the stage workers.

A planner (`scheduler.StagePlanner`: the fleet's lockstep or static split) queues the frames and says which stage
batches run next and on which device shares; this executes them with the runtime's model runners. A VLM batch
prefills its frames into slots they keep; an action batch denoises from those slots, then its narrating frames
hand their slots to language requests exactly as after a whole-device call (`Runtime._hand_over`), so narration
decodes from the prefix the action stage read. The control thread holds the runtime's gate while stage jobs run
(no decode step overlaps it), and a lane that finishes while another still runs (a static split's two stages)
starts its next job at once. Chunks, and frames the planner dropped because their deadline passed in its queue,
go to the runtime's `on_chunk` as they come.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING

from torch import Tensor

from .model_runner import ModelRunner, Prefilled
from .scheduler import ActionFrame, StageBatch, StageJob, StagePlanner
from .stage_workers import Stage, StageWorkers

if TYPE_CHECKING:
    from .runtime import ActionChunk, Runtime


POLL_S = 0.002


class StagedControl:
    def __init__(self, runtime: Runtime, planner: StagePlanner, workers: StageWorkers):
        self.runtime = runtime
        self.planner = planner
        self.workers = workers
        # frame id -> slot, valid prefix, first token's last-layer output, model: frames between their two stages
        self._prefilled: dict[int, tuple[int, int, Tensor | None, str]] = {}

    def frame_room(self, model_id: str) -> int:
        held = sum(1 for entry in self._prefilled.values() if entry[3] == model_id)
        return self.runtime.runners[model_id].frame_slots - held

    def run(self) -> list[ActionChunk]:
        """Start and run the planner's jobs until none is running; returns nothing (chunks left as they came)."""
        rt = self.runtime
        with rt.gate.control():
            running: list[tuple[StageJob, list]] = []
            while True:
                with rt._submit_lock:
                    now = time.perf_counter()
                    jobs = self.planner.start(now)
                    expired = self.planner.take_expired()
                for frame in expired:
                    self._give_back(frame)
                    rt.on_chunk(rt._expired(frame, now))
                for job in jobs:
                    if job.sequential:  # one after the other: a later batch may read an earlier one's slots
                        self._emit([c for b in job.batches for c in self._collect(*self._launch(b))])
                        self._finish(job)
                    else:
                        running.append((job, [self._launch(b) for b in job.batches]))
                if not running:
                    break
                # while a lane is idle (a static split), a frame arriving meanwhile may start on it: look again soon
                idle = len(running) < self.planner.lanes
                # only the batches still running: a finished one (a lockstep's VLM batch, done before the action
                # batch beside it) would end every wait at once, and this thread would spin, taking the
                # interpreter lock from the stage workers between each of their operators
                unfinished = [item[2] for _, items in running for item in items if not item[2].done()]
                if unfinished:
                    wait(unfinished, timeout=POLL_S if idle else None, return_when=FIRST_COMPLETED)
                still = []
                for job, items in running:
                    if all(item[2].done() for item in items):
                        self._emit([c for item in items for c in self._collect(*item)])
                        self._finish(job)
                    else:
                        still.append((job, items))
                running = still
                if not running:
                    break
        rt._wake.set()
        return []

    def _emit(self, chunks: list[ActionChunk]) -> None:
        for chunk in chunks:
            self.runtime.on_chunk(chunk)

    def _finish(self, job: StageJob) -> None:
        with self.runtime._submit_lock:
            self.planner.finish(job, time.perf_counter())

    def _give_back(self, frame: ActionFrame) -> None:
        held = self._prefilled.pop(frame.frame_id, None)
        if held is not None:
            self.runtime.runners[frame.model_id].free([held[0]])

    def _launch(self, batch: StageBatch) -> tuple[StageBatch, list[ActionFrame], Future]:
        """Start one stage batch on its worker (frames that failed their VLM stage are left out)."""
        runner = self.runtime.runners[batch.model_id]
        frames = [f for f in batch.frames if batch.stage == Stage.VLM or f.frame_id in self._prefilled]
        if batch.stage == Stage.VLM:
            call = runner.prefill_stage, [f.inputs for f in frames], batch.bucket, [f.narrate for f in frames]
        else:
            call = _denoise, runner, [self._prefilled[f.frame_id][0] for f in frames], [f.noise for f in frames], \
                batch.bucket
        return batch, frames, self.workers.submit(Stage(batch.stage), batch.share, *call)

    def _collect(self, batch: StageBatch, frames: list[ActionFrame], future: Future) -> list[ActionChunk]:
        """A finished stage batch: a VLM batch's frames keep their slots; an action batch's frames get chunks."""
        rt = self.runtime
        try:
            result = future.result()
        except Exception as error:  # these frames fail; their slots go back
            for frame in frames:
                self._give_back(frame)
            return [rt._failed(f, error) for f in frames]
        if batch.stage == Stage.VLM:
            for i, frame in enumerate(frames):
                self._prefilled[frame.frame_id] = (result.slots[i], result.num_valid[i], result.first_hidden[i],
                                                   batch.model_id)
            return []
        if not frames:
            return []
        runner = rt.runners[batch.model_id]
        held = [self._prefilled.pop(f.frame_id) for f in frames]
        out = Prefilled([h[0] for h in held], [h[1] for h in held], [h[2] for h in held])
        plan = rt.scheduler.plan_admission(batch.model_id, frames, batch.bucket)
        rt._displace(plan, runner)
        handed = [rt._hand_over(plan, runner, out, i) for i in range(len(frames))]
        runner.free([slot for _, slot in handed if slot is not None])  # the chunks are on the host already
        rt._owe_for_frame()
        return rt._chunks(plan, result, [request_id for request_id, _ in handed])


def _denoise(runner: ModelRunner, slots: list[int], noises: list[Tensor], bucket: int) -> Tensor:
    return runner.denoise_stage(slots, noises, bucket).float().cpu()
