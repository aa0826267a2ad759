"""fleet-bench with --reprofile: each robot count is served between two real profiles and predicted from both."""

import json

import pytest

from oxygen_ros.commands import fleet_bench
from oxygen_ros.engine.planners import Stage
from oxygen_ros.fleet.profile_table import ProfileTable, mean_table


def test_mean_table_averages_entries_and_co_run_slowdowns():
    a = ProfileTable(meta={"co_run_slowdown": 1.2})
    b = ProfileTable(meta={"co_run_slowdown": 2.0})
    a.add("m", Stage.VLM, 1, 1.0, 0.010)
    b.add("m", Stage.VLM, 1, 1.0, 0.030)
    mean = mean_table(a, b)
    assert mean.latency("m", Stage.VLM, 1, 1.0) == pytest.approx(0.020)
    assert mean.meta["co_run_slowdown"] == pytest.approx(1.6) and "mean" in mean.meta["source"]
    b.add("m", Stage.ACTION, 1, 1.0, 0.005)
    with pytest.raises(ValueError, match="same"):
        mean_table(a, b)


def test_bench_reprofiles_after_each_count_and_reports_the_prediction_band(tmp_path, capsys):
    code = fleet_bench.main(["--robots", "2,4", "--designs", "monolithic,robion", "--duration", "0.5",
                            "--repeats", "2", "--max-batch", "2", "--slo", "1.0", "--reprofile",
                            "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "results.json").read_text())
    served = {d: list(points) for d, points in report["points"].items()}
    assert len(report["luts"]) == 1 + len({n for counts in served.values() for n in counts})
    for points in report["points"].values():
        for point in points.values():
            low, high = point["band"]
            assert low <= high
            assert sorted((point["sim"]["attainment"], point["sim_after"]["attainment"])) == [low, high]
            assert 0 <= point["sim_mean"]["attainment"] <= 1 and 0 <= point["sim_noise"]["attainment"] <= 1
            assert point["real_in_band"] == (low - 1e-9 <= point["real"]["attainment"] <= high + 1e-9)
    for lut in report["luts"]:
        factors = lut["meta"]["noise_factors"]  # every timed call of the profile, relative to its entry's median
        assert len(factors) == 2 * len(lut["entries"]) and all(f > 0 for f in factors)
    out = capsys.readouterr().out
    assert "before / after / their mean / the mean with their noise" in out
    assert "inside the before/after band at" in out and "with the profiles' noise" in out


def test_bench_serves_every_count_from_a_given_table_and_says_what_the_lockstep_measured(tmp_path, capsys):
    """--profile: no profiling here; --all-counts: every count is served although the first already misses (half
    its robots have a 2 ms budget no frame makes, the others 1 s); Robion's points carry its lockstep's
    measurements, the run its load average."""
    lut = "test/fixtures/fleet_cpu_lut.json"
    code = fleet_bench.main(["--profile", lut, "--robots", "4,5", "--designs", "monolithic,robion", "--duration",
                             "0.3", "--max-batch", "2", "--slo", "0.002,1.0", "--all-counts", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["luts"] == [ProfileTable.load(lut).to_dict()]  # the given table, not a new profile
    for design in ("monolithic", "robion"):
        assert list(report["points"][design]) == ["4", "5"]
        assert all(p["real"]["attainment"] < 0.98 for p in report["points"][design].values())
    lockstep = report["points"]["robion"]["5"]["lockstep"]
    jobs = sum(r["split_jobs"] + r["back_to_back_jobs"] for r in lockstep["ratios"].values())
    assert jobs > 0 and lockstep["explored"] >= 0
    assert all(r["back_to_back_ratio"] > 0 for r in lockstep["ratios"].values())
    assert "lockstep" not in report["points"]["monolithic"]["4"]
    load = report["load_average"]
    assert len(load["before"]) == len(load["after"]) == 3 and load["cores"] >= 1
    assert "lockstep jobs split" in capsys.readouterr().out


def test_bench_refuses_sm_partitions_off_a_gpu_and_a_profile_with_reprofile(capsys):
    with pytest.raises(SystemExit) as stop:
        fleet_bench.main(["--require-sm-partitions", "--robots", "2"])
    assert stop.value.code == 2 and "needs a CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        fleet_bench.main(["--profile", "test/fixtures/fleet_cpu_lut.json", "--reprofile"])
    assert stop.value.code == 2 and "--reprofile" in capsys.readouterr().err


def test_bench_imports_without_scipy():
    """The GPU check runs fleet-bench on a machine's own python, which may have no scipy (only the placement's
    MILP needs it)."""
    import subprocess
    import sys

    code = "import sys; sys.modules['scipy'] = None; import oxygen_ros.commands.fleet_bench"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
