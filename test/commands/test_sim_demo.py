"""`oxygen-ros sim-demo` end to end, with the test's chunk responder standing in for the policy node."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oxygen_ros.commands.cli import SUBCOMMANDS
from oxygen_ros.commands.sim_demo import LABEL_LEFT, LABEL_TOP, main, policy_command
from oxygen_ros.data.aloha import read_aloha

from ros_test_utils import listen_while_running

RESPONDER = str(Path(__file__).resolve().parents[1] / "sim_chunk_responder.py")


@pytest.fixture
def demo_env(monkeypatch, ros_domain_id):
    monkeypatch.setenv("ROS_DOMAIN_ID", str(ros_domain_id))
    monkeypatch.setenv("MUJOCO_GL", "egl")


def test_sim_demo_runs_the_closed_loop_and_writes_its_outputs(tmp_path, demo_env, ros_env, ros_context):
    """With --user-domain the run is on the shell's domain: a node there hears the sim's /clock and cameras."""
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Image as ImageMsg

    out = tmp_path / "demo"
    command = [sys.executable, "-m", "oxygen_ros.commands.cli", "sim-demo", "--seconds", "4", "--cameras", "top",
               "left_wrist", "--size", "64", "96", "--out", str(out), "--policy", RESPONDER, "--policy-param",
               "delay_steps:=3", "--timeout", "60", "--user-domain"]
    env = dict(ros_env, MUJOCO_GL="egl")
    printed, heard = listen_while_running(ros_context, command, env, {"/clock": Clock,
                                                                      "camera/top/image_raw": ImageMsg}, 120)
    assert printed.returncode == 0, printed.stdout[-2000:] + printed.stderr[-2000:]
    assert f"on this shell's DDS domain {ros_env['ROS_DOMAIN_ID']} (--user-domain)" in printed.stdout
    assert heard["/clock"] > 0 and heard["camera/top/image_raw"] > 0
    assert "control rate:" in printed.stdout and "switch discontinuity (rtc)" in printed.stdout
    summary = json.loads((out / "summary.json").read_text())
    # Injected delay 3: no chunk counts as earlier. The sim paces to the wall clock, so how many steps later an
    # answer lands depends on the machine, not on the sim: on a loaded one every answer missed its tick by a step
    # (min = median = 4); the count is exact in test_chunk_executor.
    latency = summary["chunk_latency_steps"]
    assert summary["step"] == 200 and latency["count"] > 0 and latency["min"] >= 3, latency
    sheet = np.asarray(Image.open(out / "contact_sheet.png"))
    assert sheet.shape == (LABEL_TOP + 6 * 64 + 5 * 4, LABEL_LEFT + 2 * 96 + 4, 3)
    # camera names above each column and the time left of each row: dark text on the white margins
    assert (sheet[:LABEL_TOP, LABEL_LEFT: LABEL_LEFT + 96] < 100).any()
    assert (sheet[:LABEL_TOP, LABEL_LEFT + 100:] < 100).any()
    for row in range(6):
        top = LABEL_TOP + row * 68
        assert (sheet[top: top + 64, :LABEL_LEFT] < 100).any()
    assert (out / "sim_demo.mp4").stat().st_size > 1000
    assert (out / "episodes" / "episode_0.hdf5").exists()
    assert "sim-demo" in SUBCOMMANDS


def test_sim_demo_reports_a_policy_that_fails_to_start(tmp_path, capsys, demo_env):
    code = main(["--seconds", "1", "--cameras", "top", "--size", "48", "64", "--out", str(tmp_path),
                 "--policy", "oxygen_ros.no_such_policy_node", "--timeout", "60"])
    assert code == 1 and "policy exited with status" in capsys.readouterr().err


def test_policy_command_passes_the_vla_node_overrides(tmp_path):
    import yaml

    from oxygen_ros.commands.sim_demo import build_parser

    params = tmp_path / "aloha.yaml"
    params.write_text("{}\n")
    args = build_parser().parse_args(["--cameras", "top", "right_wrist", "--params-file", str(params),
                                      "--policy-param", "control.horizon:=4"])
    command = policy_command(args, tmp_path)
    assert command[1:3] == ["-m", "oxygen_ros.nodes.vla_node"]
    files = [command[i + 1] for i, word in enumerate(command) if word == "--params-file"]
    assert files == [str(params), str(tmp_path / "policy_overrides.yaml")]
    overrides = yaml.safe_load((tmp_path / "policy_overrides.yaml").read_text())["/**"]["ros__parameters"]
    assert overrides["model"]["preset"] == "tiny" and overrides["use_sim_time"] is True
    assert overrides["cameras"] == {"topics": ["camera/top/image_raw", "camera/right_wrist/image_raw"],
                                    "keys": ["base_0_rgb", "right_wrist_0_rgb"], "compressed": [False, False]}
    assert overrides["control"] == {"rate_hz": 10.0, "horizon": 4}


def test_sim_demo_closes_the_loop_with_the_real_vla_node(tmp_path, capsys, demo_env):
    """The default policy: the VLA node (tiny preset, random weights) acting on the sim's cameras on sim time."""
    out = tmp_path / "demo"
    code = main(["--seconds", "4", "--size", "64", "96", "--out", str(out), "--timeout", "120"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "sim-demo: on an isolated DDS domain, ROS_DOMAIN_ID=" in printed.out
    summary = json.loads((out / "summary.json").read_text())
    # Random weights flail: gym-aloha may score the episode a success and end it early, or the physics may
    # diverge under the commands and end it early (counted, the sim resets); either way one episode ran.
    assert summary["episode"] == 1 and len(summary["episodes_written"]) == 1
    assert summary["step"] == 200 or summary["successes"] == 1 or summary["diverged_episodes"] == 1
    assert f"{summary['diverged_episodes']} ended by diverging physics" in printed.out
    assert summary["chunks_accepted"] >= summary["step"] // 5 // 2  # 10 Hz chunks on 50 Hz steps, half at least  # the node acts at 10 Hz of sim time once it is up
    assert summary["chunks_malformed"] == 0
    # the policy acts in the aloha embodiment, as the demo's checkpoint was trained (grippers in the sim's units)
    assert ", embodiment aloha," in (out / "policy.log").read_text()


def test_sim_demo_scripted_policy_lifts_the_cube(tmp_path, capsys, demo_env):
    """The scripted (not learned) plan drives the closed loop over DDS to gym-aloha's lift stage, and the summary
    and the recorded episode keep the staged reward and its maximum."""
    out = tmp_path / "demo"
    code = main(["--policy", "scripted", "--seconds", "5", "--size", "48", "64", "--out", str(out), "--no-video",
                 "--timeout", "150"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task_max_reward"] == 4 and summary["reward_stages"][2] == "cube lifted"
    assert summary["episode_max_rewards"][0] >= 2, summary
    assert "episode 0 reward: best stage" in printed.out
    episode = read_aloha(summary["episodes_written"][0])
    assert episode.max_reward == 4 and episode.reward.shape == (episode.length,)
    assert episode.reward.max() == summary["episode_max_rewards"][0]


def test_scripted_policy_needs_transfer_cube(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--policy", "scripted", "--task", "insertion", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "transfer_cube only" in capsys.readouterr().err
