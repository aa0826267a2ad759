"""The main job, end to end at reduced length: generated ALOHA episode -> bag -> replay + vla_node + recorder ->
report. Real processes, real DDS, real bags; only the episode is shorter than the README's default."""

import json
import re
import subprocess
import sys

from oxygen_ros.command_line import OUTPUT_MARKER, claim_output_dir
from oxygen_ros.demo import main

from ros_test_utils import listen_while_running


def test_demo_runs_end_to_end(tmp_path, capsys, ros_env, monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", ros_env["ROS_DOMAIN_ID"])
    out = tmp_path / "demo"
    assert main(["--out", str(out), "--seconds", "5"]) == 0
    printed = capsys.readouterr().out
    assert "oxygen-ros demo summary" in printed and "action latency     p50" in printed

    summary = json.loads((out / "summary.json").read_text())
    report, status = summary["report"], summary["engine_status"]
    assert report["action_chunks"] >= 30  # 10 Hz for ~5 s of replay
    assert report["action_latency"]["available"] and report["action_latency"]["p50_ms"] < 1000
    assert any(entry["final"] for entry in report["narration"])
    assert status["state"] == "running" and status["actions_published"] > 0  # (its last report came earlier)
    assert status["kv_slots_total"] > 0 and status["language_tokens_per_s"] > 0
    for name in ("episode_0.hdf5", "report/report.md", "report/report.json"):
        assert (out / name).is_file()
    assert (out / "report" / "actions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_reports_a_failure_clearly(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("oxygen_ros.demo.find_config", lambda name: None)
    assert main(["--out", str(tmp_path / "demo"), "--seconds", "1"]) == 1
    assert "demo failed: config/aloha.yaml not found" in capsys.readouterr().err


def run_demo(args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oxygen_ros.cli", "demo", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_demo_flags_reach_the_node_on_an_isolated_domain(tmp_path, ros_env, ros_context, ros_domain_id):
    """--preset and --rate-hz reach the node; the demo runs on its own domain: a node on the shell's domain hears
    none of its synthetic sensors or chunks."""
    from sensor_msgs.msg import Image, JointState
    from trajectory_msgs.msg import JointTrajectory

    out = tmp_path / "demo"
    command = [sys.executable, "-m", "oxygen_ros.cli", "demo", "--out", str(out), "--seconds", "3", "--preset",
               "small", "--rate-hz", "5"]
    topics = {"action_chunk": JointTrajectory, "joint_states": JointState, "camera/cam_high/image_raw": Image}
    result, heard = listen_while_running(ros_context, command, ros_env, topics, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    node_log = (out / "vla_node.log").read_text()
    assert "preset small on cpu" in node_log and ", 5 Hz," in node_log, node_log[:2000]
    report = json.loads((out / "summary.json").read_text())["report"]
    assert 0 < report["topics"]["/action_chunk"]["rate_hz"] < 7  # 5 Hz, not the file's 10 Hz
    domain = re.search(r"isolated DDS domain, ROS_DOMAIN_ID=(\d+), localhost-only discovery", result.stdout)
    assert domain and int(domain.group(1)) != ros_domain_id, result.stdout
    assert heard == dict.fromkeys(topics, 0)


def test_demo_refuses_a_bad_preset_in_one_line(tmp_path, ros_env):
    out = tmp_path / "demo"
    result = run_demo(["--out", str(out), "--preset", "huge"], ros_env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "invalid choice: 'huge'" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_demo_refuses_a_non_empty_folder_it_did_not_make(tmp_path, ros_env):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    result = run_demo(["--out", str(out), "--seconds", "1"], ros_env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not empty and was not made by oxygen-ros" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]


def test_output_folder_made_by_a_run_is_replaced_by_the_next(tmp_path):
    out = claim_output_dir(tmp_path / "out")
    (out / "old_result.json").write_text("{}")
    assert claim_output_dir(out) == out
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_output_dir(empty) == empty
