"""The five ways to run action + language on one model that the OxyGen benchmark compares.

Every setting sees the same frames, noise, sampler (greedy), prompt, decode length and EOS handling, and the same
model weights, so the only thing that differs is how work is shared and scheduled:

- `action_only`: prefill + denoise per frame, no language (the ceiling for the action rate);
- `baseline`: sequential and isolated: prefill + denoise for the action, then a second prefill of the same frame
  into its own cache and decoding to completion before the next frame;
- `shared_kv`: one prefill; the action and the text both read it; text still decoded to completion in-frame;
- `parallel`: two workers with their own model copies and prefills (as separate processes or MPS would);
- `continuous_batching`: OxyGen as a robot runs it: the engine's threaded `Runtime` (control path on this thread,
  the language worker on its own, the gate between them): one prefill, the action now, language from many frames
  decoded together, k steps per frame (each frame waits for the k steps its predecessor owes) or, with adaptive k,
  frames paced at the control period and text only in the slack;
- `continuous_batching_overlap`: the same with `RuntimeConfig.overlap_threads` (`Workload.overlap_threads`,
  default 1): a frame's decode steps run beside its denoising, on their own intra-op threads.

The first four are the baselines the paper compares against; they are written here, not in the engine. Their action
frame runs its prefill and its denoising each on the thread count `Workload.part_threads` gives (the benchmark
probes for the fastest, `part_threads.py`), so the ceiling has every advantage a narrated setting has.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ...engine.kv_pool import KVPool
from ...engine.language import LanguageRequest, decode_batch, start_request
from ...engine.model_runner import PriorityStreams
from ...engine.runtime import Runtime, RuntimeConfig, Served, TextUpdate
from ...engine.scheduler import SchedulerConfig
from ...model.inputs import ModelInputs
from .part_threads import PartThreads, intra_op_threads

SETTINGS = ("action_only", "baseline", "shared_kv", "parallel", "continuous_batching")  # the full matrix's
OVERLAP = "continuous_batching_overlap"  # also run where a sweep point names it


@dataclass
class Workload:
    inputs: list[ModelInputs]  # one batch-1 observation per frame
    noises: list[Tensor]  # [1, horizon, action_dim] per frame
    narrate: list[bool]  # which frames start a language request
    decode_len: int  # tokens per request (EOS ignored when ignore_eos, so every setting does the same work)
    num_steps: int = 10
    tokens_per_frame: int = 4
    adaptive_k: bool = False
    min_steps_per_frame: int = 1  # adaptive k's floor (decode steps owed per frame)
    control_period_s: float = 0.1
    ignore_eos: bool = True
    pool_slots: int = 0  # continuous batching pool size; 0 = enough for every request in flight
    warmup_frames: int = 0  # processed first but not measured (continuous batching reaches steady state there)
    energy_j: Callable[[], float] | None = None  # an energy counter (joules so far), read around the measured window
    overlap_threads: int = 1  # `continuous_batching_overlap`: the language worker's threads beside a denoising
    # the sequential settings' action frame: intra-op threads for its prefill and its denoising (`part_threads`)
    part_threads: PartThreads = field(default_factory=PartThreads)

    @property
    def num_frames(self) -> int:
        return len(self.inputs)


@dataclass
class SettingRun:
    """What one setting did: per-frame action timing and results, and every finished request's tokens."""

    setting: str
    elapsed_s: float = 0.0
    action_done_s: list[float] = field(default_factory=list)  # time each action was ready, from the run's start
    action_latency_s: list[float] = field(default_factory=list)  # frame start -> action ready
    actions: dict[int, Tensor] = field(default_factory=dict)  # frame index -> [horizon, action_dim]
    texts: dict[int, list[int]] = field(default_factory=dict)  # frame index -> its request's generated tokens
    completion_s: list[float] = field(default_factory=list)  # request start -> finish, measured frames only
    tokens_generated: int = 0
    pool_bytes: int = 0
    energy_j: float | None = None  # over the measured window, when the workload has an energy counter
    floor_steps: int = 0  # continuous batching with adaptive k: floor steps past the tick, measured window
    floor_action_s: float = 0.0  # and the action time they took
    requests_dropped: int = 0  # continuous batching: requests refused or evicted, whole run


def _action_frame(model, cache, slot: Tensor, inputs: ModelInputs, noise: Tensor, workload: Workload,
                  want_hidden: bool = False):
    """A sequential setting's prefill and denoising, each on the thread count `workload.part_threads` gives it.
    Returns the prefill's output and the chunk [horizon, action_dim]."""
    with intra_op_threads(workload.part_threads.prefill):
        prefill = model.prefill(inputs, cache, slot, want_hidden=want_hidden)
    with intra_op_threads(workload.part_threads.denoise):
        actions = model.sample_actions(cache, slot, noise, workload.num_steps)[0]
    return prefill, actions


def _eos(model, workload: Workload) -> int:
    return -1 if workload.ignore_eos else model.config.eos_id


def _decode_alone(model, cache, slot: int, frame: int, num_valid: int, hidden: Tensor, workload: Workload
                  ) -> LanguageRequest:
    """Decode one request to completion by itself (batch 1): what a sequential stack does. Its first token comes
    from the prefill's last-layer output through the text head, as in the engine (`start_request`)."""
    request = start_request(frame, slot, frame, 0, model.config.prefix_len, num_valid, None,
                            workload.decode_len, _eos(model, workload), first_hidden=hidden)
    while not request.done:
        decode_batch(model, cache, [request])
    return request


class _Window:
    """The measured part of a run: frames from `workload.warmup_frames` on; the clock starts at that frame."""

    def __init__(self, workload: Workload):
        self.first = workload.warmup_frames
        self.energy = workload.energy_j
        self.start = time.perf_counter()
        self.energy_start = 0.0  # read when the first measured frame begins
        self.open = self.first == 0  # measuring has begun

    def begin(self, frame: int) -> float:
        if frame == self.first and self.energy:
            self.energy_start = self.energy()
        now = time.perf_counter()
        if frame == self.first:
            self.start = now
            self.open = True
        return now

    def close(self, run: SettingRun) -> None:
        """The measured window ends now: its wall time and, with a counter, its energy."""
        run.elapsed_s = time.perf_counter() - self.start
        if self.energy:
            run.energy_j = self.energy() - self.energy_start

    def measured(self, frame: int) -> bool:
        return frame >= self.first


def _record_action(run: SettingRun, window: _Window, frame: int, actions: Tensor, frame_start: float) -> None:
    run.actions[frame] = actions.cpu()  # a chunk is ready when it is on the host (on a GPU this waits for it)
    now = time.perf_counter()
    if window.measured(frame):
        run.action_latency_s.append(now - frame_start)
        run.action_done_s.append(now - window.start)


def _record_request(run: SettingRun, window: _Window, frame: int, request: LanguageRequest) -> None:
    run.texts[frame] = request.tokens
    if window.measured(frame):
        run.tokens_generated += len(request.tokens)
        run.completion_s.append(request.finish_time - request.arrival_time)


def run_action_only(model, workload: Workload) -> SettingRun:
    run = SettingRun("action_only")
    pool = KVPool(model.config, 1, 0, model.dtype, model.device)
    run.pool_bytes = pool.bytes_total
    slot = torch.tensor([0])
    window = _Window(workload)
    for frame, (inputs, noise) in enumerate(zip(workload.inputs, workload.noises)):
        t0 = window.begin(frame)
        _, actions = _action_frame(model, pool.cache, slot, inputs, noise, workload)
        _record_action(run, window, frame, actions, t0)
    window.close(run)
    return run


def run_baseline(model, workload: Workload) -> SettingRun:
    run = SettingRun("baseline")
    action_pool = KVPool(model.config, 1, 0, model.dtype, model.device)
    language_pool = KVPool(model.config, 1, workload.decode_len, model.dtype, model.device)
    run.pool_bytes = action_pool.bytes_total + language_pool.bytes_total
    slot = torch.tensor([0])
    window = _Window(workload)
    for frame, (inputs, noise) in enumerate(zip(workload.inputs, workload.noises)):
        t0 = window.begin(frame)
        _, actions = _action_frame(model, action_pool.cache, slot, inputs, noise, workload)
        _record_action(run, window, frame, actions, t0)
        if workload.narrate[frame]:
            prefill = model.prefill(inputs, language_pool.cache, slot, want_hidden=True)
            request = _decode_alone(model, language_pool.cache, 0, frame, int(prefill.num_valid[0]),
                                    prefill.hidden[0], workload)
            _record_request(run, window, frame, request)
    window.close(run)
    return run


def run_shared_kv(model, workload: Workload) -> SettingRun:
    run = SettingRun("shared_kv")
    pool = KVPool(model.config, 1, workload.decode_len, model.dtype, model.device)
    run.pool_bytes = pool.bytes_total
    slot = torch.tensor([0])
    window = _Window(workload)
    for frame, (inputs, noise) in enumerate(zip(workload.inputs, workload.noises)):
        t0 = window.begin(frame)
        narrate = workload.narrate[frame]
        prefill, actions = _action_frame(model, pool.cache, slot, inputs, noise, workload, want_hidden=narrate)
        _record_action(run, window, frame, actions, t0)
        if narrate:
            request = _decode_alone(model, pool.cache, 0, frame, int(prefill.num_valid[0]), prefill.hidden[0],
                                    workload)
            _record_request(run, window, frame, request)
    window.close(run)
    return run


def run_parallel(model, workload: Workload) -> SettingRun:
    """Action and language workers on their own threads, each with its own model copy, pool and prefill.

    The language worker always takes the newest frame that asked for language and was not yet taken, as a second
    process following the same camera stream would. On a GPU each worker issues on its own stream of equal priority.
    """
    run = SettingRun("parallel")
    language_model = copy.deepcopy(model)
    action_pool = KVPool(model.config, 1, 0, model.dtype, model.device)
    language_pool = KVPool(model.config, 1, workload.decode_len, model.dtype, model.device)
    streams = PriorityStreams(model.device, prioritized=False)  # after the copy and the pools: waits for them
    run.pool_bytes = action_pool.bytes_total + language_pool.bytes_total
    slot = torch.tensor([0])
    newest_frame = -1
    taken = -1
    done = threading.Event()
    progress = threading.Condition()
    threads = torch.get_num_threads()

    def language_worker():
        torch.set_num_threads(threads)  # the caller's intra-op budget, not OpenMP's default for a new thread
        with streams.language():
            language_loop()

    def language_loop():
        nonlocal taken
        while True:
            with progress:
                candidates = [f for f in range(taken + 1, newest_frame + 1) if workload.narrate[f]]
                if not candidates:
                    if done.is_set():
                        return
                    progress.wait(timeout=0.01)
                    continue
                frame = candidates[-1]
                taken = frame
            prefill = language_model.prefill(workload.inputs[frame], language_pool.cache, slot, want_hidden=True)
            request = start_request(frame, 0, frame, 0, model.config.prefix_len, int(prefill.num_valid[0]), None,
                                    workload.decode_len, _eos(model, workload), first_hidden=prefill.hidden[0])
            produced = 0
            while not request.done:
                # tokens count when they are produced inside the measured window, finished or not
                if window.open and not done.is_set():
                    run.tokens_generated += produced
                produced = decode_batch(language_model, language_pool.cache, [request])
            if window.open and not done.is_set():
                run.tokens_generated += produced
                run.texts[frame] = request.tokens
                if window.measured(frame):
                    run.completion_s.append(request.finish_time - request.arrival_time)

    window = _Window(workload)
    worker = threading.Thread(target=language_worker, name="language-worker")
    worker.start()
    try:
        for frame, (inputs, noise) in enumerate(zip(workload.inputs, workload.noises)):
            t0 = window.begin(frame)
            with streams.control():
                _, actions = _action_frame(model, action_pool.cache, slot, inputs, noise, workload)
                _record_action(run, window, frame, actions, t0)
            with progress:
                newest_frame = frame
                progress.notify()
        window.close(run)
    finally:
        done.set()
        worker.join()
    return run


def run_continuous_batching(model, workload: Workload, drain: bool = False, overlap: bool = False) -> SettingRun:
    """OxyGen through the engine's threaded runtime; with `overlap`, decode steps beside the denoising. With
    `drain`, unfinished requests are decoded to the end after the measured window (for tests)."""
    run = SettingRun(OVERLAP if overlap else "continuous_batching")
    per_request_frames = -(-workload.decode_len // max(workload.tokens_per_frame, 1))
    slots = workload.pool_slots or per_request_frames + 2
    config = SchedulerConfig(num_steps=workload.num_steps, tokens_per_frame=workload.tokens_per_frame,
                             adaptive_k=workload.adaptive_k, min_steps_per_frame=workload.min_steps_per_frame,
                             control_period_s=workload.control_period_s,
                             max_new_tokens=workload.decode_len, ignore_eos=workload.ignore_eos)
    window = _Window(workload)
    starts: dict[int, float] = {}

    def on_text(update: TextUpdate) -> None:  # the worker thread; the final update is a request's last
        if update.final:
            run.texts[update.context] = list(update.token_ids)
            if window.measured(update.context):
                run.completion_s.append(time.perf_counter() - starts[update.context])

    runtime = Runtime(Served(model), RuntimeConfig(config, pool_slots=slots, stream_every=0,
                                                   overlap_threads=workload.overlap_threads if overlap else 0),
                      on_text=on_text)
    run.pool_bytes = sum(runner.pool.bytes_total for runner in runtime.runners.values())
    runtime.start()
    try:
        tokens_at_open, floor_at_open = 0, runtime.stats()
        next_start = time.perf_counter()
        for frame, (inputs, noise) in enumerate(zip(workload.inputs, workload.noises)):
            if workload.adaptive_k:  # a robot's control timer: text gets the slack of each period
                time.sleep(max(0.0, next_start - time.perf_counter()))
            t0 = window.begin(frame)
            next_start = t0 + workload.control_period_s
            if frame == window.first:
                tokens_at_open, floor_at_open = runtime.tokens_generated, runtime.stats()
            starts[frame] = t0
            chunk = runtime.act(runtime.frame(inputs, workload.narrate[frame], noise=noise, context=frame))
            _record_action(run, window, frame, chunk.actions, t0)
        # the window ends where the next frame would start: after the steps the last frame left owed
        if not runtime.wait_owed(600):
            raise RuntimeError("the language worker did not run the last frame's owed decode steps")
        window.close(run)
        run.tokens_generated = runtime.tokens_generated - tokens_at_open
        floor_at_close = runtime.stats()
        run.floor_steps = floor_at_close.floor_steps - floor_at_open.floor_steps
        run.floor_action_s = floor_at_close.floor_action_s - floor_at_open.floor_action_s
        run.requests_dropped = floor_at_close.requests_dropped
        if drain and not runtime.drain(600):
            raise RuntimeError("continuous batching did not drain its requests")
    finally:
        runtime.close()
    if runtime.worker_error is not None:
        raise RuntimeError("the language worker failed") from runtime.worker_error
    return run


RUNNERS = {
    "action_only": run_action_only,
    "baseline": run_baseline,
    "shared_kv": run_shared_kv,
    "parallel": run_parallel,
    "continuous_batching": run_continuous_batching,
    OVERLAP: lambda model, workload, drain=False: run_continuous_batching(model, workload, drain, overlap=True),
}
