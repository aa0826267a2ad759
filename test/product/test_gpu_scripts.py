"""The GPU scripts as far as a CPU machine can check them: `gpu_check.sh` on an interpreter lacking any package the
checks import stops with one line naming each missing one; the CUDA suite collects without a GPU; and the run's
steps (their order, their limits within the budget, what is left out where the driver makes no SM partitions, the
archive every finished step is packed into, cut or not) with a stand-in interpreter that reports a CUDA device and
records what it is asked to run instead of running it."""

import ast
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = ["test_gpu", "pi05_graphs", "frame_parts", "pi05_eager", "goals", "fleet_profile", "summary"]
sys.path.insert(0, str(REPO / "scripts"))
from gpu_env import NEEDED  # noqa: E402 - the scripts folder is no package


def gpu_check(out: Path, *steps: str, archive: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    where = ["--archive", str(archive)] if archive else []
    return subprocess.run(["bash", "scripts/gpu_check.sh", *where, str(out), *steps], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=os.environ | env)


def test_gpu_check_without_a_gpu_stops_with_one_line(tmp_path):
    # this CPU interpreter, and no device visible even where the machine has one: a dry run everywhere
    result = gpu_check(tmp_path / "gpu", GPU_PY=sys.executable, CUDA_VISIBLE_DEVICES="")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("no python fit for the GPU checks here (") and sys.executable in lines[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "gpu").exists()  # stopped before anything was written


def lacking(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ImportError:
        return True


@pytest.mark.parametrize("module", list(NEEDED))
def test_the_device_command_names_each_missing_package_in_one_line(tmp_path, module):
    """The device command as a lent GPU machine runs it (no GPU_PY: the first fit of .venv/bin/python and the
    python3 on PATH), with a python3 that is this interpreter lacking `module`: one line, naming that package and
    whatever else this interpreter lacks, and nothing run."""
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class Lacks:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r} or name.startswith({module!r} + '.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Lacks())\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f"#!/bin/sh\nPYTHONPATH={blocker} exec {sys.executable} \"$@\"\n")
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_PY", "PYTHONPATH")}
    result = subprocess.run(["bash", "scripts/gpu_check.sh", "--archive", str(tmp_path / "back")], cwd=REPO,
                            capture_output=True, text=True, timeout=120,
                            env=env | {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"})
    assert result.returncode == 1 and result.stdout == "", result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    said = result.stderr.split("python3: ", 1)[1].split("); set GPU_PY", 1)[0]
    expected = [f"{package} ({name})" for name, package in NEEDED.items() if name == module or lacking(name)]
    assert said == "missing " + ", ".join(expected)
    assert not (tmp_path / "back").exists()


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


def stand_in_python(tmp_path: Path, partitions: bool, slow: str = "") -> tuple[Path, Path]:
    """An interpreter that passes `gpu_env.py` as a CUDA device would, passes or fails `--driver` (green contexts),
    writes every other command line it gets to calls.log and makes what it is given as --out (a results.json
    folder, or the JSON file named); a command line holding `slow` sleeps first, as a long step does."""
    calls = tmp_path / "calls.log"
    driver = ('echo "green contexts: a stand-in"; exit 0' if partitions
              else 'echo "green contexts unavailable: a stand-in" >&2; exit 1')
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/bash
case "$*" in
  "scripts/gpu_env.py") echo "torch 2.13.0, CUDA 13.0, a stand-in GPU"; exit 0 ;;
  "scripts/gpu_env.py --driver") echo "torch 2.13.0, CUDA 13.0, a stand-in GPU"; {driver} ;;
esac
echo "$*" >>{calls}
[ -z "{slow}" ] || [[ "$*" != *"{slow}"* ]] || sleep 60
out=$(echo "$*" | sed -n 's/.*--out \\([^ ]*\\).*/\\1/p')
case "$out" in
  "") ;;
  *.json) echo '{{}}' >"$out" ;;
  *) mkdir -p "$out" && echo '[]' >"$out/results.json" ;;
esac
echo "done: $*"
""")
    python.chmod(0o755)
    return python, calls


def step_of(call: str) -> str:
    """Which step of gpu_check.sh a recorded command line is (the module, its output)."""
    if " pytest " in f" {call} ":
        return "test_gpu"
    if "gpu_summary.py" in call:
        return "summary"
    return Path(call.split("--out ")[1].split()[0]).stem.replace("fleet_lut_small", "fleet_profile")


def archived(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {name.removeprefix("./") for name in tar.getnames()} - {"."}


def test_gpu_check_runs_every_step_in_order_and_packs_one_archive(tmp_path):
    python, calls = stand_in_python(tmp_path, partitions=True)
    result = gpu_check(tmp_path / "gpu", archive=tmp_path / "back", GPU_PY=str(python))
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = calls.read_text().splitlines()
    assert [step_of(call) for call in recorded] == STEPS
    assert "sm_partitions" not in recorded[0]  # the whole CUDA suite
    for call in (recorded[1], recorded[3]):  # pi05 in bfloat16 at the goal points, with CUDA graphs, then without
        assert "--preset pi05 --device cuda --dtype bfloat16 --goals" in call
    assert "--cuda-graphs" in recorded[1] and "--cuda-graphs" not in recorded[3]
    assert "frame_parts --preset pi05 --dtype bfloat16" in recorded[2]
    assert "--cuda-graphs" in recorded[5]  # the fleet profile's stage graphs
    assert (tmp_path / "gpu" / "device.txt").read_text() == ("torch 2.13.0, CUDA 13.0, a stand-in GPU\n"
                                                             "green contexts: a stand-in\n")
    assert [p.name for p in (tmp_path / "back").iterdir()] == ["gpu_check.tar.gz"]  # one file comes back
    names = archived(tmp_path / "back" / "gpu_check.tar.gz")
    assert {"device.txt", "gpu_check.log", *(f"{s}.log" for s in STEPS), "pi05_graphs/results.json",
            "pi05_eager/results.json", "goals/results.json", "fleet_lut_small.json"} <= names
    assert sum(limits(result.stdout).values()) <= 540  # the steps' limits fit the 9-minute budget


def test_gpu_check_without_sm_partitions_runs_the_rest(tmp_path):
    python, calls = stand_in_python(tmp_path, partitions=False)
    result = gpu_check(tmp_path / "gpu", GPU_PY=str(python))
    assert result.returncode == 0, result.stdout + result.stderr  # no failed step: the preflight is not one
    recorded = calls.read_text().splitlines()
    assert [step_of(call) for call in recorded] == [s for s in STEPS if s != "fleet_profile"]
    assert recorded[0].endswith("-m not sm_partitions test_gpu")
    assert "=== fleet_profile: skipped, no SM partitions here (device.txt)" in result.stdout.splitlines()
    device = (tmp_path / "gpu" / "device.txt").read_text().splitlines()
    assert device[0] == "torch 2.13.0, CUDA 13.0, a stand-in GPU"  # said before the failed check
    assert "green contexts unavailable: a stand-in" in device
    assert device[-1].startswith("preflight failed: no SM partitions here")
    assert "device.txt" in archived(tmp_path / "gpu" / "gpu_check.tar.gz")  # the archive beside the results


def test_the_fleet_bench_step_runs_only_when_named_and_serves_from_the_profile_step(tmp_path):
    python, calls = stand_in_python(tmp_path, partitions=True)
    result = gpu_check(tmp_path / "gpu", "fleet_profile", "fleet_bench", GPU_PY=str(python))
    assert result.returncode == 0, result.stdout + result.stderr
    profile, bench = calls.read_text().splitlines()
    assert step_of(bench) == "fleet_bench" and limits(result.stdout)["fleet_bench"] == 120
    assert "-m oxygen_ros.commands.fleet_bench --models a=small:0,b=small:1 --device cuda" in bench
    assert "--require-sm-partitions --cuda-graphs" in bench and "--designs" not in bench  # monolithic and robion
    assert f"--profile {tmp_path / 'gpu' / 'fleet_lut_small.json'}" in bench and "--all-counts" in bench
    for where in ("alone", "none"):
        (tmp_path / where).mkdir()
    python, calls = stand_in_python(tmp_path / "alone", partitions=True)
    gpu_check(tmp_path / "alone" / "gpu", "fleet_bench", GPU_PY=str(python))
    assert "--profile" not in calls.read_text()  # no table left by fleet_profile: it profiles itself
    python, calls = stand_in_python(tmp_path / "none", partitions=False)
    result = gpu_check(tmp_path / "none" / "gpu", "fleet_bench", GPU_PY=str(python))
    assert "=== fleet_bench: skipped, no SM partitions here (device.txt)" in result.stdout.splitlines()
    assert not calls.exists()


def limits(stdout: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^=== (\w+) \(limit (\d+) s\)$", stdout, re.MULTILINE)}


def test_a_step_gets_what_is_left_of_the_budget_and_none_under_30_s(tmp_path):
    python, calls = stand_in_python(tmp_path, partitions=True)
    given = limits(gpu_check(tmp_path / "a", "test_gpu", "pi05_graphs", GPU_PY=str(python),
                             GPU_CHECK_BUDGET_S="100").stdout)
    assert given["test_gpu"] == 90 and 90 <= given["pi05_graphs"] <= 100  # its 110, cut to what is left
    # 20 s: too little for a step of 30 s or more, the summary's whole 15 s
    result = gpu_check(tmp_path / "b", GPU_PY=str(python), GPU_CHECK_BUDGET_S="20")
    assert limits(result.stdout) == {"summary": 15}
    for name in STEPS[:-1]:
        assert re.search(f"^=== {name}: skipped, [0-9]+ s of the 20 s budget left", result.stdout, re.MULTILINE)
    assert [step_of(call) for call in calls.read_text().splitlines()] == ["test_gpu", "pi05_graphs", "summary"]


@pytest.mark.parametrize("cut", STEPS)
def test_a_run_killed_in_any_step_leaves_the_finished_steps_in_the_archive(tmp_path, cut):
    slow = {"test_gpu": " test_gpu", "pi05_graphs": "pi05_graphs", "frame_parts": "frame_parts",
            "pi05_eager": "pi05_eager", "goals": "/goals", "fleet_profile": "fleet_lut", "summary": "gpu_summary"}[cut]
    python, _ = stand_in_python(tmp_path, partitions=True, slow=slow)
    run = subprocess.Popen(["bash", "scripts/gpu_check.sh", str(tmp_path / "gpu")], cwd=REPO, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                           env=os.environ | {"GPU_PY": str(python)})
    log = tmp_path / "gpu" / "gpu_check.log"
    deadline = time.monotonic() + 100
    while not (log.exists() and f"=== {cut} (limit" in log.read_text()):
        assert time.monotonic() < deadline and run.poll() is None, log.read_text() if log.exists() else ""
        time.sleep(0.2)
    time.sleep(1)  # inside the step now
    os.killpg(run.pid, signal.SIGKILL)  # no trap, no last pack: what is there was packed before
    run.wait(timeout=30)
    run.stdout.close()
    names = archived(tmp_path / "gpu" / "gpu_check.tar.gz")
    done = STEPS[:STEPS.index(cut)]
    assert {f"{s}.log" for s in done} <= names
    assert not {f"{s}.log" for s in STEPS if s not in done} & names
    assert ("pi05_graphs/results.json" in names) == ("pi05_graphs" in done)


def test_the_summary_puts_the_goal_point_beside_the_published_figures(tmp_path):
    """gpu_summary.py on the folders the benchmark steps leave (one finished, one cut before its first point)."""
    record = {"preset": "pi05", "dtype": "bfloat16", "cuda_graphs": True, "sweep": "goals", "decode_len": 50,
              "action_latency_p50_ms": 14.25, "action_hz": 61.0, "tokens_per_s": 3050.0, "energy_j_per_frame": 4.5}
    (tmp_path / "pi05_graphs").mkdir()
    (tmp_path / "pi05_graphs" / "results.json").write_text(json.dumps(
        [record | {"setting": "action_only", "tokens_per_s": 0.0},
         record | {"setting": "continuous_batching", "energy_j_per_frame": None},
         record | {"setting": "continuous_batching", "sweep": "goals_timer"}]))
    (tmp_path / "pi05_eager").mkdir()
    result = subprocess.run([sys.executable, "scripts/gpu_summary.py", str(tmp_path)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "summary.md").read_text().splitlines()
    assert [line for line in lines if line.startswith("| pi05 ")] == [
        "| pi05 | bfloat16 | on | action_only | 14.2 | 61.0 | 0.0 | 4.500 |",
        "| pi05 | bfloat16 | on | continuous_batching | 14.2 | 61.0 | 3050.0 | - |"]
    assert "- OxyGen (paper): 70.5 Hz actions with 212.9 tokens/s of text, pi0.5 on an RTX 4090" in lines
    empty = subprocess.run([sys.executable, "scripts/gpu_summary.py", str(tmp_path / "pi05_eager")], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 0 and "no results.json under this folder" in empty.stdout
