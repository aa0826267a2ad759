"""The main job, end to end at reduced length: generated ALOHA episode -> bag -> replay + vla_node + recorder ->
report. Real processes, real DDS, real bags; only the episode is shorter than the README's default."""

import json

from oxygen_ros.demo import main


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
