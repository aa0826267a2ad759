"""`convert` on real ALOHA / LeRobot files of unexpected structure: one line naming the problem, no output.

Each case starts from a valid file written by our writers and changes one thing the way files from other tools
(or damaged ones) differ: a group where a dataset belongs, a scalar or string field, a list where an object
belongs, fps 0, ragged columns, NaN states, an episode without frames.
"""

import json
import shutil

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_bag_integrity import assert_one_line_error, oxygen_ros

from oxygen_ros.data import DataError, synthetic_episode, write_aloha, write_episode_bag, write_lerobot
from oxygen_ros.data.convert import main as convert
from oxygen_ros.data.episode_bag import MAX_STAMP_S

EPISODE_PARQUET = "meta/episodes/chunk-000/file-000.parquet"
DATA_PARQUET = "data/chunk-000/file-000.parquet"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    episode = synthetic_episode(seconds=0.2, fps=20, cameras=("top",), height=16, width=16)
    write_aloha(root / "episode_0.hdf5", episode)
    write_lerobot(root / "dataset", [episode])
    return root


def replace(name, value):
    def edit(f):
        del f[name]
        if value is not None:
            f[name] = value
    return edit


def make_group(name):
    def edit(f):
        del f[name]
        f.create_group(name)
    return edit


def set_qpos_value(frame, joint, value):
    def edit(f):
        qpos = f["/observations/qpos"][()]
        qpos[frame, joint] = value
        f["/observations/qpos"][...] = qpos
    return edit


def empty_episode(f):
    for name in ("/observations/qpos", "/observations/qvel", "/action"):
        replace(name, np.zeros((0, 14), np.float32))(f)
    replace("/observations/images/top", np.zeros((0, 16, 16, 3), np.uint8))(f)


ALOHA_CASES = {
    "group_for_qpos": (make_group("/observations/qpos"), "/observations/qpos is a group, expected a dataset"),
    "group_for_camera": (make_group("/observations/images/top"),
                         "/observations/images/top is a group, expected a dataset"),
    "scalar_action": (replace("/action", 1.5), "/action has shape (), expected 2 dimensions"),
    "string_qvel": (replace("/observations/qvel", "fast"), "/observations/qvel holds object values, expected numbers"),
    "compress_text": (lambda f: f.attrs.__setitem__("compress", "yes"),
                      "attribute 'compress' is 'yes', expected a boolean"),
    "nan_state": (set_qpos_value(2, 3, np.nan), "state has 1 non-finite values (first at frame 2, left_forearm_roll"),
    "no_frames": (empty_episode, "the episode has no frames"),
}


@pytest.mark.parametrize("case", sorted(ALOHA_CASES))
def test_aloha_of_unexpected_structure(sources, tmp_path, capsys, case):
    edit, message = ALOHA_CASES[case]
    src = tmp_path / "episode_0.hdf5"
    shutil.copy(sources / "episode_0.hdf5", src)
    with h5py.File(src, "a") as f:
        edit(f)
    assert convert(["aloha", str(src), str(tmp_path / "out" / "bag")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(src) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episode_0.hdf5"]  # no output, no staging folder


def edit_info(change):
    def edit(root):
        path = root / "meta/info.json"
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return edit


def edit_table(relative, change):
    def edit(root):
        path = root / relative
        pq.write_table(change(pq.read_table(path)), path)
    return edit


def with_column(name, values, type_=None):
    def change(table):
        return table.set_column(table.column_names.index(name), name, pa.array(values, type_))
    return change


def state_rows(change):
    """observation.state as Python lists, changed, written back as a list<float> column."""
    def edit(table):
        rows = table.column("observation.state").to_pylist()
        change(rows)
        return with_column("observation.state", rows, pa.list_(pa.float32()))(table)
    return edit


def setitem(key, value):
    def change(mapping):
        mapping[key] = value
        return mapping
    return change


LEROBOT_CASES = {
    "fps_zero": (edit_info(setitem("fps", 0)), "meta/info.json: fps must be a positive number, got 0"),
    "info_is_a_list": (edit_info(lambda info: [info]), "meta/info.json: expected a JSON object, got list"),
    "features_list": (edit_info(setitem("features", ["observation.state"])),
                      "'features' must map each key to an object"),
    "ragged_state": (edit_table(DATA_PARQUET, state_rows(lambda rows: rows[1].pop())),
                     "column 'observation.state' has rows of different widths (13 to 14)"),
    "string_state": (edit_table(DATA_PARQUET, lambda t: with_column("observation.state", ["x"] * len(t))(t)),
                     "column 'observation.state' holds string values, expected numbers"),
    "length_as_text": (edit_table(EPISODE_PARQUET, with_column("length", ["4"])),
                       "episode field 'length' is '4', expected int"),
    "no_chunk_index": (edit_table(EPISODE_PARQUET, lambda t: t.drop_columns(["data/chunk_index"])),
                       "episode metadata has no 'data/chunk_index' field"),
    "nan_state": (edit_table(DATA_PARQUET, state_rows(lambda rows: rows[2].__setitem__(0, float("nan")))),
                  "state has 1 non-finite values (first at frame 2, left_waist: nan)"),
    "no_frames": (edit_table(EPISODE_PARQUET, with_column("length", [0], pa.int64())), "the episode has no frames"),
}


@pytest.mark.parametrize("case", sorted(LEROBOT_CASES))
def test_lerobot_of_unexpected_structure(sources, tmp_path, capsys, case):
    edit, message = LEROBOT_CASES[case]
    src = tmp_path / "dataset"
    shutil.copytree(sources / "dataset", src)
    edit(src)
    assert convert(["lerobot", str(src), str(tmp_path / "bag")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(src) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]


def test_command_line_gives_one_line_without_traceback(sources, tmp_path):
    src = tmp_path / "episode_0.hdf5"
    shutil.copy(sources / "episode_0.hdf5", src)
    with h5py.File(src, "a") as f:
        make_group("/observations/qvel")(f)
    assert_one_line_error(oxygen_ros("convert", "aloha", str(src), str(tmp_path / "bag")),
                          "/observations/qvel is a group, expected a dataset")
    assert not (tmp_path / "bag").exists()
    dataset = tmp_path / "dataset"
    shutil.copytree(sources / "dataset", dataset)
    edit_info(setitem("fps", 0))(dataset)
    assert_one_line_error(oxygen_ros("convert", "lerobot", str(dataset), str(tmp_path / "bag")), "fps must be")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset", "episode_0.hdf5"]


def test_base_time_must_give_ros_stamps(sources, tmp_path):
    for value in ("nan", "-5", "1e30"):
        result = oxygen_ros("convert", "aloha", str(sources / "episode_0.hdf5"), str(tmp_path / "bag"),
                            "--base-time", value)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"error: argument --base-time: must be seconds from 0 to {MAX_STAMP_S}, got '{value}'" in result.stderr
    episode = synthetic_episode(seconds=2.0, fps=10, cameras=("top",), height=8, width=8)
    with pytest.raises(DataError, match="do not fit a ROS time"):  # starts in range, ends past 2038
        write_episode_bag(episode, tmp_path / "bag", base_time_ns=MAX_STAMP_S * 10**9 - 500_000_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
