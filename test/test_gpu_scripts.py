"""The GPU scripts as far as a CPU machine can check them: `gpu_check.sh` without a GPU stops with one line, the
CUDA suite collects without one, and the run's steps (their order, the time kept for `bench_pi05`, what is left
out where the driver makes no SM partitions) with a stand-in interpreter that reports a CUDA device and records
what it is asked to run instead of running it."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = ["test_gpu", "bench_pi05", "bench_small", "fleet_profile", "bench_goals", "bench_small_graphs",
         "fleet_profile_graphs"]


def gpu_check(out: Path, *steps: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/gpu_check.sh", str(out), *steps], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=os.environ | env)


def test_gpu_check_without_a_gpu_stops_with_one_line(tmp_path):
    # this CPU interpreter, and no device visible even where the machine has one: a dry run everywhere
    result = gpu_check(tmp_path / "gpu", GPU_PY=sys.executable, CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("no python with CUDA torch and a GPU here (") and sys.executable in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "gpu").exists()  # stopped before anything was written


def defined_tests(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def test_the_cuda_suite_collects_without_a_gpu(tmp_path):
    defined = {f"test_gpu/{path.name}::{name}" for path in sorted((REPO / "test_gpu").glob("test_*.py"))
               for name in defined_tests(path)}
    assert len(defined) >= 10
    # a plugin for this run only: which collected tests carry the marker gpu_check.sh leaves out without SM partitions
    (tmp_path / "say_marks.py").write_text(
        "def pytest_collection_finish(session):\n"
        "    print('marked:', *[i.nodeid for i in session.items if i.get_closest_marker('sm_partitions')])\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-p", "say_marks", "test_gpu"], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env=os.environ | {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    collected = {re.sub(r"\[.*\]$", "", line) for line in lines if "::" in line and not line.startswith("marked:")}
    assert collected == defined, result.stdout  # every test defined there
    marked = {re.sub(r"\[.*\]$", "", t) for line in lines if line.startswith("marked:") for t in line.split()[1:]}
    assert marked == {t for t in defined if t.startswith("test_gpu/test_cuda_fleet.py::")}  # the partition tests


def stand_in_python(tmp_path: Path, partitions: bool) -> tuple[Path, Path]:
    """An interpreter that passes `gpu_env.py` as a CUDA device would, passes or fails `--driver` (green contexts)
    and writes every other command line it gets to calls.log."""
    calls = tmp_path / "calls.log"
    driver = ('echo "green contexts: a stand-in"; exit 0' if partitions
              else 'echo "green contexts unavailable: a stand-in" >&2; exit 1')
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
case "$*" in
  "scripts/gpu_env.py") echo "torch 2.13.0, CUDA 13.0, a stand-in GPU"; exit 0 ;;
  "scripts/gpu_env.py --driver") echo "torch 2.13.0, CUDA 13.0, a stand-in GPU"; {driver} ;;
esac
echo "$*" >>{calls}
""")
    python.chmod(0o755)
    return python, calls


def step_of(call: str) -> str:
    """Which step of gpu_check.sh a recorded command line is (the module and its output)."""
    if " pytest " in f" {call} ":
        return "test_gpu"
    return Path(call.split("--out ")[1].split()[0]).stem.replace("fleet_lut_small", "fleet_profile")


def test_gpu_check_runs_every_step_pi05_second(tmp_path):
    python, calls = stand_in_python(tmp_path, partitions=True)
    result = gpu_check(tmp_path / "gpu", GPU_PY=str(python), GPU_CHECK_BUDGET_S="2000")
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = calls.read_text().splitlines()
    assert [step_of(call) for call in recorded] == STEPS
    assert "sm_partitions" not in recorded[0]  # the whole CUDA suite
    assert "--preset pi05" in recorded[1]
    assert (tmp_path / "gpu" / "device.txt").read_text() == ("torch 2.13.0, CUDA 13.0, a stand-in GPU\n"
                                                             "green contexts: a stand-in\n")


def test_gpu_check_without_sm_partitions_runs_the_rest(tmp_path):
    python, calls = stand_in_python(tmp_path, partitions=False)
    result = gpu_check(tmp_path / "gpu", GPU_PY=str(python), GPU_CHECK_BUDGET_S="2000")
    assert result.returncode == 0, result.stdout + result.stderr  # no failed step: the preflight is not one
    recorded = calls.read_text().splitlines()
    assert [step_of(call) for call in recorded] == [s for s in STEPS if not s.startswith("fleet_profile")]
    assert recorded[0].endswith("-m not sm_partitions test_gpu")
    for name in ("fleet_profile", "fleet_profile_graphs"):
        assert f"=== {name}: skipped, no SM partitions here (device.txt)" in result.stdout.splitlines()
    device = (tmp_path / "gpu" / "device.txt").read_text().splitlines()
    assert device[0] == "torch 2.13.0, CUDA 13.0, a stand-in GPU"  # said before the failed check
    assert "green contexts unavailable: a stand-in" in device
    assert device[-1].startswith("preflight failed: no SM partitions here")


def limits(stdout: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^=== (\w+) \(limit (\d+) s\)$", stdout, re.MULTILINE)}


def test_the_budget_keeps_time_for_pi05(tmp_path):
    python, _ = stand_in_python(tmp_path, partitions=True)
    # a 400 s budget keeps 200 s for bench_pi05: the CUDA suite before it gets at most the other 200 (not its 300)
    given = limits(gpu_check(tmp_path / "a", "test_gpu", "bench_pi05", GPU_PY=str(python),
                             GPU_CHECK_BUDGET_S="400").stdout)
    assert given.keys() == {"test_gpu", "bench_pi05"}
    assert given["test_gpu"] <= 200 <= given["bench_pi05"]
    # without bench_pi05 in the run nothing is kept: the suite's own limit
    assert limits(gpu_check(tmp_path / "b", "test_gpu", GPU_PY=str(python), GPU_CHECK_BUDGET_S="400").stdout) == {
        "test_gpu": 300}
