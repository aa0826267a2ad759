"""The runtime's control path with a stage split: a planner's stage batches run on the stage workers.

The scheduler's planner (the fleet's lockstep or static split) says which stage batches run next and on which
device shares; this executes them with the model runners. A VLM batch prefills its frames into slots they keep; an
action batch denoises from those slots, then its narrating frames hand their slots to language requests exactly as
after a whole-device call (`outcomes.Outcomes.hand_over`), so narration decodes from the prefix the action stage
read. The control thread holds the gate while stage jobs run (no decode step overlaps them), and a lane that
finishes while another still runs (a static split's two stages) starts its next job at once. Chunks, and frames
dropped because their deadline passed in a queue, go to `emit` as they come.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait

from torch import Tensor

from .frames import ActionFrame, committed
from .model_runner import ModelRunner, Prefilled
from .outcomes import ActionChunk
from .parts import RuntimeParts
from .planners import Stage, StageBatch, StageJob
from .stage_workers import StageWorkers

POLL_S = 0.002

Running = tuple[StageBatch, list[ActionFrame], Future]


class StagedControl:
    def __init__(self, parts: RuntimeParts, workers: StageWorkers):
        self.parts = parts
        self.workers = workers
        # frame id -> slot, valid prefix, first token's last-layer output, model: frames between their two stages
        self._prefilled: dict[int, tuple[int, int, Tensor | None, str]] = {}

    def frame_room(self, model_id: str) -> int:
        """Frames of a model that may still start their VLM stage: its frame slots not held by frames waiting for
        their action stage (a planner cuts VLM batches no larger, so frames wait in its queue, never fail)."""
        held = sum(1 for entry in self._prefilled.values() if entry[3] == model_id)
        return self.parts.runners[model_id].frame_slots - held

    def run(self, emit: Callable[[ActionChunk], None]) -> bool:
        """Start and run the planner's jobs until none is running; False if nothing ran or expired."""
        p = self.parts
        ran = False
        with p.gate.control():
            running: list[tuple[StageJob, list[Running]]] = []
            while True:
                with p.frames_lock:
                    now = p.clock()
                    jobs = p.scheduler.start(now)
                    expired = p.scheduler.take_expired()
                for frame in expired:
                    self._give_back(frame)
                    emit(p.outcomes.expired(frame, now))
                ran = ran or bool(jobs or expired)
                for job in jobs:
                    if job.sequential:
                        self._run_sequential(job, emit)
                    else:
                        running.append((job, [self._launch(b) for b in job.batches]))
                if not running:
                    break
                # while a lane is idle (a static split), a frame arriving meanwhile may start on it: look again soon
                idle = len(running) < p.scheduler.planner.lanes
                # only the batches still running: a finished one (a lockstep's VLM batch, done before the action
                # batch beside it) would end every wait at once, and this thread would spin, taking the
                # interpreter lock from the stage workers between each of their operators
                unfinished = [item[2] for _, items in running for item in items if not item[2].done()]
                if unfinished:
                    wait(unfinished, timeout=POLL_S if idle else None, return_when=FIRST_COMPLETED)
                still = []
                for job, items in running:
                    if all(item[2].done() for item in items):
                        self._end(job, items, emit)
                    else:
                        still.append((job, items))
                running = still
                if not running:
                    break
        p.wake.set()
        return ran

    def _run_sequential(self, job: StageJob, emit: Callable[[ActionChunk], None]) -> None:
        """Batches one after the other: a later batch may read an earlier one's slots."""
        for batch in job.batches[:-1]:
            item = self._launch(batch)
            wait([item[2]])
            for chunk in self._collect(*item, self.parts.clock()):
                emit(chunk)
        last = self._launch(job.batches[-1])
        wait([last[2]])
        self._end(job, [last], emit)

    def _end(self, job: StageJob, items: list[Running], emit: Callable[[ActionChunk], None]) -> None:
        """A job whose batches are all done: the planner learns when it ended, then its chunks go out."""
        p = self.parts
        with p.frames_lock:
            now = p.clock()
            p.scheduler.finish(job, now)
        for item in items:
            for chunk in self._collect(*item, now):
                emit(chunk)

    def _give_back(self, frame: ActionFrame) -> None:
        held = self._prefilled.pop(frame.frame_id, None)
        if held is not None:
            self.parts.runners[frame.model_id].free([held[0]])

    def _launch(self, batch: StageBatch) -> Running:
        """Start one stage batch on its worker (frames that failed their VLM stage are left out)."""
        runner = self.parts.runners[batch.model_id]
        frames = [f for f in batch.frames if batch.stage == Stage.VLM or f.frame_id in self._prefilled]
        if batch.stage == Stage.VLM:
            call = runner.prefill_stage, [f.inputs for f in frames], batch.bucket, [f.narrate for f in frames]
        elif batch.stage == Stage.ACTION:
            call = _denoise, runner, [self._prefilled[f.frame_id][0] for f in frames], [f.noise for f in frames], \
                batch.bucket, committed(frames)
        else:
            raise RuntimeError(f"a stage split runs vlm and action batches, not {batch.stage!r}")
        return batch, frames, self.workers.submit(Stage(batch.stage), batch.share, *call)

    def _collect(self, batch: StageBatch, frames: list[ActionFrame], future: Future, now: float
                 ) -> list[ActionChunk]:
        """A finished stage batch: a VLM batch's frames keep their slots; an action batch's frames get chunks."""
        p = self.parts
        try:
            result = future.result()
        except Exception as error:  # these frames fail; their slots go back
            for frame in frames:
                self._give_back(frame)
            return [p.outcomes.failed(f, error) for f in frames]
        if batch.stage == Stage.VLM:
            for i, frame in enumerate(frames):
                self._prefilled[frame.frame_id] = (result.slots[i], result.num_valid[i], result.first_hidden[i],
                                                   batch.model_id)
            return []
        for frame in batch.frames:
            if frame.frame_id not in self._prefilled:  # failed in its VLM stage: reported then, no chunk now
                frame.finish = None
        if not frames:
            return []
        runner = p.runners[batch.model_id]
        held = [self._prefilled.pop(f.frame_id) for f in frames]
        out = Prefilled([h[0] for h in held], [h[1] for h in held], [h[2] for h in held])
        plan = p.scheduler.plan_admission(batch.model_id, frames, batch.bucket)
        p.outcomes.displace(plan, runner)
        handed = [p.outcomes.hand_over(plan, runner, out, i) for i in range(len(frames))]
        runner.free([slot for _, slot in handed if slot is not None])  # the chunks are on the host already
        p.owe_for_frame()
        return p.outcomes.chunks(frames, result, [request_id for request_id, _ in handed], now)


def _denoise(runner: ModelRunner, slots: list[int], noises: list[Tensor], bucket: int, previous: list | None
             ) -> Tensor:
    return runner.denoise_stage(slots, noises, bucket, previous).float().cpu()
