"""``python -m oxygen_ros.evaluation.fleet.co_run_probe``: why two co-running stages on a CPU are slower than each alone.

One tiny model's VLM stage and action stage (the engine's `prefill_stage` / `denoise_stage`, as the fleet serves
them) are timed alone (on one thread, and on all ``--cores``) and side by side in four ways, each stage on one
thread of a 2-core budget:
- ``workers``: the engine's two stage workers (`StageWorkers`), as a Robion lockstep runs them;
- ``threads``: two bare Python threads, each with ``torch.set_num_threads(1)``;
- ``threads, switch 0.5 ms``: the same with the interpreter's GIL switch interval cut from 5 ms to 0.5 ms;
- ``processes``: two processes (no shared interpreter lock), started together at a barrier;
and each stage alone on one thread beside a thread running pure Python half of the time, at the default GIL
switch interval (5 ms) and at 0.5 ms.
The ways take turns in ``--cycles`` rounds, so a change of the machine's load spreads over all of them. Per stage
it prints the median and 90th percentile wall time, the thread's CPU time per call (a thread that waits
for the interpreter lock or for a core does not run), and the intra-op threads the stage ran with. With
``--profile`` it also prints the share of one stage call that torch's operators take (``torch.profiler``): the
rest is Python in the interpreter, which two threads of one process cannot run at the same time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import threading
import time

import torch

from oxygen_ros.engine.model_runner import ModelRunner
from oxygen_ros.engine.planners import Stage
from oxygen_ros.engine.stage_workers import StageWorkers
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.pi05 import build_model


def make_runner(preset: str, bucket: int, num_steps: int) -> ModelRunner:
    model = build_model(get_preset(preset), seed=0)
    return ModelRunner(model, 0, 0, max_batch=bucket, num_steps=num_steps, stage_split=True)


def stage_call(runner: ModelRunner, stage: Stage, bucket: int):
    if stage is Stage.VLM:
        return lambda: runner.free(runner.prefill_stage([None] * bucket, bucket).slots)
    return lambda: runner.denoise_stage([], [], bucket)


def timed(call, out: list) -> None:
    wall, cpu = time.perf_counter(), time.thread_time()
    call()
    out.append((time.perf_counter() - wall, time.thread_time() - cpu, torch.get_num_threads()))


def summary(name: str, samples: dict[Stage, list]) -> None:
    for stage, rows in samples.items():
        walls = sorted(r[0] for r in rows)
        p90 = walls[min(len(walls) - 1, int(0.9 * len(walls)))]
        cpu = statistics.median(r[1] for r in rows)
        threads = sorted({r[2] for r in rows})
        print(f"{name:31s} {stage.value:6s} median {1e3 * statistics.median(walls):6.1f} ms  p90 {1e3 * p90:6.1f} ms"
              f"  cpu/call {1e3 * cpu:6.1f} ms  intra-op threads {threads}")


def alone(runner, bucket, repeats, threads) -> dict[Stage, list]:
    torch.set_num_threads(threads)
    samples = {}
    for stage in Stage:
        call, rows = stage_call(runner, stage, bucket), []
        call()
        for _ in range(repeats):
            timed(call, rows)
        samples[stage] = rows
    return samples


def with_workers(runner, bucket, repeats, cores) -> dict[Stage, list]:
    workers = StageWorkers("cpu", cores)
    samples = {stage: [] for stage in Stage}
    try:
        for k in range(repeats + 1):
            futures = [workers.submit(stage, 0.5, timed, stage_call(runner, stage, bucket), samples[stage])
                       for stage in Stage]
            for future in futures:
                future.result()
            if not k:
                for rows in samples.values():
                    rows.clear()
    finally:
        workers.close()
    return samples


def with_threads(runner, bucket, repeats) -> dict[Stage, list]:
    samples = {stage: [] for stage in Stage}
    barrier = threading.Barrier(2)

    def loop(stage: Stage) -> None:
        torch.set_num_threads(1)
        call = stage_call(runner, stage, bucket)
        call()
        for _ in range(repeats):
            barrier.wait()
            timed(call, samples[stage])

    threads = [threading.Thread(target=loop, args=(stage,)) for stage in Stage]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def _process(stage: str, args, repeats: int, barrier, results) -> None:
    torch.set_num_threads(1)
    runner = make_runner(args.preset, args.bucket, args.num_steps)
    call, rows = stage_call(runner, Stage(stage), args.bucket), []
    call()
    for _ in range(repeats):
        barrier.wait()
        timed(call, rows)
    results.put((stage, rows))


def with_processes(args, repeats: int) -> dict[Stage, list]:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_process, args=(stage.value, args, repeats, barrier, results)) for stage in Stage]
    for proc in procs:
        proc.start()
    samples = dict(results.get() for _ in procs)
    for proc in procs:
        proc.join()
    return {stage: samples[stage.value] for stage in Stage}


def with_python_neighbour(runner, bucket, repeats, switch_s: float) -> dict[Stage, list]:
    """Each stage alone on one thread while another thread of the process runs pure Python half of the time (as
    frame preprocessing and callbacks do while a server serves), at GIL switch interval `switch_s`."""
    stop = threading.Event()

    def neighbour() -> None:
        while not stop.is_set():
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
            time.sleep(0.001)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(switch_s)
    thread = threading.Thread(target=neighbour)
    thread.start()
    try:
        return alone(runner, bucket, repeats, 1)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)


def op_share(runner, bucket) -> None:
    """Share of a stage call's wall time spent inside torch operators (1 thread)."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    for stage in Stage:
        call = stage_call(runner, stage, bucket)
        call()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(5):
                call()
            wall = (time.perf_counter() - start) / 5
        events = prof.key_averages()
        ops = sum(e.self_cpu_time_total for e in events) / 5 / 1e6
        calls = sum(e.count for e in events) / 5
        print(f"profile {stage.value:6s}: {1e3 * wall:.1f} ms per call (profiled), {calls:.0f} operator calls, "
              f"operators' own time {1e3 * ops:.1f} ms ({100 * ops / wall:.0f} %)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--bucket", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=30, help="timed calls per way and stage, over all cycles")
    p.add_argument("--cycles", type=int, default=3, help="rounds in which every way runs once")
    p.add_argument("--cores", type=int, default=2, help="the device's cores: a 0.5 share is half of them")
    p.add_argument("--profile", action="store_true", help="also profile one stage call's operators")
    args = p.parse_args(argv)
    runner = make_runner(args.preset, args.bucket, args.num_steps)
    per_cycle = max(1, args.repeats // args.cycles)
    print(f"{args.preset}, bucket {args.bucket}, {args.num_steps} denoise steps, {args.cycles} cycles of "
          f"{per_cycle} repeats per way (the ways take turns, so the machine's load drifts over all of them)")
    interval = sys.getswitchinterval()

    def short_switch(run):
        sys.setswitchinterval(0.0005)
        try:
            return run()
        finally:
            sys.setswitchinterval(interval)

    b, n = args.bucket, per_cycle
    ways = {
        "alone, 1 thread": lambda: alone(runner, b, n, 1),
        "co-run: stage workers": lambda: with_workers(runner, b, n, args.cores),
        "co-run: bare threads": lambda: with_threads(runner, b, n),
        "co-run: threads, switch 0.5 ms": lambda: short_switch(lambda: with_threads(runner, b, n)),
        "co-run: processes": lambda: with_processes(args, n),
        "alone + Python neighbour": lambda: with_python_neighbour(runner, b, n, interval),
        "same, switch 0.5 ms": lambda: with_python_neighbour(runner, b, n, 0.0005),
        f"alone, {args.cores} threads": lambda: alone(runner, b, n, args.cores),
    }
    samples: dict[str, dict[Stage, list]] = {name: {stage: [] for stage in Stage} for name in ways}
    for _ in range(args.cycles):
        for name, run in ways.items():
            for stage, rows in run().items():
                samples[name][stage].extend(rows)
    for name, rows in samples.items():
        summary(name, rows)
    if args.profile:
        op_share(runner, args.bucket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
