"""Where a stage runs: one persistent worker thread per stage, each on its own share of the device.

A pi0.5-shaped call has two stages, VLM prefill of the image + prompt prefix and action denoising, which a stage
split runs side by side on complementary shares of one device. What a share means:

- CPU: the device is `cpu_threads` cores; share s is an intra-op budget of max(1, round(s x cores)) threads.
  `torch.set_num_threads` also writes a process-wide default, but the OpenMP backend keeps the effective value per
  calling thread once that thread has run an op, so each stage runs on its own persistent worker thread that sets
  its budget before a call, and two co-running stages really hold their own budgets. Both workers are Python
  threads of one process: co-running stages also contend for the interpreter lock between kernels.
- CUDA: a share is a group of SMs. A worker issues its calls on the stream its `partitions` give for (stage,
  share) (disjoint green-context SM groups for the two stages of a split), or on a plain stream of its own for
  the whole device or without partitions (shares then overlap, not enforced). A job's stream first waits for
  what the submitting thread had queued on its own stream when it submitted (the frames' upload, a pool's
  zero-fill): an event recorded there at `submit` (a stream may wait on another context's event, so this holds for
  green-context streams too). This path has not run on a GPU yet (`test_gpu/` is its proof).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import torch

from .planners import Stage


class Partitions(Protocol):
    """SM partitions of one GPU: the stream a stage issues on at a share (None: the whole device)."""

    def stream(self, stage: Stage, share: float) -> torch.cuda.Stream | None: ...


class StageWorker:
    """A persistent thread that runs one stage's calls with that stage's thread budget (CPU) or with the stream of
    its share's SM partition (CUDA; a plain stream of its own for the whole device or without partitions)."""

    def __init__(self, name: str, device: torch.device, stage: Stage, partitions: Partitions | None = None,
                 threads_for: Callable[[float], int] = lambda share: 1):
        self.device = device
        self.stage = stage
        self.partitions = partitions
        self.threads_for = threads_for
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = -1
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], share: float, *args) -> Future:
        """Run `fn(*args)` on this worker at `share` of the device; the future holds its result."""
        future: Future = Future()
        ready = None
        if self.stream is not None:  # what this thread queued so far must be done before the job reads it
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        self._jobs.put((future, fn, share, args, ready))
        return future

    def _stream_for(self, share: float) -> torch.cuda.Stream:
        if self.partitions is not None:
            return self.partitions.stream(self.stage, share) or self.stream
        return self.stream

    def _loop(self) -> None:
        torch.get_num_threads()  # this thread's lazy init; later set_num_threads calls then stay per thread
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, share, args, ready = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if self.stream is None:
                    threads = self.threads_for(share)
                    if threads != self._threads:
                        torch.set_num_threads(threads)
                        self._threads = threads
                    result = fn(*args)
                else:
                    stream = self._stream_for(share)
                    stream.wait_event(ready)
                    with torch.cuda.stream(stream):
                        result = fn(*args)
                    stream.synchronize()
                future.set_result(result)
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                future.set_exception(err)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)


class StageWorkers:
    """The VLM worker and the action worker of one device."""

    def __init__(self, device: torch.device | str, cpu_threads: int | None = None,
                 partitions: Partitions | None = None, name: str = "stage"):
        self.device = torch.device(device)
        self.cpu_threads = cpu_threads or torch.get_num_threads()
        self.partitions = partitions
        self.workers = {stage: StageWorker(f"{name}-{stage.value}", self.device, stage, partitions, self.threads_for)
                        for stage in Stage}

    def threads_for(self, share: float) -> int:
        """A CPU share's intra-op thread budget."""
        return max(1, round(share * self.cpu_threads))

    def cpu_shares(self) -> list[float]:
        """The shares a CPU offers: multiples of one core."""
        return [round(k / self.cpu_threads, 6) for k in range(1, self.cpu_threads + 1)]

    def submit(self, stage: Stage, share: float, fn: Callable[..., Any], *args) -> Future:
        return self.workers[Stage(stage)].submit(fn, share, *args)

    def __getitem__(self, stage: Stage) -> StageWorker:
        return self.workers[Stage(stage)]

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
