"""The run report recovers known latencies, rates and narration from a recorded bag and plots the chunks."""

import json

import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer

from oxygen_ros.data import synthetic_episode, write_aloha, write_episode_bag
from oxygen_ros.data.captions import frame_captions, object_captions
from oxygen_ros.data.msgtypes import bag_typestore
from oxygen_ros.data.report import RecordedActions, Recording, action_error, caption_accuracy
from oxygen_ros.data.report import main as report_main

BAG_T0 = 1_700_000_000 * 10**9  # the episode's stamps (convert's default base time)
WALL_T0 = 1_800_000_000 * 10**9  # when the replay happened (another clock)


def write_recording(path, with_clock=True, latency_offset_ms=0, narration_texts=("reaching", "reaching for the cube")):
    """What record_node would capture: /clock, 10 Hz action chunks with latency 30 + k ms, two narrations."""
    store = bag_typestore()
    T = store.types
    latencies_ms = []

    def time(ns):
        return T["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9)

    def duration(s):
        ns = int(round(s * 1e9))
        return T["builtin_interfaces/msg/Duration"](sec=ns // 10**9, nanosec=ns % 10**9)

    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        clock = writer.add_connection("/clock", "rosgraph_msgs/msg/Clock", typestore=store)
        chunks = writer.add_connection("/vla/action_chunk", "trajectory_msgs/msg/JointTrajectory", typestore=store)
        narration = writer.add_connection("/vla/narration", "oxygen_ros/msg/Narration", typestore=store)
        messages = []
        if with_clock:
            for k in range(101):
                bag_ns = BAG_T0 + k * 10_000_000
                msg = T["rosgraph_msgs/msg/Clock"](clock=time(bag_ns))
                messages.append((WALL_T0 + k * 10_000_000, clock, msg, "rosgraph_msgs/msg/Clock"))
        names = [f"j{i}" for i in range(14)]
        for k in range(9):
            stamp = BAG_T0 + k * 100_000_000
            latency = 30 + k + latency_offset_ms
            latencies_ms.append(latency)
            points = [T["trajectory_msgs/msg/JointTrajectoryPoint"](
                positions=np.full(14, 0.1 * k + 0.02 * p), velocities=np.zeros(0), accelerations=np.zeros(0),
                effort=np.zeros(0), time_from_start=duration(0.02 * p)) for p in range(10)]
            header = T["std_msgs/msg/Header"](stamp=time(stamp), frame_id="cam_high")
            msg = T["trajectory_msgs/msg/JointTrajectory"](header=header, joint_names=names, points=points)
            messages.append((WALL_T0 + (stamp - BAG_T0) + latency * 1_000_000, chunks, msg,
                             "trajectory_msgs/msg/JointTrajectory"))
        for k, (rid, text, final) in enumerate([(1, narration_texts[0], False), (1, narration_texts[1], True)]):
            header = T["std_msgs/msg/Header"](stamp=time(BAG_T0), frame_id="cam_high")
            msg = T["oxygen_ros/msg/Narration"](header=header, request_id=rid, text=text, num_tokens=2 + 3 * k,
                                                final=final)
            messages.append((WALL_T0 + 200_000_000 + k * 100_000_000, narration, msg, "oxygen_ros/msg/Narration"))
        for log_ns, conn, msg, typename in sorted(messages, key=lambda m: m[0]):
            writer.write(conn, log_ns, store.serialize_cdr(msg, typename))
    return latencies_ms


@pytest.fixture(scope="module")
def episode():
    return synthetic_episode(seconds=1.0, fps=50, cameras=("cam_high",), height=32, width=32)


def test_report_with_episode_bag(tmp_path, episode):
    latencies = write_recording(tmp_path / "rec")
    write_episode_bag(episode, tmp_path / "episode")
    assert report_main([str(tmp_path / "rec"), "--episode-bag", str(tmp_path / "episode"),
                        "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out/report.json").read_text())
    lat = report["action_latency"]
    assert lat["available"] and lat["source"] == "recorded /clock" and lat["count"] == 9
    assert lat["p50_ms"] == pytest.approx(np.median(latencies), abs=0.01)
    assert lat["max_ms"] == pytest.approx(38, abs=0.01)
    assert report["topics"]["/vla/action_chunk"]["rate_hz"] == pytest.approx(10, rel=0.02)
    assert report["topics"]["/clock"]["count"] == 101
    [request] = report["narration"]
    assert request["text"] == "reaching for the cube" and request["final"] and request["messages"] == 2
    png = (tmp_path / "out/actions.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "p50 34.0 ms" in (tmp_path / "out/report.md").read_text()


def test_report_with_aloha_source_and_no_clock(tmp_path, episode):
    write_recording(tmp_path / "rec", with_clock=False)
    write_aloha(tmp_path / "episode_0.hdf5", episode)
    assert report_main([str(tmp_path / "rec"), "--episode", str(tmp_path / "episode_0.hdf5"),
                        "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert not report["action_latency"]["available"]
    assert "different clocks" in report["action_latency"]["reason"]
    assert (tmp_path / "out/actions.png").exists()


def test_report_names_a_bad_episode_source(tmp_path, capsys):
    write_recording(tmp_path / "rec")
    assert report_main([str(tmp_path / "rec"), "--episode", str(tmp_path / "missing.hdf5"),
                        "--out", str(tmp_path / "out")]) == 1
    assert "missing.hdf5: no such file" in capsys.readouterr().err


def test_actions_plot_explains_itself(tmp_path, episode, monkeypatch):
    """Axis labels with units, a legend for recorded vs chunks, a colour bar, and the random-weights mark."""
    from matplotlib.figure import Figure

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *args, **kwargs: figures.append(fig))
    write_recording(tmp_path / "rec")
    write_episode_bag(episode, tmp_path / "episode")
    assert report_main([str(tmp_path / "rec"), "--episode-bag", str(tmp_path / "episode"), "--out",
                        str(tmp_path / "out"), "--random-weights"]) == 0
    [fig] = figures
    assert "[rad" in fig._supylabel.get_text() and "[s]" in fig._supxlabel.get_text()
    [legend] = fig.legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == ["recorded actions (episode)", "action chunks (9)"]
    colour_bars = [ax for ax in fig.axes if ax.get_ylabel() == "chunk's camera frame time [s]"]
    assert len(colour_bars) == 1
    assert "RANDOM WEIGHTS" in fig._suptitle.get_text()
    assert "random weights" in (tmp_path / "out/report.md").read_text()


def test_narration_text_is_sanitized_in_the_markdown(tmp_path):
    write_recording(tmp_path / "rec", narration_texts=("reach", "red\x1b[31m cube\nnext\u202eline\x07"))
    assert report_main([str(tmp_path / "rec"), "--out", str(tmp_path / "out")]) == 0
    markdown = (tmp_path / "out/report.md").read_text()
    assert "red\\u001b[31m cube\\u000anext\\u202eline\\u0007" in markdown
    assert not any(c in markdown for c in "\x1b\x07\u202e")
    assert json.loads((tmp_path / "out/report.json").read_text())["narration"][0]["text"].endswith("\x07")


def test_impossible_negative_latencies_are_flagged(tmp_path, capsys):
    # latencies -5 .. 3 ms; the first chunk, received before the first /clock, reads as 0
    write_recording(tmp_path / "rec", latency_offset_ms=-35)
    assert report_main([str(tmp_path / "rec"), "--out", str(tmp_path / "out")]) == 0
    lat = json.loads((tmp_path / "out/report.json").read_text())["action_latency"]
    assert lat["negative_count"] == 4 and "impossible" in lat["warning"]
    assert "**Warning:** 4 of 9 chunks" in (tmp_path / "out/report.md").read_text()
    assert "warning: 4 of 9 chunks" in capsys.readouterr().err
    write_recording(tmp_path / "ok")
    assert report_main([str(tmp_path / "ok"), "--out", str(tmp_path / "out_ok")]) == 0
    lat = json.loads((tmp_path / "out_ok/report.json").read_text())["action_latency"]
    assert lat["negative_count"] == 0 and "warning" not in lat


def test_action_error_pairs_chunk_point_i_with_the_action_of_frame_t_plus_i():
    """A chunk from frame t whose point i (published at (i + 1) steps) is the recorded action of frame t + i scores
    zero error; the same chunk one frame late, or with two joints swapped, does not."""
    ep = synthetic_episode(seconds=1.0, fps=50, motion="handover")
    stamps = BAG_T0 + np.arange(ep.length) * 20_000_000
    recorded = RecordedActions(stamps, ep.actions.astype(np.float64), list(ep.joint_names))

    def recording(offset: int, names: list[str]) -> Recording:
        chunks = [{"stamp_ns": int(stamps[t]), "joint_names": names, "times_s": 0.02 * np.arange(1, 9),
                   "positions": ep.actions[t + offset : t + offset + 8].astype(np.float64)}
                  for t in range(0, ep.length - 9, 5)]
        return Recording(chunks=chunks)

    exact = action_error(recording(0, list(ep.joint_names)), recorded)
    assert exact["available"] and exact["mean_abs"] < 1e-9 and list(exact["per_joint"]) == list(ep.joint_names)
    assert action_error(recording(1, list(ep.joint_names)), recorded)["mean_abs"] > 1e-4
    swapped = list(ep.joint_names)
    swapped[0], swapped[7] = swapped[7], swapped[0]
    assert action_error(recording(0, swapped), recorded)["per_joint"]["left_waist"] > 1e-3


def test_object_captions_say_where_the_object_is_in_whole_centimetres():
    captions = ["right arm moves", "the arms hold still"]
    state = np.array([[0.1097, 0.5430, 0.05, 1, 0, 0, 0], [-0.0134, 0.4571, 0.2521, 1, 0, 0, 0]])
    assert object_captions(captions, state) == ["right arm moves, object at x 11 y 54 z 5",
                                                "the arms hold still, object at x -1 y 46 z 25"]
    with pytest.raises(ValueError, match="one environment state"):
        object_captions(captions, state[:1])


def test_caption_accuracy_scores_finished_narration_against_its_frame():
    ep = synthetic_episode(seconds=4.0, fps=50, motion="handover")
    stamps = BAG_T0 + np.arange(ep.length) * 20_000_000
    recorded = RecordedActions(stamps, ep.actions.astype(np.float64), list(ep.joint_names))
    captions = frame_captions(ep.actions)
    narration = [{"frame_stamp_ns": int(stamps[t]), "text": captions[t], "final": True} for t in (0, 60, 120)]
    narration += [{"frame_stamp_ns": int(stamps[30]), "text": "something else", "final": True},
                  {"frame_stamp_ns": int(stamps[40]), "text": captions[40][:3], "final": False}]
    scored = caption_accuracy(narration, recorded)
    assert (scored["matches"], scored["scored"]) == (3, 4) and narration[3]["expected"] == captions[30]
