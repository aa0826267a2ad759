"""Queue policies, fixed-size batching and the lockstep scheduler (simulated clock, synthetic LUT)."""

import threading

import numpy as np
import pytest

from oxygen_ros.engine.scheduler import bucket_for
from oxygen_ros.fleet.batching import form_batch, power_of_two_buckets
from oxygen_ros.fleet.device import run_job
from oxygen_ros.fleet.lockstep import LockstepScheduler, choose_partition, split_candidates
from oxygen_ros.fleet.policies import EarliestSloFirst, LargestQueueFirst, RoundRobin, make_policy
from oxygen_ros.fleet.profile_table import synthetic_table
from oxygen_ros.fleet.requests import FleetRequest, RobotSpec, Stage, StageQueues
from oxygen_ros.fleet.simulator import SimConfig, simulate

LUT = synthetic_table({f"m{k}": 1.0 for k in range(4)})


def req(i, model, arrival=0.0, deadline=1.0):
    return FleetRequest(i, f"r{i}", model, arrival, deadline)


def test_esf_orders_by_slack_not_by_deadline():
    queues = StageQueues(Stage.VLM)
    queues.push(req(0, "light", deadline=0.50))  # earliest deadline, little work left: slack 0.45
    queues.push(req(1, "heavy", deadline=0.60))  # later deadline, much work left: slack 0.30
    remaining = {"light": 0.05, "heavy": 0.30}.get
    assert EarliestSloFirst().choose(queues, 0.0, remaining) == "heavy"
    remaining = {"light": 0.05, "heavy": 0.05}.get
    assert EarliestSloFirst().choose(queues, 0.0, remaining) == "light"


def test_esf_puts_hopeless_heads_after_savable_ones():
    queues = StageQueues(Stage.VLM)
    queues.push(req(0, "late", deadline=0.10))  # slack -0.10: cannot make it anyway
    queues.push(req(1, "ok", deadline=0.40))
    assert EarliestSloFirst().choose(queues, 0.0, {"late": 0.2, "ok": 0.2}.get) == "ok"


def test_round_robin_and_largest_queue_first():
    queues = StageQueues(Stage.VLM)
    for i, model in enumerate(["a", "b", "b", "c", "c", "c"]):
        queues.push(req(i, model, deadline=1.0 - 0.01 * i))
    rr = RoundRobin()
    assert [rr.choose(queues, 0.0, lambda m: 0.0) for _ in range(4)] == ["a", "b", "c", "a"]
    assert LargestQueueFirst().choose(queues, 0.0, lambda m: 0.0) == "c"
    assert make_policy("esf").name == "esf"
    with pytest.raises(ValueError, match="unknown queue policy"):
        make_policy("fifo")


def test_esf_beats_round_robin_and_largest_queue_on_mixed_slos():
    """Two tight-SLO robots share a GPU with three loose-SLO models that have longer queues: round-robin makes
    the tight model wait its turn, largest-queue-first starves it; only slack-aware ordering saves it."""
    robots = [RobotSpec(f"tight{i}", "m3", 5.0, 0.12) for i in range(2)]
    robots += [RobotSpec(f"loose{m}{i}", f"m{m}", 5.0, 0.5) for m in range(3) for i in range(3)]
    gpu_of = {r.robot_id: 0 for r in robots}
    overall, tight = {p: [] for p in ("esf", "rr", "lqf")}, {p: [] for p in ("esf", "rr", "lqf")}
    for seed in range(5):  # jittered arrivals: a policy's edge must hold over seeds, not on one lucky phase
        for p in overall:
            result = simulate(robots, gpu_of, LUT, SimConfig(design="robion", policy=p, duration_s=3.0, seed=seed))
            overall[p].append(result.attainment)
            tight[p].append(min(result.per_robot["tight0"], result.per_robot["tight1"]))
        assert overall["esf"][-1] >= max(overall["rr"][-1], overall["lqf"][-1])
    mean = {p: float(np.mean(v)) for p, v in tight.items()}
    assert mean["esf"] >= 0.9 and mean["rr"] < 0.7 and mean["lqf"] < mean["esf"], mean


def test_power_of_two_buckets():
    assert power_of_two_buckets(8) == [1, 2, 4, 8]
    assert [bucket_for(n, 8) for n in (1, 2, 3, 5, 8, 20)] == [1, 2, 4, 8, 8, 8]
    with pytest.raises(ValueError):
        power_of_two_buckets(6)


def test_batch_takes_earliest_deadlines_and_pads_to_bucket():
    queues = StageQueues(Stage.VLM)
    for i, deadline in enumerate([0.9, 0.3, 0.5, 0.7, 0.1, 0.8]):
        queues.push(req(i, "m0", deadline=deadline))
    batch = form_batch(queues, "m0", max_batch=4, now=0.0)
    assert [r.request_id for r in batch.requests] == [4, 1, 2, 3] and batch.bucket == 4
    batch = form_batch(queues, "m0", max_batch=4, now=0.0)
    assert len(batch.requests) == 2 and batch.bucket == 2 and batch.padding == 0
    queues.push(req(9, "m0"))
    queues.push(req(10, "m0"))
    queues.push(req(11, "m0"))
    assert form_batch(queues, "m0", max_batch=8, now=0.0).padding == 1


def test_request_arriving_mid_stage_waits_for_next_stage_start():
    device = LockstepScheduler(LUT, policy="esf")
    for i in range(3):
        device.submit(req(i, "m0", arrival=0.0))
    (job,) = device.start(0.0)
    assert job.stage_runs[0].batch.bucket == 4 and job.stage_runs[0].batch.padding == 1  # room for one more
    end = job.duration()
    late = req(3, "m0", arrival=end / 2)
    device.submit(late)
    assert device.start(end / 2) == []  # the stage is running: no mid-stage admission, no new job
    device.finish(job, end)
    (nxt,) = device.start(end)
    vlm = next(s.batch for s in nxt.stage_runs if s.batch.stage is Stage.VLM)
    assert vlm.requests == [late] and late.vlm_start == end


def test_simulator_log_never_admits_mid_stage():
    robots = [RobotSpec(f"r{i}", f"m{i % 4}", 7.0, 0.2) for i in range(14)]
    gpu_of = {r.robot_id: i % 2 for i, r in enumerate(robots)}
    for design in ("robion", "disaggregated", "monolithic"):
        result = simulate(robots, gpu_of, LUT, SimConfig(design=design, duration_s=2.0), keep_log=True)
        members = 0
        for record in result.jobs:
            for run in record.job.stage_runs:
                for request in run.batch.requests:
                    assert request.arrival <= record.job.start
                    if run.batch.stage is Stage.ACTION and design != "monolithic":
                        assert request.vlm_done <= record.job.start
                    members += 1
        assert members > 100


def test_lockstep_overlaps_stages_and_lasts_the_slower_one():
    robots = [RobotSpec(f"r{i}", f"m{i % 2}", 10.0, 0.2) for i in range(8)]
    config = SimConfig(design="robion", duration_s=2.0, guard=1.1, interference=1.05)
    result = simulate(robots, {r.robot_id: 0 for r in robots}, LUT, config, keep_log=True)
    both = [w for w in result.jobs if len({s.batch.stage for s in w.job.stage_runs}) == 2]
    assert len(both) > 20
    for record in both:
        job = record.job
        assert not job.sequential and job.co_run  # split mode: side by side on complementary shares
        vlm, action = job.stage_runs
        assert vlm.share + action.share == pytest.approx(1.0)
        assert record.end - job.start == pytest.approx(1.05 * max(vlm.lut_s, action.lut_s))
        assert record.end - job.start <= job.predicted_s + 1e-12  # guard 1.1 >= interference 1.05
    ends = sorted(r.end for r in result.jobs)
    starts = sorted(r.job.start for r in result.jobs)
    assert all(s >= e - 1e-12 for s, e in zip(starts[1:], ends[:-1]))  # one lockstep at a time


def brute_force_partition(vlm, action, guard):
    (vm, vb), (am, ab) = vlm, action
    options = {("serial", 1.0): LUT.latency(vm, Stage.VLM, vb) + LUT.latency(am, Stage.ACTION, ab)}
    for share in LUT.shares(vm, Stage.VLM):
        if 0 < share < 1:
            tv = LUT.latency(vm, Stage.VLM, vb, share)
            ta = LUT.latency(am, Stage.ACTION, ab, round(1 - share, 6))
            options[("split", share)] = guard * max(tv, ta)
    return min(options.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("guard", [1.0, 1.1, 1.3, 2.0])
@pytest.mark.parametrize("vb,ab", [(1, 1), (4, 1), (1, 8), (8, 8)])
def test_partition_is_lut_optimal_with_guard(guard, vb, ab):
    (mode, share), best = brute_force_partition(("m0", vb), ("m1", ab), guard)
    choice = choose_partition(LUT, ("m0", vb), ("m1", ab), guard)
    assert choice.mode == mode and choice.predicted_s == pytest.approx(best)
    if mode == "split":
        assert choice.vlm_share == share


def test_guard_can_turn_a_split_into_back_to_back():
    unguarded = choose_partition(LUT, ("m0", 4), ("m1", 4), guard=1.0)
    guarded = choose_partition(LUT, ("m0", 4), ("m1", 4), guard=2.0)
    assert unguarded.mode == "split" and guarded.mode == "serial"
    assert len(split_candidates(LUT, "m0", "m1")) == 9
    single = choose_partition(LUT, ("m0", 2), None, guard=2.0)
    assert single.mode == "single" and single.vlm_share == 1.0
    assert single.predicted_s == LUT.latency("m0", Stage.VLM, 2, 1.0)


def test_run_job_runs_split_stages_concurrently():
    device = LockstepScheduler(LUT)
    device.submit(req(0, "m0"))
    (first,) = device.start(0.0)
    device.finish(first, 0.05)
    device.submit(req(1, "m1"))
    (job,) = device.start(0.05)
    assert job.co_run and len(job.stage_runs) == 2
    barrier = threading.Barrier(2, timeout=10)
    seen = []

    def runner(model_id, stage, requests, share):
        barrier.wait()  # returns only if the other stage is running at the same time
        seen.append((stage, model_id, len(requests), share))

    run_job(job, runner)
    assert sorted(s[0] for s in seen) == [Stage.ACTION, Stage.VLM]
    assert sum(s[3] for s in seen) == pytest.approx(1.0)


def test_a_vlm_batch_takes_only_what_the_frame_slots_hold():
    """Real serving: a request holds a KV slot from its VLM stage to its action stage, so a VLM batch takes at
    most the slots its model has left (a power of two), and none while they are all held."""
    room = {"m0": 3}
    device = LockstepScheduler(LUT, max_batch=8, vlm_room=room.get)
    for i in range(6):
        device.submit(req(i, "m0"))
    (job,) = device.start(0.0)
    assert [len(s.batch.requests) for s in job.stage_runs] == [2]  # 3 slots left: a bucket of 2
    device.finish(job, 0.01)
    room["m0"] = 0
    (job,) = device.start(0.02)  # the two wait for their action stage; the other four stay queued
    assert [(s.batch.stage, len(s.batch.requests)) for s in job.stage_runs] == [(Stage.ACTION, 2)]
    assert device.queues[Stage.VLM].length("m0") == 4
