"""The real executor: a wall-clock loop that drives a device scheduler with a real stage runner.

The schedulers are clock-free, so this loop does what the simulator's event loop does, on the wall clock: at each
wake-up it first reports finished jobs (``finish(job, end)``), then admits every request that has arrived, then
asks the device to start jobs (``start(now)``) and hands each job to a thread that runs it with
``run_job``. Requests come from a pre-made arrival list (simulated robots, replayed at their scheduled times
so a real run and a simulation see the same arrivals). A request's latency runs from its arrival to the end of the job that finished its action stage.

Requests the device drops (expired in a queue) give their KV slot back to the runner.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from oxygen_ros.fleet.device import DeviceJob, QueuedDevice, run_job
from oxygen_ros.fleet.profile_table import ProfileTable, StageRunner
from oxygen_ros.fleet.requests import FleetRequest, RobotSpec
from oxygen_ros.fleet.simulator import (
    JobRecord,
    SimConfig,
    SimResult,
    make_arrivals,
    make_device,
    summarize,
)

Callback = Callable[[list[FleetRequest]], None]


class FleetExecutor:
    """One device (scheduler + runner) on the wall clock. Times are seconds since the executor's start."""

    def __init__(
        self,
        device: QueuedDevice,
        runner: StageRunner,
        on_finish: Callback | None = None,
        on_drop: Callback | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.device = device
        self.runner = runner
        self.on_finish = on_finish
        self.on_drop = on_drop
        self.clock = clock
        self._t0 = clock()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self.jobs: list[tuple[DeviceJob, float]] = []
        self.finished: list[FleetRequest] = []

    def now(self) -> float:
        return self.clock() - self._t0

    def _execute(self, job: DeviceJob) -> None:
        try:
            run_job(job, self.runner)
            self._events.put(("done", job, self.now()))
        except BaseException as err:  # noqa: BLE001 - re-raised in the loop thread
            self._events.put(("error", job, err))

    def run(self, arrivals: Sequence[FleetRequest]) -> list[FleetRequest]:
        """Serve until every scheduled arrival has been served or dropped. Returns the finished requests."""
        self._t0 = self.clock()
        pending = sorted(arrivals, key=lambda r: r.arrival)
        next_arrival = 0
        in_flight = 0
        dropped_seen = len(self.device.dropped)
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="fleet-job") as pool:
            while True:
                events = self._drain()
                now = self.now()
                for kind, payload, extra in events:
                    if kind == "error":
                        raise RuntimeError(f"stage execution failed: {extra!r}") from extra
                    if kind == "done":
                        in_flight -= 1
                        self.jobs.append((payload, extra))
                        done = self.device.finish(payload, extra)
                        self.finished.extend(done)
                        if done and self.on_finish:
                            self.on_finish(done)
                while next_arrival < len(pending) and pending[next_arrival].arrival <= now:
                    self.device.submit(pending[next_arrival])
                    next_arrival += 1
                for job in self.device.start(now):
                    in_flight += 1
                    if self.device.lanes == 1:
                        self._execute(job)  # nothing else can start meanwhile: skip two thread hand-offs
                    else:
                        pool.submit(self._execute, job)
                dropped = self.device.dropped[dropped_seen:]
                dropped_seen += len(dropped)
                for request in dropped:
                    release = getattr(self.runner, "release", None)
                    if release is not None:
                        release(request)
                if dropped and self.on_drop:
                    self.on_drop(list(dropped))
                if in_flight == 0 and next_arrival == len(pending) and self.device.pending() == 0 \
                        and self._events.empty():
                    break
                timeout = 0.05
                if next_arrival < len(pending):
                    timeout = min(timeout, max(0.0, pending[next_arrival].arrival - self.now()))
                try:
                    self._events.put(self._events.get(timeout=timeout))
                except queue.Empty:
                    pass
        return self.finished

    def _drain(self) -> list[tuple]:
        events = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events


def run_real(
    robots: list[RobotSpec],
    lut: ProfileTable,
    runner: StageRunner,
    config: SimConfig,
    inputs_of: Callable[[FleetRequest], object] | None = None,
) -> SimResult:
    """Serve ``robots`` (all on this one device) for ``config.duration_s`` seconds of arrivals, for real.

    The arrivals, the device design, queue policy, batch limit and guard come from ``config`` exactly as in
    ``simulator.simulate`` (``config.interference`` does not apply: real co-running costs what it costs).
    ``inputs_of(request)`` supplies each request's observation."""
    requests = make_arrivals(robots, config)
    if inputs_of is not None:
        for request in requests:
            request.inputs = inputs_of(request)
    device = make_device(config, lut)
    executor = FleetExecutor(device, runner)
    executor.run(requests)
    jobs = [JobRecord(0, job, end) for job, end in executor.jobs]
    return summarize(robots, requests, len(device.dropped), jobs)


def cycle_factors(jobs: Sequence[JobRecord], interference: float = 1.0) -> list[float]:
    """For a one-lane device, how much longer than its LUT prediction each job kept the device: (time
    from its start to the next job's start) / (LUT duration, a co-running job inflated by ``interference``).
    The cycle includes the executor's own overhead between jobs. Meaningful while the device is kept busy (an
    overloaded run); all 1.0 would mean the machine ran exactly as profiled. ``SimConfig.duration_factors``
    takes them, so a simulation can replay the run's service-time drift and noise."""
    ordered = sorted(jobs, key=lambda r: r.job.start)
    return [(b.job.start - a.job.start) / a.job.duration(interference) for a, b in zip(ordered, ordered[1:])]
