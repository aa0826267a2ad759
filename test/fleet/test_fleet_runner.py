"""The fleet's profiler and the fleet-profile command on the served models' own runners, and real serving by the
fleet server against the simulator on one arrival list (tiny models)."""

import argparse
import dataclasses
import json
import statistics

import numpy as np
import pytest
import torch

from oxygen_ros.commands.fleet_bench import fleet_server, serve, warm_up
from oxygen_ros.commands.fleet_profile import main as profile_main
from oxygen_ros.engine.frames import ActionFrame
from oxygen_ros.engine.planners import Stage
from oxygen_ros.evaluation.bench.workloads import synthetic_frames
from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.profile_table import ProfileTable
from oxygen_ros.fleet.profiler import StageProfiler
from oxygen_ros.fleet.simulator import SimConfig, SimResult, cycle_factors, make_arrivals, simulate
from oxygen_ros.fleet.traffic import RobotSpec, robot_loads
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model

SPECS = [ModelSpec.parse("a=tiny:0"), ModelSpec.parse("b=tiny:1")]


@pytest.fixture(scope="module")
def profiler():
    profiler = StageProfiler(SPECS, max_batch=8, cpu_threads=2)
    yield profiler
    profiler.close()


def test_model_spec_parsing():
    assert ModelSpec.parse("a=tiny:3") == ModelSpec("a", "tiny", 3)
    assert ModelSpec.parse("tiny") == ModelSpec("tiny", "tiny", 0)
    assert ModelSpec.parse("wide=cfg.json") == ModelSpec("wide", "cfg.json", 0)
    with pytest.raises(ValueError, match="is neither a checkpoint folder nor a hub repo id"):
        StageProfiler([ModelSpec("x", "no-such-preset")])


def test_co_located_variants_are_different_models_on_the_same_runner_code(profiler):
    """A VLM stage writes each frame's own prefix into the slot it keeps; the seed-1 variant is another model."""
    runner = profiler.runners["a"]
    config = runner.model.config
    frames, _ = synthetic_frames(config, 3, seed=7)
    done = runner.prefill_stage(frames, 4)  # 3 frames -> bucket 4, one padding row
    reference = build_model(config, seed=0)
    cache = KVCache(config, 1, config.prefix_len)
    for frame, slot in zip(frames, done.slots):
        reference.prefill(frame, cache, torch.tensor([0]))
        torch.testing.assert_close(runner.pool.cache.k[:, slot], cache.k[:, 0], rtol=1e-4, atol=1e-5)
    runner.free(done.slots)
    other = profiler.runners["b"]
    (slot,) = other.prefill_stage(frames[:1], 1).slots
    reference.prefill(frames[0], cache, torch.tensor([0]))
    assert not torch.allclose(other.pool.cache.k[:, slot], cache.k[:, 0])
    other.free([slot])
    assert runner.slots_in_use == other.slots_in_use == 0


def test_fleet_profile_command_writes_a_measured_lut(tmp_path, capsys):
    out = tmp_path / "lut.json"
    argv = ["--models", "a=tiny:0,b=tiny:1", "--max-batch", "2", "--repeats", "1", "--warmup", "1"]
    assert profile_main([*argv, "--cpu-threads", "2", "--out", str(out)]) == 0
    lut = ProfileTable.load(out)
    assert lut.models() == ["a", "b"] and lut.meta["source"] == "measured"
    assert lut.batches("a", Stage.VLM, 0.5) == [1, 2] and lut.shares("b", Stage.ACTION) == [0.5, 1.0]
    assert lut.meta["co_run_slowdown"] >= 1.0 and lut.meta["models"]["b"] == {"source": "tiny", "seed": 1}
    assert json.loads(out.read_text())["meta"]["share_meaning"] == "CPU thread budget"
    assert lut.meta["dtype"] == "float32"  # the default on a CPU; bfloat16 on CUDA, as a GPU deployment serves
    assert "co-run slowdown" in capsys.readouterr().out


def bench_args(max_batch=8):
    return argparse.Namespace(max_batch=max_batch, device="cpu", cpu_threads=2, cuda_graphs=False)


@pytest.mark.system  # real serving on the wall clock
def test_a_fleet_server_answers_every_frame_of_an_arrival_list_and_gives_every_slot_back(profiler):
    lut = profiler.profile(repeats=3, warmup=1)
    # What is tested here is the accounting: each frame served or dropped, every slot back, batches closed at their
    # start. How many make their SLO is the machine's speed (120 frames/s of a few ms each meet a 0.5 s SLO on calm
    # cores; at load 12 a third of them did), so only "some were served in time" is asserted; the simulator test
    # checks attainment.
    robots = [RobotSpec(f"r{i}", "ab"[i % 2], 20.0, 0.5) for i in range(6)]
    server = fleet_server(SPECS, robots, "robion", lut, bench_args())
    try:
        result = serve(server, robots, make_arrivals(robots, SimConfig(duration_s=1.0)))
    finally:
        server.close()
    assert len(result.frames) == 6 * 20
    assert all(f.dropped != (f.finish is not None) for f in result.frames)
    for record in result.jobs:
        for batch in record.job.batches:
            assert all(f.arrival <= record.job.start for f in batch.frames)  # closed batches
    assert all(r.slots_in_use == 0 for r in server.runtime.runners.values())
    assert result.attainment > 0, result.summary()


def as_delivered(scheduled: list[ActionFrame], real: SimResult, slo: float) -> list[ActionFrame]:
    """The arrival list `scheduled` that `serve` replayed, as the real server received it: fresh frames with their
    deadlines kept and their arrivals moved by how late the replay submitted them (a frame the server refused as
    already past its deadline, which `serve` keeps as the scheduled frame itself, arrives at its deadline)."""
    refused = {id(frame) for frame in scheduled}
    queued = {f.context: f for f in real.frames if id(f) not in refused}
    frames = []
    for frame in scheduled:
        got = queued.get(frame.context)
        lag = slo if got is None else max(0.0, got.arrival - (got.deadline - slo))  # deadline: due + slo
        frames.append(ActionFrame(frame.model_id, None, False, frame.deadline, frame.arrival + lag, frame.robot_id,
                                  context=frame.context))
    return frames


def compare_one_run(profiler) -> tuple[bool, dict]:
    """Measure the table, serve for real, simulate the same arrivals; (whether the simulation agrees, the figures).
    The rules are those of the test below."""
    scale, light, crushing = 1.0, 0.0, float("inf")  # load scales known to be light / crushing
    for _ in range(5):
        lut = profiler.profile(repeats=5, warmup=2)
        slowdown = lut.meta["co_run_slowdown"]
        slo = max(0.03, 8 * (lut.latency("a", Stage.VLM, 1) + lut.latency("a", Stage.ACTION, 1)))
        per_robot = robot_loads([RobotSpec("x", "a", 20.0, slo)], lut, batch=8, guard=max(1.1, slowdown))[0]
        n = min(600, max(2, round(scale / per_robot)))
        robots = [RobotSpec(f"r{i}", "ab"[i % 2], 20.0, slo) for i in range(n)]
        config = SimConfig(design="robion", duration_s=2.5, guard=1.1, interference=slowdown, seed=1)
        server = fleet_server(SPECS, robots, "robion", lut, bench_args())
        try:
            warm_up(server, robots, 8)
            scheduled = make_arrivals(robots, config)
            real = serve(server, robots, scheduled)
        finally:
            server.close()
        factors = cycle_factors([r.job for r in real.jobs], slowdown)
        if 0.05 <= real.attainment < 0.95 and 0.5 <= statistics.median(factors) <= 2.5:
            break
        # The machine's speed changed between profiling and the run: measure again, and offer more (fewer)
        # robots if the run found this load light (crushing), halfway (geometrically) to a known opposite.
        if real.attainment >= 0.95:
            light = scale
        elif real.attainment < 0.05:
            crushing = scale
        if light and crushing < float("inf"):
            scale = (light * crushing) ** 0.5
        elif light:
            scale = 2 * light
        elif crushing < float("inf"):
            scale = crushing / 2
    assert 0.05 <= real.attainment < 0.95, (n, slo, real.summary())  # a saturated device, not a swamped one
    assert 0.5 <= statistics.median(factors) <= 2.5, statistics.median(factors)  # the table describes the run
    sim = simulate(robots, {r.robot_id: 0 for r in robots}, lut, dataclasses.replace(config, duration_factors=tuple(factors)),
                   frames=as_delivered(scheduled, real, slo))
    served = [[f.latency for f in run.frames if f.finish is not None] for run in (real, sim)]
    p90 = [float(np.percentile(latencies, 90)) for latencies in served]
    figures = {"robots": n, "slowdown": round(slowdown, 2), "attainment": (real.attainment, sim.attainment),
               "served": (len(served[0]), len(served[1])), "p90_s": tuple(round(x, 4) for x in p90)}
    agrees = (0 < sim.attainment < 1  # not trivially all (nor nothing)
              and abs(real.attainment - sim.attainment) <= 0.15 and 0.8 <= len(served[0]) / len(served[1]) <= 1.2
              and 1 / 1.5 <= p90[0] / p90[1] <= 1.5)
    return agrees, figures


@pytest.mark.system  # real serving on the wall clock
@pytest.mark.alone  # compares this machine's speed minutes apart: nothing of the suite's own may run beside it
def test_simulator_matches_a_real_run_with_the_measured_lut(profiler):
    """Real Robion serving of 2 co-located tiny models by a fleet server vs the simulator fed the table just
    measured on the same models, with the measured co-run slowdown as its interference factor and the same
    arrivals (same seed). Guard 1.1 (the default headroom): a guard as large as the co-run slowdown (2-3x here)
    also inflates ESF's remaining-time estimate, and the simulation then fell into an overload collapse the real
    run avoided.

    The load (robots x 20 Hz; SLO 30 ms on calm cores, 8x the table's single-frame VLM + action time when the
    machine is slower than that; the robot count is picked from the table so that the traffic controller's load
    model, which assumes full batches of 8, puts it at 1.0x the device; with a tight SLO batches stay smaller, so
    the device completes about half of it: about 70 robots on calm cores) keeps attainment well below a trivial
    100%; there it is set by how many frames per second the device completes and by which ones ESF lets
    expire, which is what the simulation has to get right.

    These 2 cores are shared with other processes that come and go (load averages of 6-13 seen), so during the
    run the machine is slower or faster than while profiling, and unevenly so. The simulation therefore replays
    the run's service-time drift: the k-th simulated job lasts its table time times the k-th observed
    cycle/table ratio of the real run (``cycle_factors``, in order, so slow spells stay together), and frames
    arrive as the real server received them (``as_delivered``: the replay that submits them shares the process and
    the cores, and on a loaded machine fell behind by up to the SLO, so that hundreds of frames reached the server
    already expired). That removes the machine's mood, not the model: batching, partition choice, lockstep timing, queueing and expiry are still
    the simulator's own. The comparison needs a run that the table describes (median factor within [0.5, 2.5])
    on a saturated device (real attainment within [0.05, 0.95)); when the machine changed speed so much that a
    run misses either, the table is measured again and the robot count doubled or halved (bisected once a load
    on either side is known), up to five runs.
    Tolerance: 0.15 absolute in attainment, 20 % in frames served (in time or late) and a factor 1.5 in the
    served frames' 90th-percentile latency. Not the median: since the lockstep runs the monolithic step here (no
    split pays at the measured slowdown), served latencies spread under this overload from one job's time to near
    the SLO, and the median moves within that spread from run to run while the upper tail stays put (real/sim median
    ratios of 0.42-2.9 in 14 runs here, while attainment agreed within 0.11, the 90th percentiles at 0.82-1.11 and
    the served counts at 0.92-1.14; docs/results/2026-12-fleet.md); the rest is margin for an uneven machine.

    On a loaded machine (three busy loops beside it) single comparisons still miss now and then: of 52, attainment
    differed by more than 0.15 in 3 (0.16, 0.21, 0.29; median difference 0.025; docs/results/2026-12-fleet.md). So
    the verdict is the majority of up to three comparisons, each with its own table and run: a simulator that is
    wrong fails them all."""
    rounds = []
    while len(rounds) < 3 and 2 not in (sum(ok for ok, _ in rounds), sum(not ok for ok, _ in rounds)):
        rounds.append(compare_one_run(profiler))
    assert sum(ok for ok, _ in rounds) >= 2, rounds
