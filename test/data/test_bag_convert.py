"""Episodes become rosbag2 bags with the right topics, types, stamps and pixels; bad inputs fail cleanly."""

import shutil

import h5py
import numpy as np
import pytest
import yaml
from rosbags.interfaces import QosDurability, QosReliability
from rosbags.rosbag2 import Reader, StoragePlugin, Writer

from oxygen_ros.data import (
    ALOHA_JOINT_NAMES,
    UnknownMessageTypeError,
    bag_topics,
    iter_raw,
    read_messages,
    synthetic_episode,
    typestore_for,
    write_aloha,
    write_lerobot,
)
from oxygen_ros.data.convert import main as convert
from oxygen_ros.data.episode import DataError
from oxygen_ros.data.jpeg import decode_image

BASE_S = 1_700_000_000.0


@pytest.fixture(scope="module")
def episode():
    return synthetic_episode(seconds=0.5, fps=50, cameras=("cam_high", "cam_right_wrist"), seed=3)


@pytest.fixture(scope="module")
def aloha_dir(tmp_path_factory, episode):
    folder = tmp_path_factory.mktemp("aloha")
    write_aloha(folder / "episode_0.hdf5", episode)
    return folder


def by_topic(bag):
    out = {}
    for raw, msg in read_messages(bag):
        out.setdefault(raw.topic, []).append((raw.log_time_ns, msg))
    return out


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_aloha_to_bag_carries_images_joints_stamps_and_task(tmp_path, aloha_dir, episode, storage):
    bag = tmp_path / "bag"
    assert convert(["aloha", str(aloha_dir), str(bag), "--storage", storage, "--task", "fold the towel"]) == 0
    assert (bag / "metadata.yaml").exists() and list(bag.glob(f"*.{'db3' if storage == 'sqlite3' else 'mcap'}"))
    topics = {t.name: (t.msgtype, t.count) for t in bag_topics(bag)}
    assert topics == {
        "camera/cam_high/image_raw": ("sensor_msgs/msg/Image", 25),
        "camera/cam_right_wrist/image_raw": ("sensor_msgs/msg/Image", 25),
        "joint_states": ("sensor_msgs/msg/JointState", 25),
        "episode/action": ("sensor_msgs/msg/JointState", 25),
        "instruction": ("std_msgs/msg/String", 1),
    }
    msgs = by_topic(bag)
    expected_ns = [int(BASE_S * 1e9) + i * 20_000_000 for i in range(25)]
    for cam in episode.cameras:
        images = msgs[f"camera/{cam}/image_raw"]
        assert [t for t, _ in images] == expected_ns
        for i, (_, m) in enumerate(images):
            assert m.encoding == "rgb8" and m.header.frame_id == cam and m.step == 128 * 3
            assert m.header.stamp.sec * 10**9 + m.header.stamp.nanosec == expected_ns[i]
            np.testing.assert_array_equal(m.data.reshape(96, 128, 3), episode.images[cam][i])
    joints = msgs["joint_states"]
    assert list(joints[0][1].name) == list(ALOHA_JOINT_NAMES)
    np.testing.assert_allclose(np.stack([m.position for _, m in joints]), episode.state)
    np.testing.assert_allclose(np.stack([m.velocity for _, m in joints]), episode.velocity)
    np.testing.assert_allclose(np.stack([m.position for _, m in msgs["episode/action"]]), episode.actions)
    assert msgs["instruction"] == [(expected_ns[0], msgs["instruction"][0][1])]
    assert msgs["instruction"][0][1].data == "fold the towel"


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_bag_records_each_topics_offered_qos(tmp_path, aloha_dir, storage):
    """`ros2 bag play` and our replay publish with these; the instruction must stay latched."""
    bag = tmp_path / "bag"
    assert convert(["aloha", str(aloha_dir), str(bag), "--storage", storage, "--task", "fold"]) == 0
    with Reader(bag) as reader:
        offered = {c.topic: c.ext.offered_qos_profiles for c in reader.connections}
    expected = {  # reliability, durability, depth
        "instruction": (QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL, 1),
        "joint_states": (QosReliability.RELIABLE, QosDurability.VOLATILE, 100),
        "episode/action": (QosReliability.RELIABLE, QosDurability.VOLATILE, 100),
        "camera/cam_high/image_raw": (QosReliability.BEST_EFFORT, QosDurability.VOLATILE, 5),
        "camera/cam_right_wrist/image_raw": (QosReliability.BEST_EFFORT, QosDurability.VOLATILE, 5),
    }
    assert {t: [(q.reliability, q.durability, q.depth) for q in qs] for t, qs in offered.items()} == {
        t: [e] for t, e in expected.items()}
    # bag version 9 stores the profiles as a YAML list (older versions used one YAML string)
    metadata = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert metadata["version"] == 9
    by_topic = {t["topic_metadata"]["name"]: t["topic_metadata"] for t in metadata["topics_with_message_count"]}
    [instruction] = by_topic["instruction"]["offered_qos_profiles"]
    assert (instruction["durability"], instruction["reliability"], instruction["history"]) == (
        "transient_local", "reliable", "keep_last")


def test_lerobot_episode_to_compressed_image_bag(tmp_path):
    episodes = [synthetic_episode(seconds=0.4, fps=20, cameras=("top",), seed=s, task=f"task {s}") for s in range(2)]
    write_lerobot(tmp_path / "ds", episodes)
    bag = tmp_path / "bag"
    rc = convert(["lerobot", str(tmp_path / "ds"), str(bag), "--episode", "1", "--compressed-images",
                  "--base-time", "10"])
    assert rc == 0
    msgs = by_topic(bag)
    images = msgs["camera/top/image_raw/compressed"]
    assert [t for t, _ in images] == [10 * 10**9 + i * 50_000_000 for i in range(8)]
    for i, (_, m) in enumerate(images):
        assert m.format == "jpeg"
        assert np.abs(decode_image(m.data.tobytes()).astype(int) - episodes[1].images["top"][i]).mean() < 5
    assert msgs["instruction"][0][1].data == "task 1"


def test_bag_helpers_filter_topics_and_name_missing_ones(tmp_path, aloha_dir):
    bag = tmp_path / "bag"
    assert convert(["aloha", str(aloha_dir / "episode_0.hdf5"), str(bag)]) == 0
    assert "instruction" not in {t.name for t in bag_topics(bag)}  # ALOHA files carry no task
    raws = list(iter_raw(bag, ["joint_states"]))
    assert len(raws) == 25 and all(r.msgtype == "sensor_msgs/msg/JointState" for r in raws)
    assert [r.log_time_ns for r in raws] == sorted(r.log_time_ns for r in raws)
    with pytest.raises(DataError, match="not in bag.*'nope'"):
        list(iter_raw(bag, ["nope"]))


def test_unknown_message_type_is_named_with_its_topic(tmp_path):
    with Writer(tmp_path / "bag", version=9, storage_plugin=StoragePlugin.SQLITE3) as writer:
        conn = writer.add_connection("gizmo", "acme_msgs/msg/Gizmo", msgdef="", rihs01="RIHS01_" + "0" * 64)
        writer.write(conn, 1, b"\x00\x01\x00\x00")
    with pytest.raises(UnknownMessageTypeError, match=r"acme_msgs/msg/Gizmo \(topics \['gizmo'\]\)"):
        typestore_for(tmp_path / "bag")


def _truncated(src, dst):
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 3])


def _missing_action(src, dst):
    shutil.copy(src, dst)
    with h5py.File(dst, "a") as f:
        del f["/action"]


def _short_action(src, dst):
    shutil.copy(src, dst)
    with h5py.File(dst, "a") as f:
        action = f["/action"][()]
        del f["/action"]
        f["/action"] = action[:-2]


@pytest.mark.parametrize(
    ("damage", "message"),
    [(_truncated, "not a readable HDF5 file"), (_missing_action, "missing dataset /action"),
     (_short_action, "mismatched lengths")],
)
def test_bad_aloha_input_fails_with_a_clear_error_and_no_output(tmp_path, aloha_dir, capsys, damage, message):
    src = tmp_path / "episode_0.hdf5"
    damage(aloha_dir / "episode_0.hdf5", src)
    out = tmp_path / "out" / "bag"
    assert convert(["aloha", str(src), str(out)]) == 1
    err = capsys.readouterr().err
    assert message in err and str(src) in err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_episode_out_of_range(tmp_path, aloha_dir, capsys):
    episodes = [synthetic_episode(seconds=0.2, fps=20, cameras=("top",), seed=s) for s in range(2)]
    write_lerobot(tmp_path / "ds", episodes)
    assert convert(["lerobot", str(tmp_path / "ds"), str(tmp_path / "b1"), "--episode", "2"]) == 1
    assert "episode 2 out of range (dataset has 2 episodes)" in capsys.readouterr().err
    assert convert(["aloha", str(aloha_dir), str(tmp_path / "b2"), "--episode", "7"]) == 1
    assert "episode_7.hdf5: no such episode file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_corrupt_mp4_fails_cleanly(tmp_path, capsys):
    ep = synthetic_episode(seconds=0.4, fps=20, cameras=("top",))
    write_lerobot(tmp_path / "ds", [ep])
    video = tmp_path / "ds/videos/observation.images.top/chunk-000/file-000.mp4"
    data = bytearray(video.read_bytes())
    video.write_bytes(bytes(data[:48]) + bytes(len(data) - 48))  # keep the header start, zero the rest
    assert convert(["lerobot", str(tmp_path / "ds"), str(tmp_path / "bag")]) == 1
    err = capsys.readouterr().err
    assert "file-000.mp4" in err and ("cannot decode video" in err or "frames missing" in err)
    assert not (tmp_path / "bag").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_existing_output_is_not_overwritten(tmp_path, aloha_dir, capsys):
    (tmp_path / "bag").mkdir()
    assert convert(["aloha", str(aloha_dir), str(tmp_path / "bag")]) == 1
    assert "already exists" in capsys.readouterr().err


def write_openpi_droid_v2(root, episodes: int = 2, frames: int = 5):
    """A LeRobot v2.1 dataset laid out as openpi's examples/droid/convert_droid_data_to_lerobot.py writes it
    (LeRobot v2.x): keys without the `observation.` prefix, PNG images in the parquet, one file per episode."""
    import io
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(3)
    cameras = ("exterior_image_1_left", "wrist_image_left")
    features = {
        **{c: {"dtype": "image", "shape": [18, 32, 3], "names": ["height", "width", "channel"]} for c in cameras},
        "joint_position": {"dtype": "float32", "shape": [7], "names": ["joint_position"]},
        "gripper_position": {"dtype": "float32", "shape": [1], "names": ["gripper_position"]},
        "actions": {"dtype": "float32", "shape": [8], "names": ["actions"]},
        **{k: {"dtype": "int64", "shape": [1], "names": None} for k in ("frame_index", "episode_index", "index",
                                                                          "task_index")},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    }
    info = {"codebase_version": "v2.1", "robot_type": "panda", "fps": 15, "chunks_size": 1000,
            "total_episodes": episodes, "features": features,
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"}
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info))
    tasks = ["put the marker in the cup", "close the drawer"]
    (root / "meta" / "tasks.jsonl").write_text("".join(json.dumps({"task_index": i, "task": t}) + "\n"
                                                       for i, t in enumerate(tasks)))
    (root / "meta" / "episodes.jsonl").write_text("".join(
        json.dumps({"episode_index": e, "tasks": [tasks[e % 2]], "length": frames}) + "\n" for e in range(episodes)))
    written = []
    for e in range(episodes):
        images = {c: rng.integers(0, 256, (frames, 18, 32, 3), dtype=np.uint8) for c in cameras}
        joints, gripper = rng.normal(size=(frames, 7)).astype(np.float32), rng.uniform(size=(frames, 1)).astype(
            np.float32)
        actions = rng.uniform(-1, 1, (frames, 8)).astype(np.float32)

        def png(pixels):
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="PNG")
            return {"bytes": buffer.getvalue(), "path": None}

        table = pa.table({
            **{c: [png(images[c][i]) for i in range(frames)] for c in cameras},
            "joint_position": joints.tolist(), "gripper_position": gripper.tolist(), "actions": actions.tolist(),
            "timestamp": pa.array(np.arange(frames) / 15, pa.float32()), "frame_index": list(range(frames)),
            "episode_index": [e] * frames, "index": list(range(e * frames, (e + 1) * frames)),
            "task_index": [e % 2] * frames})
        path = root / "data" / "chunk-000" / f"episode_{e:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        written.append((images, np.concatenate([joints, gripper], axis=1), actions, tasks[e % 2]))
    return written


def test_openpis_droid_data_in_lerobot_v2_converts_to_a_bag(tmp_path):
    written = write_openpi_droid_v2(tmp_path / "droid")
    bag = tmp_path / "bag"
    assert convert(["lerobot", str(tmp_path / "droid"), str(bag), "--episode", "1"]) == 0
    images, state, actions, task = written[1]
    msgs = by_topic(bag)
    for camera, frames in images.items():
        got = [m for _, m in msgs[f"camera/{camera}/image_raw"]]
        assert len(got) == 5
        for i, m in enumerate(got):
            np.testing.assert_array_equal(m.data.reshape(18, 32, 3), frames[i])
    np.testing.assert_allclose(np.stack([m.position for _, m in msgs["joint_states"]]), state)
    np.testing.assert_allclose(np.stack([m.position for _, m in msgs["episode/action"]]), actions)
    assert msgs["instruction"][0][1].data == task
    times = [t for t, _ in msgs["joint_states"]]
    assert np.allclose(np.diff(times), 1e9 / 15, atol=1)
