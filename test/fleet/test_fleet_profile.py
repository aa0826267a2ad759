"""Profile table: a real callable is timed, the LUT saves and loads back, lookups interpolate; and the CLI."""

import json

import pytest
import torch

from oxygen_ros.commands.fleet_sim import main
from oxygen_ros.engine.planners import Stage
from oxygen_ros.fleet.profile_table import ProfileTable, find_inversions, synthetic_table
from oxygen_ros.fleet.profiler import profile_stages


def matmul_stage_runner():
    """A stand-in stage runner doing real work proportional to the batch (64 rows of activations per frame
    through a stack of matmuls); the action stage does half as many layers. It ignores the share: this test
    proves the profiler measures a callable, not how a CPU thread budget scales."""
    torch.manual_seed(0)
    weight = torch.randn(256, 256) / 16
    calls = []

    def run(model_id, stage, bucket, share):
        x = torch.randn(64 * bucket, 256)
        for _ in range(8 if stage is Stage.VLM else 4):
            x = torch.tanh(x @ weight)
        calls.append((model_id, stage, bucket, share))

    return run, calls


def test_profiler_measures_a_real_callable_and_the_lut_loads_back(tmp_path):
    torch.set_num_threads(1)
    run, calls = matmul_stage_runner()
    table = profile_stages(run, ["a", "b"], buckets=[1, 16], partitions=[0.5, 1.0], repeats=3, warmup=1)
    assert len(table.entries) == 2 * 2 * 2 * 2
    assert len(calls) == len(table.entries) * 4  # 1 warm-up + 3 timed per entry
    assert {n for _, _, n, _ in calls} == {1, 16} and {share for *_, share in calls} == {0.5, 1.0}
    for model in ("a", "b"):
        for stage in Stage:
            for share in (0.5, 1.0):
                assert table.latency(model, stage, 16, share) > 2 * table.latency(model, stage, 1, share)
    assert table.meta["source"] == "measured"
    path = tmp_path / "lut.json"
    table.save(path)
    loaded = ProfileTable.load(path)
    assert loaded.entries == table.entries and loaded.meta == table.meta


def test_lookup_interpolates_between_buckets_and_requires_profiled_shares():
    table = ProfileTable()
    table.add("m", Stage.VLM, 1, 1.0, 0.010)
    table.add("m", Stage.VLM, 4, 1.0, 0.040)
    table.add("m", Stage.VLM, 8, 1.0, 0.060)
    assert table.latency("m", Stage.VLM, 2, 1.0) == pytest.approx(0.020)
    assert table.latency("m", Stage.VLM, 6, 1.0) == pytest.approx(0.050)
    assert table.latency("m", Stage.VLM, 16, 1.0) == pytest.approx(0.100)  # extrapolated from 4..8
    with pytest.raises(KeyError, match="no profile"):
        table.latency("m", Stage.VLM, 2, 0.5)
    with pytest.raises(ValueError):
        table.add("m", Stage.ACTION, 1, 1.0, 0.0)


def test_synthetic_lut_is_labelled_and_shaped_like_the_latency_model():
    table = synthetic_table({"small": 0.5, "big": 1.5})
    assert table.meta["source"] == "synthetic"
    for stage in Stage:
        assert table.latency("big", stage, 1) > table.latency("small", stage, 1)
        assert table.latency("big", stage, 8) < 8 * table.latency("big", stage, 1)  # sublinear batching
        assert table.latency("big", stage, 4, 0.5) > table.latency("big", stage, 4, 1.0)


def test_the_fleet_sim_command_writes_its_results_per_run_and_assignment_and_its_plot(tmp_path, capsys):
    lut_path = tmp_path / "lut.json"
    synthetic_table({"x": 0.8, "y": 1.2}).save(lut_path)
    out = tmp_path / "out"
    argv = ["--runs", "monolithic:esf,robion:esf,robion:rr", "--assign", "even", "--gpus", "1", "--models", "2",
            "--duration", "1.5", "--seeds", "2", "--max-robots", "24"]
    assert main([*argv, "--profile", str(lut_path), "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert set(report["runs"]) == {"monolithic:esf", "robion:esf", "robion:rr"} and set(report["assignments"]) == {
        "even"}
    for summary in [*report["runs"].values(), *report["assignments"].values()]:
        assert len(summary["robots_per_seed"]) == 2
        assert summary["robots_min"] <= summary["robots_median"] <= summary["robots_max"] <= 24
        assert summary["robots_min"] >= 1 and 0 <= summary["worst_robot_attainment_min"] <= 1
    assert (out / "robots_at_98.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "robots at 98% SLO" in printed and f"LUT: {lut_path} (source: synthetic)" in printed
    main(["--runs", "robion:esf", "--assign", "", "--gpus", "1", "--models", "1", "--seeds", "1", "--max-robots", "4",
          "--duration", "1", "--out", str(out)])
    assert "SYNTHETIC" in capsys.readouterr().out


def test_inversions_are_flagged():
    table = ProfileTable()
    for batch, seconds in ((1, 0.010), (2, 0.012), (4, 0.011), (8, 0.020)):  # batch 4 faster than batch 2
        table.add("m", Stage.VLM, batch, 1.0, seconds)
        table.add("m", Stage.VLM, batch, 0.5, 1.5 * seconds)
    table.add("m", Stage.VLM, 1, 0.25, 0.009)  # a quarter of the device faster than half of it
    table.add("m", Stage.ACTION, 1, 0.5, 0.010)
    table.add("m", Stage.ACTION, 1, 1.0, 0.013)  # the whole device slower than half of it
    found = find_inversions(table)
    assert len(found) == 4, found  # batch 2 -> 4 at both shares, share 0.25 -> 0.5 at batch 1, action 0.5 -> 1
    assert any("batch 4" in line and "share 0.5" in line for line in found)
    assert any(line.startswith("m action batch 1: share 1") for line in found)
    assert table.fastest_share("m", Stage.ACTION, 1) == 0.5 and table.fastest_share("m", Stage.VLM, 1) == 0.25


def test_co_run_probe_times_every_way_with_one_thread_per_co_running_stage(capsys):
    from oxygen_ros.evaluation.fleet.co_run_probe import main as probe_main

    assert probe_main(["--repeats", "1", "--cycles", "1", "--num-steps", "2", "--bucket", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    ways = ["alone, 1 thread", "co-run: stage workers", "co-run: bare threads", "co-run: threads, switch 0.5 ms",
            "co-run: processes", "alone + Python neighbour", "same, switch 0.5 ms", "alone, 2 threads"]
    expected = [(way, stage) for way in ways for stage in ("vlm", "action")]
    assert len(lines) == len(expected)
    assert all(line.startswith(way) and line[len(way):].split()[0] == stage
               for line, (way, stage) in zip(lines, expected)), lines
    for line in lines:
        threads = "[2]" if line.startswith("alone, 2 threads") else "[1]"
        assert line.endswith(f"intra-op threads {threads}") and " median " in line, line
