"""Planning with measured figures: the co-run slowdown a table measured is the guard and the interference every
planner uses, one design default everywhere, and the lockstep's choice between pipelining a batch and its
monolithic step (its two stages back to back), made from what the device measures each way, seeded by the table."""

import json

import pytest

from oxygen_ros.engine.frames import ActionFrame
from oxygen_ros.engine.planners import Stage
from oxygen_ros.fleet.co_run import (
    ASSUMED_INTERFERENCE,
    DEFAULT_GUARD,
    interference_source,
    planning_guard,
    planning_interference,
)
from oxygen_ros.fleet.designs import DEFAULT_DESIGN
from oxygen_ros.fleet.lockstep import LockstepPlanner, batch_ends, table_costs
from oxygen_ros.fleet.profile_table import ProfileTable, synthetic_table
from oxygen_ros.fleet.simulator import SimConfig
from oxygen_ros.fleet.split_meter import EXPLORE_EVERY, SplitMeter, Way, pipeline_pays

LUT = synthetic_table({"m0": 1.0, "m1": 1.0})


def frame(i, model="m0", arrival=0.0, deadline=1.0):
    return ActionFrame(model, None, False, deadline, arrival, f"r{i}", context=i)


def measured(slowdown: float) -> ProfileTable:
    return ProfileTable(dict(LUT.entries), {"source": "measured", "co_run_slowdown": slowdown})


def test_the_measured_co_run_slowdown_is_the_guard_and_the_interference():
    assert planning_interference(measured(1.47)) == 1.47 and planning_guard(measured(1.47)) == 1.47
    assert planning_guard(measured(1.02)) == DEFAULT_GUARD  # the guard never drops below the configured one
    assert planning_guard(measured(1.02), guard=1.0) == 1.02
    assert planning_interference(LUT) == ASSUMED_INTERFERENCE and planning_guard(LUT) == DEFAULT_GUARD
    assert "assumed" in interference_source(LUT) and "measured 1.470" in interference_source(measured(1.47))
    with pytest.raises(ValueError, match="co_run_slowdown"):
        planning_interference(measured(0.5))
    with pytest.raises(ValueError, match=">= 1"):
        planning_guard(LUT, guard=0.9)


def test_one_design_default_everywhere():
    import yaml

    from oxygen_ros.commands.fleet_assign import build_parser
    from oxygen_ros.nodes.fleet_parameters import DEFAULTS

    config = yaml.safe_load(open("config/fleet.yaml"))["/**"]["ros__parameters"]
    args = build_parser().parse_args(["--fleet", "config/fleet.yaml", "--profile", "config/fleet.yaml", "--gpus", "1",
                                      "--out", "x"])
    assert DEFAULT_DESIGN == DEFAULTS["design"] == config["design"] == args.design == SimConfig().design
    assert DEFAULTS["guard"] == config["guard"] == args.guard == DEFAULT_GUARD


def test_fleet_assign_plans_with_the_tables_measured_slowdown(tmp_path, capsys):
    from oxygen_ros.commands.fleet_assign import main

    robots = [{"robot_id": f"robot{i}", "model_id": "m0", "rate_hz": 5.0, "slo_s": 0.2} for i in range(4)]
    (tmp_path / "fleet.json").write_text(json.dumps({"robots": robots}))
    measured(1.3).save(tmp_path / "lut.json")
    argv = ["--fleet", str(tmp_path / "fleet.json"), "--profile", str(tmp_path / "lut.json"), "--gpus", "2",
            "--seeds", "1", "--design", "robion", "--out", str(tmp_path / "a.json")]
    assert main(argv) == 0
    assert "interference measured 1.300 (the table's co-run slowdown), guard 1.300, design robion" in \
        capsys.readouterr().out


def test_the_table_seeds_both_ways_of_a_vlm_batch():
    # synthetic m0, batch 1: 32.0 ms back to back, 21.9 ms split (unguarded, the best share)
    split, back_to_back = table_costs(LUT, "m0", 1)
    assert split == pytest.approx(0.0219, abs=1e-4) and back_to_back == pytest.approx(0.032)
    device = LockstepPlanner(LUT, guard=1.3)
    assert device.costs(("m0", 1)) == (pytest.approx(1.3 * split), pytest.approx(back_to_back))
    assert device.measured_guard(("m0", 1)) == pytest.approx(1.3)


def test_pipelining_pays_where_the_split_measures_faster():
    assert pipeline_pays(0.02, 0.03) and pipeline_pays(0.0299, 0.03)
    assert not pipeline_pays(0.03, 0.03) and not pipeline_pays(0.04, 0.03)


def test_the_meter_keeps_a_running_median_seeded_by_the_table():
    meter = SplitMeter(split_prior=1.5, window=4)
    key = ("m0", 2)
    assert (meter.ratio(key, Way.SPLIT), meter.ratio(key, Way.BACK_TO_BACK)) == (1.5, 1.0)
    meter.record(key, Way.SPLIT, 0.03, 0.01)
    assert meter.ratio(key, Way.SPLIT) == pytest.approx(2.25)  # the prior still counts as one job
    for _ in range(4):
        meter.record(key, Way.SPLIT, 0.02, 0.01)
    assert meter.ratio(key, Way.SPLIT) == pytest.approx(2.0) and meter.measured(key, Way.SPLIT) == 5
    meter.record(key, Way.SPLIT, 0.02, 0.0)  # nothing predicted: nothing learnt
    assert meter.measured(key, Way.SPLIT) == 5 and meter.report()["m0/2"]["split_jobs"] == 5
    with pytest.raises(ValueError):
        SplitMeter(split_prior=0.0)


def drive(device: LockstepPlanner, steps: int, co_run_factor: float, idle_every: int = 4) -> list[str]:
    """A frame of m0 every step (and one step in `idle_every` none: the device has a moment to spare), each job
    run to its end: its batches' table seconds (side by side: the slowest, times `co_run_factor`, what co-running
    really costs here); how each job used the device."""
    now, ways = 0.0, []
    for i in range(steps):
        if i % idle_every:
            device.submit(frame(i, arrival=now, deadline=now + 1.0))
        for job in device.start(now):
            seconds = [b.seconds for b in job.batches]
            now += sum(seconds) if job.sequential else max(seconds) * (co_run_factor if job.co_run else 1.0)
            device.finish(job, now)
            ways.append("back_to_back" if job.sequential else "split" if job.co_run else "alone")
    return ways


def test_a_split_the_table_favours_but_that_measures_slower_gives_way_to_back_to_back():
    device = LockstepPlanner(LUT, guard=1.0)  # the table: 21.9 ms split against 32 ms back to back
    ways = drive(device, 60, co_run_factor=3.0)  # but side by side each stage takes 3x its table time here
    assert ways[:2] == ["alone", "split"]  # seeded by the table: pipelined
    assert ways[2] == "back_to_back"  # one split measured: median(1.0, 3.0) x 21.9 ms > 32 ms
    late = ways[8:]
    assert 0 < late.count("split") <= len(late) // EXPLORE_EVERY + 1  # tried again now and then, bounded
    assert late.count("back_to_back") >= len(late) - 3 * (len(late) // EXPLORE_EVERY + 1)
    assert device.meter.ratio(("m0", 1), Way.SPLIT) == pytest.approx(3.0)


def test_a_split_the_table_rules_out_but_that_measures_faster_is_taken():
    device = LockstepPlanner(LUT, guard=2.0)  # the table's guard: 43.8 ms split against 32 ms back to back
    ways = drive(device, 80, co_run_factor=1.0)  # co-running costs nothing here
    assert ways[:EXPLORE_EVERY - 1] == ["back_to_back"] * (EXPLORE_EVERY - 1)
    first = ways.index("split")  # tried once due and the device idle: alone, then split beside its action batch
    assert ways[first - 1] == "alone"
    late = ways[-20:]  # pipelined (a batch alone where nothing else waits), back to back only when tried again
    assert late.count("split") > len(late) // 3 and late.count("back_to_back") <= len(late) // EXPLORE_EVERY + 1
    assert device.meter.ratio(("m0", 1), Way.SPLIT) == pytest.approx(1.0)


def test_the_way_measuring_worse_is_never_tried_while_frames_wait():
    device = LockstepPlanner(LUT, guard=2.0)  # back to back preferred; a frame always waits behind each batch
    now, ways = 0.0, []
    for i in range(0, 60, 2):
        device.submit(frame(i, arrival=now, deadline=now + 1.0))
        device.submit(frame(i + 1, "m1", arrival=now, deadline=now + 1.0))
        for job in device.start(now):
            now += job.duration()
            device.finish(job, now)
            ways.append(job.sequential)
    assert all(ways) and device.explored == 0


def test_where_splitting_does_not_pay_a_batch_runs_its_two_stages_back_to_back():
    device = LockstepPlanner(LUT, guard=1.5)
    frames = [frame(i) for i in range(3)]
    for f in frames:
        device.submit(f)
    (job,) = device.start(0.0)
    vlm, action = job.batches
    assert job.sequential and not job.co_run
    assert (vlm.stage, action.stage) == (Stage.VLM, Stage.ACTION) and vlm.frames == action.frames == frames
    assert vlm.share == action.share == 1.0 and vlm.bucket == action.bucket == 4
    assert job.predicted_s == pytest.approx(vlm.seconds + action.seconds)
    end = job.duration()
    assert device.start(end / 2) == []  # one job at a time
    done = device.finish(job, end)
    assert done == frames and all(f.finish == end for f in frames)
    assert all(f.vlm_done == pytest.approx(vlm.seconds) and f.action_start == pytest.approx(vlm.seconds)
               for f in frames)
    assert device.pending() == 0  # nothing left between the stages


def test_an_action_batch_already_waiting_runs_first_in_the_monolithic_step():
    device = LockstepPlanner(LUT, guard=1.0)  # splitting pays: the first frame is pipelined
    first = frame(0, "m1")
    device.submit(first)
    (job,) = device.start(0.0)
    assert [b.stage for b in job.batches] == [Stage.VLM] and not job.sequential  # its action stage comes later
    device.finish(job, 0.02)
    device.meter.record(("m0", 1), Way.SPLIT, 0.05, 0.01)  # from now on a split of m0 measures 5x its table time
    device.meter.record(("m0", 1), Way.SPLIT, 0.05, 0.01)
    second = frame(1, "m0", arrival=0.02)
    device.submit(second)
    (job,) = device.start(0.02)
    assert [(b.stage, b.frames) for b in job.batches] == [(Stage.ACTION, [first]), (Stage.VLM, [second]),
                                                          (Stage.ACTION, [second])]
    end = 0.02 + job.duration()
    assert device.finish(job, end) == [first, second]
    ends = batch_ends(job, end)
    assert (first.finish, second.vlm_done, second.finish) == (ends[0], ends[1], end)
    assert first.finish < second.vlm_done < second.finish


def test_where_splitting_pays_the_lockstep_still_pipelines():
    device = LockstepPlanner(LUT, guard=1.0)
    for i in range(2):
        device.submit(frame(i, "m0"))
    (job,) = device.start(0.0)
    device.finish(job, job.duration())
    device.submit(frame(2, "m1", arrival=job.duration()))
    (nxt,) = device.start(job.duration())
    assert nxt.co_run and {b.stage for b in nxt.batches} == {Stage.VLM, Stage.ACTION}
    assert sum(b.share for b in nxt.batches) == pytest.approx(1.0)


def test_batch_ends_split_a_sequential_job_by_its_predicted_seconds():
    device = LockstepPlanner(LUT, guard=1.5)
    device.submit(frame(0))
    (job,) = device.start(1.0)
    vlm, action = job.batches
    ends = batch_ends(job, 1.0 + 2 * job.duration())  # ran twice as long as predicted: both stages did
    assert ends == [pytest.approx(1.0 + 2 * vlm.seconds), 1.0 + 2 * job.duration()]
