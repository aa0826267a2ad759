"""The benchmark command runs the whole quick matrix end to end and writes what the docs promise."""

import dataclasses
import json

from oxygen_ros.evaluation.bench import oxygen_bench as bench
from oxygen_ros.evaluation.bench.modes import SETTINGS
from oxygen_ros.evaluation.bench.oxygen_bench import main

REQUIRED = {"setting", "preset", "device", "denoise_steps", "decode_len", "tokens_per_frame", "action_hz",
            "action_latency_p50_ms", "action_latency_p99_ms", "deadline_misses", "tokens_per_s", "peak_memory_mb"}


def test_quick_bench_writes_results_table_and_plots(tmp_path, capsys):
    assert main(["--preset", "tiny", "--quick", "--frames", "2", "--rounds", "1", "--dtype", "bfloat16",
                 "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "results.json").read_text())
    assert records and all(REQUIRED <= set(r) for r in records)
    assert {r["setting"] for r in records} == set(SETTINGS)
    assert {r["decode_len"] for r in records if r["sweep"] == "decode_len"} == {10, 50, 200}
    for r in records:
        assert r["action_hz"] > 0 and r["frames"] == 2 and r["preset"] == "tiny" and r["dtype"] == "bfloat16"
        if r["setting"] == "action_only":
            assert r["tokens_per_s"] == 0, r
        elif r["arrival"] == "every_frame" and r["setting"] != "parallel":
            # (2 frames of a burst pattern may all be quiet ones; `parallel`'s own language thread may not get the
            # interpreter before a 2-frame window ends on a loaded machine, as a second process may not get a core)
            assert r["tokens_per_s"] > 0, r
    table = (tmp_path / "results.md").read_text()
    assert table.count("| continuous_batching |") == 6 and "speedup" in table
    for plot in ("action_hz_vs_decode_len.png", "tokens_per_s_vs_action_hz.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "headline (decode_len 50, bfloat16)" in out and "energy: not measured (no GPU)" in out
    assert all(r["energy_j"] is None and r["energy"] == "energy: not measured (no GPU)" for r in records)


def test_goal_point_runs_both_dtypes_in_one_run_and_checks_the_goals(tmp_path, capsys, monkeypatch):
    ran = []  # the settings in the order they ran, each through its real runner

    def spy(name, run):
        def call(*args, **kwargs):
            ran.append(name)
            return run(*args, **kwargs)
        return call

    monkeypatch.setattr(bench, "RUNNERS", {name: spy(name, run) for name, run in bench.RUNNERS.items()})
    # the goal points as they are, with 8 tokens a narration instead of 50: continuous batching warms up for a
    # narration's life (decode_len / k frames), which the run's logic does not need to be 50 frames long here
    matrix = bench.matrix
    monkeypatch.setattr(bench, "matrix", lambda quick, goals=False: [
        dataclasses.replace(point, decode_len=8) for point in matrix(quick, goals)])
    assert main(["--preset", "tiny", "--goals", "--frames", "2", "--rounds", "2", "--dtype", "float32", "bfloat16",
                 "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "results.json").read_text())
    settings = ("baseline", "continuous_batching", "action_only", "continuous_batching_overlap")
    narrated = ("continuous_batching", "continuous_batching_overlap")
    assert [(r["dtype"], r["sweep"], r["setting"]) for r in records] == [
        (dtype, sweep, setting) for dtype in ("float32", "bfloat16")
        for sweep, names in (("goals", settings), ("goals_timer", narrated)) for setting in names]
    assert all(r["tokens_per_frame"] == (1 if r["sweep"] == "goals" else "adaptive") and r["decode_len"] == 8
               and r["overlap_threads"] == 1 and r["rounds"] == 2 and len(r["round_action_hz"]) == 2
               for r in records)
    # per dtype: the control period's own action_only run, then the two rounds of each point; action_only runs
    # next to each narrated setting, and every other round runs the settings backwards
    assert ran == ["action_only", *settings, *settings[::-1], *narrated, *narrated[::-1]] * 2
    out = capsys.readouterr().out
    for dtype in ("float32", "bfloat16"):
        for setting in narrated:
            assert f"goals ({dtype}, {setting}):" in out
            assert f"timer ({dtype}, {setting}, adaptive k, floor 1):" in out
    assert "floor steps past the tick" in out and "round by round" in out
    assert "tokens/s against" in out and " requests dropped" in out
    assert all(r["requests_dropped"] == 0 for r in records)
    # k = 1 over 2 measured frames: every request in flight gets one token a frame, the newest its first
    for r in records:
        if r["setting"].startswith("continuous_batching"):
            assert r["tokens_per_s"] > 0, r


def test_model_bench_times_a_preset_in_the_dtype_asked_for(capsys):
    from oxygen_ros.evaluation.bench.model_bench import main as model_bench

    model_bench(["--presets", "tiny", "--batches", "1", "--repeats", "1", "--dtype", "bfloat16"])
    out = capsys.readouterr().out
    timings = out.split("CPU bfloat16", 1)[1]  # after the parameter counts
    (row,) = [line.split() for line in timings.splitlines() if line.startswith("tiny ")]
    assert row[:2] == ["tiny", "1"] and all(float(x) > 0 for x in row[3:])
    # the memory line: bfloat16 weights (2 bytes per parameter) and one KV slot of the prefix + 32 tokens
    assert "tiny: memory 0.21 M parameters, weights 0.00 GiB, resident " in timings
    assert "KV pool slot 0.02 MiB (96 + 32 tokens)" in timings


def test_decode_bench_times_the_compiled_step_beside_the_eager_one_and_its_floors(capsys):
    from oxygen_ros.evaluation.bench.decode_bench import main as decode_bench

    assert decode_bench(["--preset", "tiny", "--batches", "16", "--dtypes", "float32", "--rounds", "1", "--steps",
                         "1", "--cpu-kernel"]) == 0
    rows = {" ".join(line.split()[2:-3]): line.split()[-3:] for line in capsys.readouterr().out.splitlines()
            if line.startswith("float32")}
    # 16 requests: float32 steps take the head fused with the greedy choice (`cpu_kernel.head_greedy_pays`)
    for variant in ("decode_batch", "decode_batch cpu kernel", "fused head+greedy", "floor: head matmul"):
        assert float(rows[variant][0]) > 0 and float(rows[variant][1]) > 0, rows
    assert float(rows["floor: head matmul"][1]) == 1.0  # the ratios are against that floor


def test_decode_bench_times_a_denoising_beside_the_step_and_beside_its_head(capsys):
    from oxygen_ros.evaluation.bench.decode_bench import main as decode_bench

    assert decode_bench(["--preset", "tiny", "--batches", "16", "--dtypes", "float32", "--rounds", "1", "--steps",
                         "2", "--cpu-kernel", "--beside"]) == 0
    rows = {" ".join(line.split()[2:-1]): float(line.split()[-1]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("float32")}
    for case in ("denoise alone", "denoise beside the step", "denoise beside its kernels", "denoise beside the head",
                 "step alone", "step beside denoise"):
        assert rows[case] > 0, rows
