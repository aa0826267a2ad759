"""One planner: the fleet simulator and the fleet server (what a `fleet_node` runs) make the same decisions on one
arrival list. The same frames go through both: in the simulator on its event clock; in the server, the runtime's
own control path executes every job on the real tiny models while the clock stands still, and the clock then
reads the job's end as the simulator computes it (start + its table duration). Both must batch the same frames
together, in the same jobs, stages, shares and order, and drop the same frames unserved.

The server's whole arrival list is queued up front: a frame is planned only from its arrival on, as in the
simulator. Its frame slots are more than the list can hold between stages, so the only limit a real server has
and the simulator has not (a VLM batch no larger than the frame slots left) never binds. One-lane designs: the
static split's two lanes run side by side on the wall clock, which a clock that jumps to a job's end cannot
follow (its planner is the same class in both; `test_fleet_scheduling.py`).
"""

from pathlib import Path

import pytest
import torch

from oxygen_ros.engine.frames import deadline_missed
from oxygen_ros.engine.runtime import RuntimeConfig
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.fleet.co_run import planning_guard
from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.profile_table import ProfileTable
from oxygen_ros.fleet.server import FleetServer, ServedRobot
from oxygen_ros.fleet.simulator import SimConfig, make_arrivals, simulate
from oxygen_ros.fleet.traffic import RobotSpec

from engine_fixtures import observation, tokenizer  # noqa: F401 - pytest fixture

LUT = ProfileTable.load(Path(__file__).parents[1] / "fixtures" / "fleet_cpu_lut.json")  # fleet-profile, 2 tiny models
SLOWDOWN = LUT.meta["co_run_slowdown"]
# 12 robots at 25 Hz on 2 models for 0.4 s, budgets of 30 and 80 ms: more than the device serves in time, so
# batches grow and frames expire in the queue (both are decisions to compare)
ROBOTS = [RobotSpec(f"r{i}", "ab"[i % 2], 25.0, (0.03, 0.08)[i % 3 == 0]) for i in range(12)]


class JobClock:
    """The server's clock: the simulator's time. A job the scheduler starts runs for real while the clock stands
    still; the clock then reads its end, start + its table duration with the simulator's interference."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def decisions(jobs, frames) -> tuple[list, list[int]]:
    """Each job's start and batches (stage, model, which frames, bucket, share), and the frames dropped."""
    batches = [(job.start, [(b.stage, b.model_id, sorted(f.context for f in b.frames), b.bucket, b.share)
                            for b in job.batches]) for job in jobs]
    return batches, sorted(f.context for f in frames if f.dropped)


def on_time_at_job_ends(jobs) -> int:
    """Chunks ready by their deadline when each is judged at the end of the job that ran its action stage."""
    return sum(not deadline_missed(job.end, f.deadline) for job in jobs for batch in job.batches
               if batch.stage != "vlm" for f in batch.frames)


def serve_on_the_job_clock(design: str, guard: float, arrivals, tokenizer):  # noqa: F811 - the fixture's value
    clock = JobClock()
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=2, queue="esf", max_batch=4), pool_slots=72,
                           frame_slots=64)
    robots = [ServedRobot(r.robot_id, r.model_id, r.slo_s) for r in ROBOTS]
    specs = [ModelSpec.parse("a=tiny:0"), ModelSpec.parse("b=tiny:1")]
    torch.set_num_threads(1)
    server = FleetServer(specs, robots, config, lambda model: tokenizer, design=design, profile=LUT, cpu_threads=2,
                         publish_late=True, clock=clock, guard=guard)
    scheduler = server.runtime.scheduler
    started, start = [], scheduler.start

    def start_and_run_to_the_end(now):
        jobs = start(now)
        for job in jobs:  # one lane: at most one job at a time
            clock.now = now + job.duration(SLOWDOWN)
            started.append(job)
        return jobs

    scheduler.start = start_and_run_to_the_end
    frames = []
    for frame in arrivals:  # the whole list up front; narration on every fourth frame
        inputs = server.runtime.prepare(observation(frame.context % 4), frame.model_id)
        frames.append(server.submit_inputs(frame.robot_id, inputs, frame.context % 4 == 0, stamp_ns=frame.context,
                                           age_s=0.0, context=frame.context, arrival=frame.arrival))
    server.runtime.start()  # the language worker: narration decodes between jobs, the clock never moves for it
    try:
        for arrival in sorted({f.arrival for f in frames}):
            clock.now = max(clock.now, arrival)
            while server.runtime.run_control():  # jobs until none can start before the next arrival
                pass
        assert server.runtime.drain(60) and server.runtime.frames_pending() == 0
    finally:
        server.close()
    assert server.runtime.worker_error is None
    return started, frames, server


# robion at its planning guard splits; at guard 2 the table says no split pays and none is tried again (only while
# no frame waits, which this list never leaves), so every batch runs its two stages back to back in one job (the
# lockstep's monolithic step), the VLM batch's slots read by the action batch after it
@pytest.mark.parametrize("design,guard", [("monolithic", 1.1), ("robion", 1.1), ("robion", 2.0)])
def test_the_simulator_and_the_server_make_the_same_decisions_on_one_arrival_list(design, guard,
                                                                                   tokenizer):  # noqa: F811
    config = SimConfig(design=design, policy="esf", duration_s=0.4, seed=3, max_batch=4,
                       guard=planning_guard(LUT, guard), interference=SLOWDOWN)
    simulated = simulate(ROBOTS, dict.fromkeys((r.robot_id for r in ROBOTS), 0), LUT, config, keep_log=True)
    jobs, frames, server = serve_on_the_job_clock(design, guard, make_arrivals(ROBOTS, config), tokenizer)
    if guard == 2.0:
        assert all(job.sequential and [b.stage for b in job.batches] == ["vlm", "action"] and
                   job.batches[0].frames == job.batches[1].frames for job in jobs)

    sim_batches, sim_dropped = decisions([r.job for r in simulated.jobs], simulated.frames)
    node_batches, node_dropped = decisions(jobs, frames)
    assert len(frames) == len(simulated.frames) > 50
    assert any(len(batch[2]) > 1 for _, batches in sim_batches for batch in batches)  # frames batched together
    assert sim_dropped, "the list should make the device drop frames"
    assert node_batches == sim_batches
    assert node_dropped == sim_dropped
    # and every frame ends the same: its chunk at the same time (met or missed alike), or dropped
    assert [(f.finish, f.met_deadline) for f in frames] == [(f.finish, f.met_deadline) for f in simulated.frames]
    counts = [server.robot_counts(r.robot_id) for r in ROBOTS]
    assert sum(c.expired_in_queue for c in counts) == len(sim_dropped)
    # the server judges a chunk when its batch is collected, on this clock the end of its job (it stands still
    # while a job runs), also for an action batch that ran first in a monolithic step
    assert sum(c.on_time for c in counts) == on_time_at_job_ends([r.job for r in simulated.jobs])
    assert all(r.slots_in_use == 0 for r in server.runtime.runners.values())
