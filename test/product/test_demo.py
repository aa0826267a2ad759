"""The main job, end to end at reduced length: generated ALOHA episode -> bag -> tiny policy trained on it (short)
-> replay + vla_node loading that checkpoint + recorder -> report. Real processes, real DDS, real bags, a real
checkpoint folder on disk; only the episode and the training are shorter than the README's default."""

import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np

from oxygen_ros.command_line import OUTPUT_MARKER, claim_output_dir
from oxygen_ros.commands.cli import main as cli_main
from oxygen_ros.commands.demo import TRAINING, main, trained_checkpoint
from oxygen_ros.data.captions import frame_captions
from oxygen_ros.data.episode import ALOHA_JOINT_NAMES
from oxygen_ros.data.report import RecordedActions, action_error, actions_from_episode_bag, load_recording

from ros_test_utils import listen_while_running

TRAINING_STEPS = 400
TOLERANCE = 0.12  # mean absolute chunk error, robot units (rad; gripper normalised)


def shifted(recorded: RecordedActions, frames: int) -> RecordedActions:
    """The recorded actions as if the chunk from frame t predicted the actions from frame t + `frames` on."""
    count = len(recorded.stamps_ns) - abs(frames)
    first_stamp, first_action = max(0, -frames), max(0, frames)
    return RecordedActions(recorded.stamps_ns[first_stamp : first_stamp + count],
                           recorded.actions[first_action : first_action + count], recorded.joint_names)


def test_demo_trains_a_policy_whose_chunks_and_narration_follow_the_episode(tmp_path, capsys, ros_env, monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", ros_env["ROS_DOMAIN_ID"])
    monkeypatch.setattr("oxygen_ros.commands.demo.TRAINING", dataclasses.replace(TRAINING, steps=TRAINING_STEPS))
    out, cache = tmp_path / "demo", tmp_path / "cache"
    assert main(["--out", str(out), "--seconds", "5", "--cache", str(cache)]) == 0
    printed = capsys.readouterr().out
    assert "oxygen-ros demo summary" in printed and "action latency     p50" in printed
    assert "action error" in printed and "equal their frame's caption" in printed

    summary = json.loads((out / "summary.json").read_text())
    report, status, training = summary["report"], summary["engine_status"], summary["training"]
    # 10 Hz for ~5 s of replay; fewer only on a machine too busy to keep the rate, which the node must then have
    # counted as ticks past their deadline or frames skipped (9 chunks seen at load average 13 on two cores)
    missed = status["deadline_misses"] + status["dropped_frames"]
    assert report["action_chunks"] >= 30 or (report["action_chunks"] >= 3 and missed > 0), (report, status)
    assert report["action_latency"]["available"] and report["action_latency"]["p50_ms"] < 1000
    # its last report (it came before the end): acting, or on a loaded machine skipping a frame that arrived too late,
    # which it must then have counted
    assert status["actions_published"] > 0, status
    assert status["state"] == "running" or (status["state"] == "stale_frame" and status["dropped_frames"] > 0), status
    assert status["kv_slots_total"] > 0 and status["language_tokens_per_s"] > 0
    assert Path(summary["checkpoint"]).parent == cache and training["train_config"]["steps"] == TRAINING_STEPS
    # trained and served in the aloha embodiment (deltas from each frame's state): the transforms run end to end
    assert training["train_config"]["embodiment"] == "aloha"
    assert ", embodiment aloha," in (out / "vla_node.log").read_text()

    # The chunks the node published (the model's deltas made absolute by the aloha embodiment) follow the recorded
    # actions; the same model untrained (its deltas around the frame's state) does not come close.
    error = report["action_error"]
    assert error["available"] and error["mean_abs"] < min(TOLERANCE, training["before"]["action_error"] / 3), (
        error["mean_abs"], training["before"]["action_error"])
    assert list(error["per_joint"]) == list(ALOHA_JOINT_NAMES)

    # Joint order and time alignment: matching by the published joint names and pairing the chunk from frame t
    # with the actions from t on fits better than swapping the arms or pairing it with actions half a second away.
    recording = load_recording(out / "run_bag")
    recorded = actions_from_episode_bag(out / "episode_bag")
    aligned = action_error(recording, recorded)["mean_abs"]
    swapped = RecordedActions(recorded.stamps_ns, recorded.actions,
                              recorded.joint_names[7:] + recorded.joint_names[:7])
    assert action_error(recording, swapped)["mean_abs"] > 2 * aligned
    by_shift = {k: action_error(recording, shifted(recorded, k))["mean_abs"] for k in (-25, -10, 0, 10, 25)}
    assert min(by_shift, key=by_shift.get) == 0, by_shift
    stamps = set(recorded.stamps_ns.tolist())
    assert all(chunk["stamp_ns"] in stamps for chunk in recording.chunks)  # each chunk is stamped with its frame
    assert all(np.isclose(chunk["times_s"][0], 0.02) for chunk in recording.chunks)  # point 0: one step later

    # Narration decodes to captions of the episode, often the very caption of the frame it was conditioned on
    # (phases last a fraction of a second in this short episode; the README's 20 s run scores higher).
    captions = report["caption_accuracy"]
    assert captions["available"] and captions["scored"] >= 5 and captions["accuracy"] >= 0.4, captions
    finals = [n for n in report["narration"] if n["final"]]
    episode_captions = set(frame_captions(recorded.actions))
    assert sum(n["text"] in episode_captions for n in finals) >= 0.7 * len(finals), [n["text"] for n in finals]

    for name in ("episode_0.hdf5", "report/report.md", "report/report.json"):
        assert (out / name).is_file()
    assert (out / "report" / "actions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Action error" in (out / "report" / "report.md").read_text()

    # The same episode and settings again: the cached policy, no second training.
    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr("oxygen_ros.commands.demo.train", no_training)
    assert trained_checkpoint(out / "episode_0.hdf5", cache) == Path(summary["checkpoint"])


def test_demo_reports_a_failure_clearly(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("oxygen_ros.commands.demo.find_config", lambda name: None)
    assert main(["--out", str(tmp_path / "demo"), "--seconds", "1", "--untrained"]) == 1
    assert "demo failed: config/aloha.yaml not found" in capsys.readouterr().err


def demo_exit_status(args: list[str]) -> int:
    """`oxygen-ros demo ARGS`'s exit status from the command's own main, in this process (an argparse error exits;
    any other exception would fail the test, as it would print a traceback in the command's process)."""
    try:
        return cli_main(["demo", *args])
    except SystemExit as exit:
        return exit.code


def test_demo_flags_reach_the_node_on_an_isolated_domain(tmp_path, ros_env, ros_context, ros_domain_id):
    """--preset and --rate-hz reach the node; the demo runs on its own domain: a node on the shell's domain hears
    none of its synthetic sensors or chunks."""
    from sensor_msgs.msg import Image, JointState
    from trajectory_msgs.msg import JointTrajectory

    out = tmp_path / "demo"
    command = [sys.executable, "-m", "oxygen_ros.commands.cli", "demo", "--out", str(out), "--seconds", "3", "--preset",
               "small", "--rate-hz", "5"]
    topics = {"action_chunk": JointTrajectory, "joint_states": JointState, "camera/cam_high/image_raw": Image}
    result, heard = listen_while_running(ros_context, command, ros_env, topics, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    node_log = (out / "vla_node.log").read_text()
    assert re.search(r"preset small in \w+ \(.*\) on cpu", node_log) and ", 5 Hz," in node_log, node_log[:2000]
    # 5 Hz, not the file's 10 Hz: told by the chunks' own stamps (each its frame's, on the bag's clock), not by when
    # the recorder took them in (a starved recorder takes a backlog in a burst, which looks faster than the node);
    # a loaded node may skip a tick (spacings of 0.4 s), never tick early
    stamps = sorted(chunk["stamp_ns"] for chunk in load_recording(out / "run_bag").chunks
                    if chunk["topic"] == "/action_chunk")
    assert len(stamps) >= 3, stamps
    assert np.median(np.diff(stamps)) / 1e9 > 0.15, np.diff(stamps)
    domain = re.search(r"isolated DDS domain, ROS_DOMAIN_ID=(\d+), localhost-only discovery", result.stdout)
    assert domain and int(domain.group(1)) != ros_domain_id, result.stdout
    assert heard == dict.fromkeys(topics, 0)


def test_demo_refuses_a_bad_preset_in_one_line(tmp_path, capfd):
    out = tmp_path / "demo"
    assert demo_exit_status(["--out", str(out), "--preset", "huge"]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'huge'" in err and not out.exists()


def test_demo_refuses_a_non_empty_folder_it_did_not_make(tmp_path, capfd):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    assert demo_exit_status(["--out", str(out), "--seconds", "1"]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "not empty and was not made by oxygen-ros" in err
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]


def test_output_folder_made_by_a_run_is_replaced_by_the_next(tmp_path):
    out = claim_output_dir(tmp_path / "out")
    (out / "old_result.json").write_text("{}")
    assert claim_output_dir(out) == out
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_output_dir(empty) == empty
