"""Damaged bags are refused with one line (or read partially on request), never half-read in silence.

Real rosbag2 folders written by the converter and by rosbags, then damaged on disk the way a failed copy or a
killed recorder leaves them: metadata.yaml missing, a chunk in the middle of the MCAP file broken, bytes inside a
chunk changed, a message whose bytes do not decode as its type, metadata that lists fewer messages than stored. The command-line checks run the real `oxygen-ros` entry point in a child
process, so the exit status and every line the user would see are what is asserted.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from rclpy.qos import QoSProfile
from rosbags.rosbag2 import StoragePlugin, Writer
from sensor_msgs.msg import JointState
from test_replay_node import Child, Receiver

from oxygen_ros.data import (
    IncompleteBagError,
    bag_problem,
    bag_topics,
    iter_raw,
    read_messages,
    synthetic_episode,
    write_episode_bag,
)
from oxygen_ros.data.episode import DataError
from oxygen_ros.data.mcap_chunks import CRC_AT, chunks
from oxygen_ros.data.msgtypes import bag_typestore
from oxygen_ros.data.report import main as report_main

REPO = Path(__file__).resolve().parents[2]


def oxygen_ros(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "oxygen_ros.commands.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def mcap_chunks(path: Path) -> list[tuple[int, int]]:
    with open(path, "rb") as file:
        return list(chunks(file))


def break_middle_chunk(bag: Path, how: str) -> None:
    """Damage the first record inside the middle chunk: `skip` turns it into an unknown record spanning the
    whole chunk and unsets the chunk's CRC, as a writer without checksums leaves it (the reader silently skips
    every message in it), `truncate` gives it a length past the chunk's end (the reader raises part way through),
    `flip` changes one byte of the last message's body (its records keep their structure)."""
    mcap = next(bag.glob("*.mcap"))
    found = mcap_chunks(mcap)
    assert len(found) >= 3, found
    offset, length = found[len(found) // 2]
    data = bytearray(mcap.read_bytes())
    compression_len = struct.unpack_from("<I", data, offset + 9 + 28)[0]
    assert compression_len == 0  # rosbags writes uncompressed chunks by default
    records = offset + 9 + 32 + 8  # times, size, crc, empty compression name, records length
    records_len = length - 40
    if how == "skip":
        data[records] = 0x00
        struct.pack_into("<Q", data, records + 1, records_len - 9)
        struct.pack_into("<I", data, offset + CRC_AT, 0)
    elif how == "flip":
        data[records + records_len - 100] ^= 0xFF  # a pixel of the chunk's last image, or a joint's byte
    else:
        struct.pack_into("<Q", data, records + 1, 10**9)
    mcap.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def episode_bag(tmp_path_factory):
    """Three chunks of 1 MiB: 2 s at 30 fps of 96x128 frames."""
    bag = tmp_path_factory.mktemp("integrity") / "episode"
    write_episode_bag(synthetic_episode(seconds=2.0, fps=30, cameras=("cam_high",), height=96, width=128), bag)
    return bag


def damaged_copy(episode_bag: Path, tmp_path: Path, how: str) -> Path:
    bag = tmp_path / f"bag_{how}"
    shutil.copytree(episode_bag, bag)
    break_middle_chunk(bag, how)
    return bag


def test_intact_bag_reads_fully(episode_bag):
    assert bag_problem(episode_bag) is None
    assert len(list(iter_raw(episode_bag))) == sum(t.count for t in bag_topics(episode_bag)) == 181
    mcap = next(episode_bag.glob("*.mcap"))
    data = mcap.read_bytes()
    for offset, _ in mcap_chunks(mcap):  # every chunk carries the CRC-32 of its records
        (crc,) = struct.unpack_from("<I", data, offset + CRC_AT)
        (records_len,) = struct.unpack_from("<Q", data, offset + CRC_AT + 8)
        assert crc == zlib.crc32(data[offset + CRC_AT + 16:offset + CRC_AT + 16 + records_len]) != 0


def test_a_byte_changed_inside_a_chunk_is_a_damaged_bag(episode_bag, tmp_path):
    bag = damaged_copy(episode_bag, tmp_path, "flip")
    assert "storage read stopped: ReaderError: Chunk checksum mismatch" in bag_problem(bag)
    with pytest.raises(IncompleteBagError, match=r"damaged or incomplete bag.*joint_states \d+ of 60"):
        list(read_messages(bag))


def test_more_messages_than_the_metadata_lists_are_refused(episode_bag, tmp_path):
    bag = tmp_path / "bag"
    shutil.copytree(episode_bag, bag)
    text = (bag / "metadata.yaml").read_text()
    assert "message_count: 60" in text  # the camera, joint_states and episode/action
    (bag / "metadata.yaml").write_text(text.replace("message_count: 60", "message_count: 59", 1))
    topic = next(t.name for t in bag_topics(bag) if t.count == 59)
    line = f"the storage holds more messages than metadata.yaml lists, per topic: {topic} 60 where it lists 59"
    with pytest.raises(IncompleteBagError, match=line):
        list(iter_raw(bag))
    assert line in bag_problem(bag)
    assert_one_line_error(oxygen_ros("report", str(bag), "--out", str(tmp_path / "out")), line)


@pytest.mark.parametrize("how", ["skip", "truncate"])
def test_broken_middle_chunk_is_a_shortfall_naming_the_topics(episode_bag, tmp_path, how):
    bag = damaged_copy(episode_bag, tmp_path, how)
    with pytest.raises(IncompleteBagError, match=r"damaged or incomplete bag.*joint_states \d+ of 60") as err:
        list(iter_raw(bag))
    if how == "truncate":
        assert "storage read stopped: ReaderError" in str(err.value)
    seen: list[str] = []
    partial = list(iter_raw(bag, ["joint_states"], on_incomplete=seen.append))
    assert 0 < len(partial) < 60 and len(seen) == 1 and f"joint_states {len(partial)} of 60" in seen[0]
    assert bag_problem(bag) is not None
    assert bag_problem(bag, ["instruction"]) is None  # the first chunk still holds the instruction


def test_a_consumer_stopping_early_is_not_a_shortfall(episode_bag):
    for i, _ in enumerate(iter_raw(episode_bag)):
        if i == 5:
            break


def test_report_refuses_a_damaged_bag_and_leaves_no_folder(episode_bag, tmp_path):
    bag = damaged_copy(episode_bag, tmp_path, "skip")
    out = tmp_path / "reports" / "run"
    assert_one_line_error(oxygen_ros("report", str(bag), "--out", str(out)), "damaged or incomplete bag",
                          "joint_states")
    assert not out.exists()
    assert_one_line_error(oxygen_ros("report", str(tmp_path / "rec_missing"), "--episode-bag", str(bag),
                                     "--out", str(out)), "episode/action")  # the episode bag is checked too
    assert not out.exists()

    result = oxygen_ros("report", str(bag), "--out", str(out), "--allow-partial")
    assert result.returncode == 0, result.stderr
    warnings = result.stderr.strip().splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "joint_states" in warnings[0]
    report = json.loads((out / "report.json").read_text())
    assert 0 < report["topics"]["joint_states"]["count"] < 60
    (out / "report.json").unlink()
    assert report_main([str(episode_bag), "--out", str(out)]) == 0  # an existing folder is written in place
    assert json.loads((out / "report.json").read_text())["topics"]["joint_states"]["count"] == 60


def test_bag_without_metadata_is_one_line_for_replay_and_report(episode_bag, tmp_path, ros_env):
    bag = tmp_path / "no_metadata"
    shutil.copytree(episode_bag, bag)
    (bag / "metadata.yaml").unlink()
    out = tmp_path / "out"
    assert_one_line_error(oxygen_ros("report", str(bag), "--out", str(out)), str(bag), "no metadata.yaml")
    assert_one_line_error(oxygen_ros("report", str(tmp_path / "rec"), "--episode-bag", str(bag), "--out", str(out)),
                          "no metadata.yaml")
    assert not out.exists()
    assert_one_line_error(oxygen_ros("replay", str(bag), env=ros_env), str(bag), "no metadata.yaml")


def _yaml_syntax_error(bag: Path) -> None:
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information: [\n  version: 9\n")


def _count_as_text(bag: Path) -> None:
    text = (bag / "metadata.yaml").read_text()
    (bag / "metadata.yaml").write_text(text.replace("message_count: 60", "message_count: sixty", 1))


def _storage_file_missing(bag: Path) -> None:
    next(bag.glob("*.mcap")).unlink()


@pytest.mark.parametrize(("damage", "message"), [
    (_yaml_syntax_error, "not a readable rosbag2 (Could not load YAML"),
    (_count_as_text, "a message count of 'sixty'"),
    (_storage_file_missing, "files are missing"),
])
def test_bad_metadata_is_one_line(episode_bag, tmp_path, capsys, damage, message):
    bag = tmp_path / "bag"
    shutil.copytree(episode_bag, bag)
    damage(bag)
    assert report_main([str(bag), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_replay_refuses_a_damaged_bag_before_publishing(episode_bag, tmp_path, ros_env):
    for how in ("skip", "truncate"):
        bag = damaged_copy(episode_bag, tmp_path, how)
        assert_one_line_error(oxygen_ros("replay", str(bag), env=ros_env), "damaged or incomplete bag",
                              "--allow-partial replays what is readable")


def test_replay_allow_partial_publishes_what_is_readable(episode_bag, tmp_path, ros_context, ros_env):
    bag = damaged_copy(episode_bag, tmp_path, "truncate")
    problems: list[str] = []
    expected = [raw.data for raw in iter_raw(bag, ["joint_states"], on_incomplete=problems.append)]
    assert len(problems) == 1 and 0 < len(expected) < 60
    receiver = Receiver(ros_context, {"joint_states": (JointState, QoSProfile(depth=100))})
    child = Child(["-m", "oxygen_ros.nodes.replay_node", str(bag), "--allow-partial", "--topics", "joint_states",
                   "--wait-for", "joint_states", "--delay", "0.3", "--rate", "4"], ros_env)
    try:
        got = receiver.wait_for(lambda: len(receiver.received["joint_states"]) >= len(expected), timeout=20)
        child.note_shm()
        rc, output = child.wait(timeout=10)
    finally:
        receiver.close()
        child.stop()
    assert got and rc == 0, output
    assert [data for _, data in receiver.received["joint_states"]] == expected
    assert "replaying a partial bag" in output and f"joint_states {len(expected)} of 60" in output


def test_undecodable_message_is_named_not_a_traceback(tmp_path):
    store = bag_typestore()
    with Writer(tmp_path / "rec", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=store)
        writer.write(conn, 5, b"\x00\x01\x00\x00\xff\xff\xff\x7f")  # a header whose string length runs off the end
    with pytest.raises(DataError, match=r"/joint_states message at log time 5 does not decode"):
        list(read_messages(tmp_path / "rec"))
    assert_one_line_error(oxygen_ros("report", str(tmp_path / "rec"), "--out", str(tmp_path / "out")),
                          "does not decode as sensor_msgs/msg/JointState")
    assert not (tmp_path / "out").exists()
