"""Episode formats round-trip through real files: ALOHA HDF5 (raw and JPEG) and LeRobot v3 (parquet + mp4)."""

import json

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from oxygen_ros.data import (
    ALOHA_JOINT_NAMES,
    DataError,
    read_aloha,
    read_lerobot,
    synthetic_episode,
    write_aloha,
    write_lerobot,
)


@pytest.fixture(scope="module")
def episode():
    return synthetic_episode(seconds=1.0, fps=50, cameras=("cam_low", "cam_high", "cam_left_wrist"), seed=1)


def test_aloha_raw_round_trip_is_exact_and_uses_the_tools_layout(tmp_path, episode):
    path = write_aloha(tmp_path / "episode_0.hdf5", episode)
    with h5py.File(path, "r") as f:
        assert f.attrs["sim"] == np.False_ and f.attrs["compress"] == np.False_
        cam = f["/observations/images/cam_high"]
        assert cam.dtype == np.uint8 and cam.shape == (50, 96, 128, 3) and cam.chunks == (1, 96, 128, 3)
        for name in ("/observations/qpos", "/observations/qvel", "/action"):
            assert f[name].shape == (50, 14) and f[name].dtype == np.float32
    back = read_aloha(path, task="t")
    assert back.fps == 50 and back.joint_names == ALOHA_JOINT_NAMES and back.task == "t"
    assert set(back.cameras) == set(episode.cameras)
    for cam in episode.cameras:
        np.testing.assert_array_equal(back.images[cam], episode.images[cam])
    np.testing.assert_array_equal(back.state, episode.state)
    np.testing.assert_array_equal(back.actions, episode.actions)
    np.testing.assert_array_equal(back.velocity, episode.velocity)


def test_aloha_full_resolution_frames_are_chunked_per_frame(tmp_path):
    ep = synthetic_episode(seconds=0.06, fps=50, cameras=("top",), height=480, width=640)
    with h5py.File(write_aloha(tmp_path / "e.hdf5", ep, sim=True), "r") as f:
        assert f["/observations/images/top"].chunks == (1, 480, 640, 3) and f.attrs["sim"]


def test_aloha_compressed_round_trip_within_jpeg_tolerance(tmp_path, episode):
    path = write_aloha(tmp_path / "episode_0.hdf5", episode, compress=True)
    with h5py.File(path, "r") as f:
        assert f.attrs["compress"]
        lengths = f["/compress_len"][()]
        assert lengths.shape == (3, 50)
        padded = f["/observations/images/cam_low"]
        assert padded.dtype == np.uint8 and padded.ndim == 2 and padded.shape[1] == int(lengths.max())
    back = read_aloha(path)
    for cam in episode.cameras:
        err = np.abs(back.images[cam].astype(int) - episode.images[cam]).mean()
        assert err < 4.0, (cam, err)
    np.testing.assert_array_equal(back.state, episode.state)


def test_aloha_compressed_rows_are_matched_to_cameras_by_content(tmp_path, episode):
    """compress_len rows follow the recording config's camera order, not HDF5's alphabetical listing."""
    path = write_aloha(tmp_path / "e.hdf5", episode, compress=True)
    with h5py.File(path, "a") as f:
        f["/compress_len"][...] = f["/compress_len"][()][::-1]
        images = f["/observations/images"]
        order = list(images)
        data = {cam: images[cam][()] for cam in order}
        for cam in order:
            del images[cam]
        for cam, new in zip(order, reversed(order)):  # each camera's bytes now sit under another name
            images.create_dataset(new, data=data[cam])
    back = read_aloha(path)
    reversed_names = dict(zip(order, reversed(order)))
    for cam in order:
        err = np.abs(back.images[reversed_names[cam]].astype(int) - episode.images[cam]).mean()
        assert err < 4.0


def test_lerobot_v3_round_trip_several_episodes(tmp_path):
    episodes = [synthetic_episode(seconds=0.6, fps=30, seed=s, task=("fold", "stack")[s % 2]) for s in range(3)]
    root = write_lerobot(tmp_path / "ds", episodes)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 30 and info["total_episodes"] == 3
    assert info["features"]["observation.images.cam_high"]["dtype"] == "video"
    assert info["features"]["observation.state"]["names"] == list(ALOHA_JOINT_NAMES)
    meta = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [m["dataset_from_index"] for m in meta] == [0, 18, 36]
    assert meta[1]["videos/observation.images.cam_high/from_timestamp"] == pytest.approx(0.6)
    for key in ("tasks", "length", "data/chunk_index", "data/file_index", "dataset_to_index",
                "videos/observation.images.cam_left_wrist/to_timestamp"):
        assert key in meta[0]
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.column("task").to_pylist() == ["fold", "stack"]
    assert json.loads((root / "meta/stats.json").read_text())["action"]["count"] == [54]
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    assert {"timestamp", "frame_index", "episode_index", "index", "task_index"} <= set(data.column_names)

    for i, ep in enumerate(episodes):
        back = read_lerobot(root, i)
        assert back.task == ep.task and back.length == 18 and back.fps == 30
        np.testing.assert_array_equal(back.state, ep.state)
        np.testing.assert_array_equal(back.actions, ep.actions)
        np.testing.assert_allclose(back.times(), ep.times(), atol=1e-6)
        for cam in ep.cameras:
            own = np.abs(back.images[cam].astype(int) - ep.images[cam]).mean()
            other = np.abs(back.images[cam].astype(int) - episodes[(i + 1) % 3].images[cam]).mean()
            assert own < 4.0 and own < other / 2, (cam, own, other)


def test_lerobot_av1_video_decodes(tmp_path):
    ep = synthetic_episode(seconds=0.4, fps=20, cameras=("top",), height=64, width=96)
    root = write_lerobot(tmp_path / "ds", [ep], codec="av1")
    assert json.loads((root / "meta/info.json").read_text())["features"]["observation.images.top"]["info"][
        "video.codec"] == "av1"
    assert np.abs(read_lerobot(root).images["top"].astype(int) - ep.images["top"]).mean() < 6.0


def test_droid_layout_reads_joint_and_gripper_as_state(tmp_path):
    """DROID on the hub: separate joint_position (7) and gripper_position (1) columns, its own camera names."""
    ep = synthetic_episode(seconds=0.4, fps=15, cameras=("exterior_image_1_left", "wrist_image_left"), dim=8,
                           height=48, width=64, task="put the marker in the cup")
    root = write_lerobot(tmp_path / "droid", [ep])
    data_path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data_path)
    columns = {}
    for name in table.column_names:
        if name in ("observation.state", "action"):
            flat = np.asarray(table.column(name).combine_chunks().flatten()).reshape(len(table), 8)
            prefix = "observation.state" if name == "observation.state" else "action"
            columns[prefix + ".joint_position"] = pa.array(list(flat[:, :7].astype(np.float64)))
            columns[prefix + ".gripper_position"] = pa.array(list(flat[:, 7:].astype(np.float64)))
        elif not name.startswith("observation.velocity"):
            columns[name] = table.column(name)
    pq.write_table(pa.table(columns), data_path)
    info = json.loads((root / "meta/info.json").read_text())
    for prefix in ("observation.state", "action"):
        del info["features"][prefix]
        info["features"][prefix + ".joint_position"] = {"dtype": "float64", "shape": [7],
                                                        "names": [f"joint_{i}" for i in range(7)]}
        info["features"][prefix + ".gripper_position"] = {"dtype": "float64", "shape": [1], "names": ["gripper"]}
    del info["features"]["observation.velocity"]
    (root / "meta/info.json").write_text(json.dumps(info))

    back = read_lerobot(root, 0)
    assert back.state.shape == (6, 8) and back.joint_names[-1] == "gripper"
    np.testing.assert_allclose(back.state, ep.state, atol=1e-6)
    np.testing.assert_allclose(back.actions, ep.actions, atol=1e-6)
    assert set(back.cameras) == {"exterior_image_1_left", "wrist_image_left"}
    assert back.task == "put the marker in the cup"


def test_episode_rejects_mismatched_lengths():
    ep = synthetic_episode(seconds=0.2, fps=50)
    with pytest.raises(DataError, match="mismatched lengths"):
        type(ep)(images=ep.images, state=ep.state, actions=ep.actions[:-1], fps=50)
