"""Planning with measured figures: the co-run slowdown a table measured is the guard and the interference every
planner uses, one design default everywhere, and the lockstep's monolithic step (a batch's two stages back to back
where splitting does not pay), down to the simulator's interference sweep: Robion never serves fewer robots at
98 % than monolithic."""

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
from oxygen_ros.fleet.lockstep import MIN_SPLIT_GAIN, LockstepPlanner, batch_ends, split_pays
from oxygen_ros.fleet.profile_table import ProfileTable, synthetic_table
from oxygen_ros.fleet.simulator import SimConfig

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


def test_a_split_pays_only_by_a_margin_over_back_to_back():
    # synthetic m0, batch 1: 32.0 ms back to back, 21.9 ms split unguarded (x guard)
    assert split_pays(LUT, "m0", 1, guard=1.0)
    assert split_pays(LUT, "m0", 1, guard=1.2)  # 26.3 ms: 22 % faster
    assert not split_pays(LUT, "m0", 1, guard=1.3)  # 28.5 ms: 12 % faster, not worth a lockstep of latency
    assert split_pays(LUT, "m0", 1, guard=1.3, min_gain=0.1)
    assert not split_pays(LUT, "m0", 1, guard=1.5, min_gain=0.0)  # a slower split: back to back
    assert MIN_SPLIT_GAIN == 0.15
    with pytest.raises(ValueError):
        split_pays(LUT, "m0", 1, guard=1.0, min_gain=-0.1)


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
    device.guard = 2.0  # from now on a split never pays (the planner is asked afresh)
    device._pays.clear()
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


def test_robion_never_serves_fewer_robots_than_monolithic_across_interference(tmp_path, capsys):
    """The simulator's interference sweep, reduced (1 device, 2 models, 3 s, 5 seeds; docs/fleet.md has the full
    fleet): with the guard equal to the true co-run slowdown, Robion's robots at 98 % (median over seeds) are at
    least monolithic's at every interference, and more where co-running costs little."""
    from oxygen_ros.commands.fleet_sim import main

    sweep = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    argv = ["--out", str(tmp_path), "--runs", "monolithic:esf,robion:esf", "--assign", "", "--gpus", "1",
            "--models", "2", "--duration", "3", "--max-robots", "32", "--sweep-interference",
            ",".join(map(str, sweep))]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["interference_sweep"]
    assert [row["interference"] for row in rows] == sweep
    robots = {row["interference"]: (row["monolithic:esf"]["robots_median"], row["robion:esf"]["robots_median"])
              for row in rows}
    assert all(robion >= monolithic > 0 for monolithic, robion in robots.values()), robots
    assert robots[1.0][1] > robots[1.0][0], robots
    assert "interference sweep (guard = interference)" in capsys.readouterr().out
