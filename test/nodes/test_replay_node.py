"""Replay over real DDS: the replay's own record of its schedule (--schedule-report) against the bag, and what a
subscriber in this process takes in (bytes, order, counts; when, only loosely).

Also holds the child-process helpers the record tests use (start with the test's DDS domain, stop with SIGINT,
remove any Fast DDS shared-memory files a killed child leaves behind).
"""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.serialization import deserialize_message
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from oxygen_ros.commands.processes import stop
from oxygen_ros.data import iter_raw, synthetic_episode, write_episode_bag
from oxygen_ros.data.episode_bag import LATCHED_QOS, SENSOR_QOS, offered_qos
from oxygen_ros.nodes.replay_node import ReplayNode
from oxygen_ros.nodes.replay_node import main as replay_main

REPO = Path(__file__).resolve().parents[2]


def shm_paths_of(pid: int) -> set[str]:
    """/dev/shm files a process has mapped or open (Fast DDS segments, their lock files, port semaphores)."""
    paths = set()
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if "/dev/shm/" in line:
                paths.add(line[line.index("/dev/shm/"):].replace(" (deleted)", ""))
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("/dev/shm/"):
                paths.add(target)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return paths


def remove_orphaned_shm(paths: set[str]) -> None:
    """Delete the given /dev/shm files unless some live process still maps or holds them."""
    in_use = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            in_use |= shm_paths_of(int(proc.name))
    for path in paths - in_use:
        Path(path).unlink(missing_ok=True)


class Child:
    """A node process on the test's DDS domain; `stop()` sends SIGINT, then kills, then cleans /dev/shm."""

    def __init__(self, args: list[str], env: dict, ignore_sigint: bool = False):
        """`ignore_sigint`: start it as a shell starts a background job, with SIGINT ignored."""
        env = dict(env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [sys.executable, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None)
        self.shm: set[str] = set()
        self.lines: list[str] = []  # its output so far, read on a thread (a full pipe would block the child)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for_lines(self, texts: list[str], timeout: float) -> bool:
        """Whether every text has appeared in a line of the child's output within `timeout` s (False if it ends)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = list(self.lines)
            if all(any(text in line for line in seen) for text in texts):
                return True
            if time.monotonic() > deadline or self.process.poll() is not None:
                return False
            time.sleep(0.05)

    def note_shm(self) -> None:
        self.shm |= shm_paths_of(self.process.pid)

    def wait(self, timeout: float) -> tuple[int, str]:
        """Wait for the child to exit by itself (SIGINT after `timeout`); returns (exit status, output)."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        return self.stop()

    def stop(self, timeout: float = 30.0) -> tuple[int, str]:  # SIGINT, then the exit (slow on busy cores)
        if self.process.poll() is None:
            self.note_shm()
            stop(self.process, timeout)
        self._reader.join(timeout=10)
        remove_orphaned_shm(self.shm)
        return self.process.returncode, "".join(self.lines)


class Receiver:
    """Subscriptions (raw bytes + monotonic receive time) spun on a SingleThreadedExecutor thread."""

    def __init__(self, context, subscriptions: dict[str, tuple[type, QoSProfile]]):
        self.node = rclpy.create_node("receiver", context=context)
        self.received = {topic: [] for topic in subscriptions}
        for topic, (cls, qos) in subscriptions.items():
            self.node.create_subscription(
                cls, topic, lambda data, t=topic: self.received[t].append((time.monotonic(), data)), qos, raw=True
            )
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def wait_for(self, condition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.05)
        return condition()

    def close(self) -> None:
        self.executor.shutdown()
        self.thread.join()
        self.node.destroy_node()


def read_schedule(path: Path) -> tuple[dict, list[dict], list[dict]]:
    """A --schedule-report: the whole report, its message rows and its /clock rows."""
    report = json.loads(path.read_text())
    rows = report["publications"]
    return report, [r for r in rows if r["topic"] != "/clock"], [r for r in rows if r["topic"] == "/clock"]


def assert_kept_schedule(path: Path, bag: list[tuple[str, int]], rate: float) -> dict:
    """The replay's own record of its schedule (run with --clock) against the bag's (topic, log time) list, exactly:
    every message once, in the bag's order, due `ceil((log - first) / rate)` ns after time zero and published no
    earlier, each right after /clock at its log time; and the replay never idle while a message was due: each
    /clock value it sent between messages went out before the next message's due time, carrying the bag time of
    that instant (`first + elapsed * rate`). How late a message went out is how long this machine kept the
    replay's thread from running (about a millisecond at the median beside other test runs, tens of ms at load 13
    to 16 on two cores, a few over 0.3 s), so only seconds are bounded there. A replay that bursts publishes early;
    one sleeping on the wrong rate, or adding up delays, sends /clock values while a message is due. Returns the
    report."""
    report, messages, _ = read_schedule(path)
    first = bag[0][1]
    assert [(r["loop"], r["topic"], r["bag_time_ns"]) for r in messages] == [(0, t, log) for t, log in bag]
    assert [r["due_ns"] for r in messages] == [math.ceil((log - first) / rate) for _, log in bag]
    lateness = np.array([r["at_ns"] - r["due_ns"] for r in messages]) / 1e9
    assert lateness.min() >= 0 and lateness.max() < 2.0, lateness  # never early
    assert report["messages"] == len(bag) and report["lateness_ms"]["max"] == pytest.approx(1e3 * lateness.max(),
                                                                                           abs=1e-3)
    rows, ticks = report["publications"], 0
    assert rows[0]["topic"] == "/clock"
    for before, row in zip(rows, rows[1:]):
        if row["topic"] != "/clock":  # a message: /clock at its log time just before it, in the same instant
            assert before["topic"] == "/clock" and (before["bag_time_ns"], before["due_ns"], before["at_ns"]) == (
                row["bag_time_ns"], row["due_ns"], row["at_ns"]), (before, row)
    for index, row in enumerate(rows):
        if row["topic"] == "/clock" and row["due_ns"] is None:  # a value between messages
            ticks += 1
            following = next(r for r in rows[index:] if r["topic"] != "/clock")
            assert row["at_ns"] < following["due_ns"], (row, following)
            assert row["bag_time_ns"] == first + int(row["at_ns"] * rate) < following["bag_time_ns"], row
    assert ticks > 0, "no /clock values between the messages"
    return report


def assert_clock_received(path: Path, received: list[int]) -> None:
    """The /clock values a subscriber took in are some of those the replay recorded, in order, the last message's log
    time last (the replay waits for its acknowledgement before it exits)."""
    _, messages, clocks = read_schedule(path)
    values = [c["bag_time_ns"] for c in clocks]
    assert values == sorted(values)
    assert received == sorted(received) and set(received) <= set(values) and received[-1] == messages[-1]["bag_time_ns"]


def assert_received_after_publication(report: dict, published: list[dict], received: list[tuple[float, bytes]]):
    """Receive times, loosely (they are the machine's, not the replay's): each message arrives after the replay
    published it and within seconds of it, on the one monotonic clock the host's processes share."""
    zero = report["time_zero_monotonic_ns"]
    delays = [t - (zero + row["at_ns"]) / 1e9 for (t, _), row in zip(received, published, strict=True)]
    assert min(delays) > -1e-6 and max(delays) < 5.0, delays


@pytest.fixture(scope="module")
def episode_bag(tmp_path_factory):
    bag = tmp_path_factory.mktemp("replay") / "bag"
    write_episode_bag(synthetic_episode(seconds=1.0, fps=50, cameras=("cam_high",), height=48, width=64), bag)
    return bag


def test_replay_keeps_bag_timing_and_bytes_at_rate_1(ros_context, ros_env, episode_bag, tmp_path):
    receiver = Receiver(ros_context, {
        "joint_states": (JointState, QoSProfile(depth=100)),
        # best effort as offered, but a deep history: a loaded machine may leave this process's spin thread behind
        # for a while, and sensor data's 5 would then drop what DDS did deliver
        "camera/cam_high/image_raw": (Image, QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT)),
        "instruction": (String, QoSProfile(depth=1)),
        "/clock": (Clock, QoSProfile(depth=100)),
    })
    report_path = tmp_path / "schedule.json"
    child = Child(["-m", "oxygen_ros.nodes.replay_node", str(episode_bag), "--clock", "--wait-for", "joint_states",
                   "camera/cam_high/image_raw", "instruction", "--delay", "0.3", "--schedule-report",
                   str(report_path)], ros_env)
    try:
        got = receiver.wait_for(lambda: len(receiver.received["joint_states"]) >= 50, timeout=20)
        child.note_shm()
        rc, output = child.wait(timeout=10)
        assert rc == 0, output
    finally:
        receiver.close()
        child.stop()
    assert got, {t: len(v) for t, v in receiver.received.items()}
    assert "schedule: " in output and "ms after their due time at the median" in output, output
    bag = [(raw.topic, raw.log_time_ns) for raw in iter_raw(episode_bag)]
    report = assert_kept_schedule(report_path, bag, rate=1.0)
    expected = [raw for raw in iter_raw(episode_bag, ["joint_states"])]
    joints = receiver.received["joint_states"]
    assert [data for _, data in joints] == [raw.data for raw in expected]  # raw CDR passes through untouched
    _, published, _ = read_schedule(report_path)
    assert_received_after_publication(report, [r for r in published if r["topic"] == "joint_states"], joints)
    images = [data for _, data in receiver.received["camera/cam_high/image_raw"]]
    assert len(images) >= 45  # best effort: a rare drop is allowed
    remaining = iter([raw.data for raw in iter_raw(episode_bag, ["camera/cam_high/image_raw"])])
    assert all(any(data == sent for sent in remaining) for data in images)  # the bag's frames, in its order
    instruction = [deserialize_message(d, String).data for _, d in receiver.received["instruction"]]
    assert instruction == ["pick up the red cube"]  # (the wire pads CDR to 4 bytes, so compare decoded)
    clocks = [deserialize_message(d, Clock).clock for _, d in receiver.received["/clock"]]
    assert_clock_received(report_path, [c.sec * 10**9 + c.nanosec for c in clocks])


def test_foreign_sqlite3_bag_at_rate_2_with_clock(ros_context, ros_env, tmp_path):
    """A bag written directly with rosbags (not our converter), standard types, absolute topic names; the replay
    also waits for a subscriber to a topic it does not publish (as the demo waits for its recorder)."""
    store = get_typestore(Stores.ROS2_KILTED)
    string_cls = store.types["std_msgs/msg/String"]
    start = 5_000_000_000
    bag = [("/chatter", start + i * 40_000_000) for i in range(30)]
    with Writer(tmp_path / "bag", version=9, storage_plugin=StoragePlugin.SQLITE3) as writer:
        conn = writer.add_connection("/chatter", "std_msgs/msg/String", typestore=store)
        for i, (_, log_time) in enumerate(bag):
            writer.write(conn, log_time, store.serialize_cdr(string_cls(data=f"hello {i}"), "std_msgs/msg/String"))
    receiver = Receiver(ros_context, {"/chatter": (String, QoSProfile(depth=100)),
                                      "/clock": (Clock, QoSProfile(depth=100))})
    report_path = tmp_path / "schedule.json"
    child = Child(["-m", "oxygen_ros.nodes.replay_node", str(tmp_path / "bag"), "--rate", "2", "--clock",
                   "--wait-for", "/chatter", "--wait-for-subscribers", "/recorded", "--delay", "0.3",
                   "--schedule-report", str(report_path)], ros_env)
    try:
        assert receiver.wait_for(lambda: receiver.node.count_publishers("/chatter") > 0, timeout=60)
        time.sleep(1.0)  # the replay is up and /chatter has its subscriber; nothing subscribes to /recorded yet
        assert receiver.received["/chatter"] == [] and receiver.received["/clock"] == []
        receiver.node.create_subscription(String, "/recorded", lambda _: None, QoSProfile(depth=1))
        got = receiver.wait_for(lambda: len(receiver.received["/chatter"]) >= 30, timeout=20)
        child.note_shm()
        rc, output = child.wait(timeout=10)
        assert rc == 0, output
    finally:
        receiver.close()
        child.stop()
    assert got, (len(receiver.received["/chatter"]), output)  # how many arrived, and what the replay logged
    chatter = receiver.received["/chatter"]
    decoded = [deserialize_message(d, String).data for _, d in chatter]
    assert decoded == [f"hello {i}" for i in range(30)]
    report = assert_kept_schedule(report_path, bag, rate=2.0)
    _, published, _ = read_schedule(report_path)
    assert_received_after_publication(report, published, chatter)
    clocks = [deserialize_message(d, Clock).clock for _, d in receiver.received["/clock"]]
    assert_clock_received(report_path, [c.sec * 10**9 + c.nanosec for c in clocks])


SUBSCRIBER = """
import sys, rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String
rclpy.init()
node = rclpy.create_node("slow_reader")
node.create_subscription(String, "/chatter", lambda _: None, QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
print("subscribed", flush=True)
try:
    rclpy.spin(node)
except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
    pass
"""


def test_replay_waits_at_the_end_until_reliable_subscribers_acknowledge(ros_context, ros_env, tmp_path):
    """The replay's last messages are not lost with its exit: it waits until every reliable subscriber has
    acknowledged them. A subscriber process that is stopped (SIGSTOP) cannot acknowledge, so the wait runs out with
    a warning; once it runs again (SIGCONT) it acknowledges and the wait returns at once."""
    store = get_typestore(Stores.ROS2_KILTED)
    string_cls = store.types["std_msgs/msg/String"]
    with Writer(tmp_path / "bag", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("/chatter", "std_msgs/msg/String", typestore=store)
        for i in range(5):
            writer.write(conn, 1_000 + i * 1_000_000, store.serialize_cdr(string_cls(data=f"m{i}"), "std_msgs/msg/String"))
    node = ReplayNode(str(tmp_path / "bag"), wait_for=["/chatter"], context=ros_context)
    reader = Child(["-c", SUBSCRIBER], ros_env)
    try:
        assert node.wait_until_heard(threading.Event())  # the reader's subscription is matched to the replay
        time.sleep(0.5)  # and the reader's side has matched the replay's writer too
        os.kill(reader.process.pid, signal.SIGSTOP)
        assert node.play(threading.Event()) == 5
        start = time.monotonic()
        assert not node.wait_for_delivery(0.5)
        assert time.monotonic() - start >= 0.45
        os.kill(reader.process.pid, signal.SIGCONT)
        assert node.wait_for_delivery(20.0)
    finally:
        os.kill(reader.process.pid, signal.SIGCONT)
        node.destroy_node()
        reader.stop()


def test_replay_publishes_with_the_recorded_qos_so_latched_topics_reach_late_subscribers(
        ros_context, ros_env, tmp_path):
    """Offered QoS from the bag wins over any guess: a latched instruction that changed once, joint states a
    robot offered best effort, an image stream offered reliable. A transient-local subscriber created after both
    instructions went out (as vla_node's is when it starts late) gets the latest one."""
    store = get_typestore(Stores.ROS2_KILTED)
    T = store.types
    start = 7_000_000_000
    with Writer(tmp_path / "bag", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        instruction = writer.add_connection("/instruction", "std_msgs/msg/String", typestore=store,
                                            offered_qos_profiles=[LATCHED_QOS])
        joints = writer.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=store,
                                       offered_qos_profiles=[SENSOR_QOS])
        images = writer.add_connection("/camera/top/image_raw", "sensor_msgs/msg/Image", typestore=store,
                                       offered_qos_profiles=[offered_qos(reliable=True, latched=False, depth=7)])
        for i, text in enumerate(["first task", "second task"]):
            writer.write(instruction, start + i * 100_000_000,
                         store.serialize_cdr(T["std_msgs/msg/String"](data=text), "std_msgs/msg/String"))
        for i in range(60):  # 3 s at 20 Hz
            stamp = start + i * 50_000_000
            header = T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=stamp // 10**9,
                                                                                    nanosec=stamp % 10**9),
                                              frame_id="")
            msg = T["sensor_msgs/msg/JointState"](header=header, name=["a"], position=np.array([float(i)]),
                                                  velocity=np.zeros(0), effort=np.zeros(0))
            writer.write(joints, stamp, store.serialize_cdr(msg, "sensor_msgs/msg/JointState"))
            image = T["sensor_msgs/msg/Image"](header=header, height=1, width=1, encoding="rgb8", is_bigendian=0,
                                               step=3, data=np.zeros(3, dtype=np.uint8))
            writer.write(images, stamp, store.serialize_cdr(image, "sensor_msgs/msg/Image"))
    receiver = Receiver(ros_context, {"/joint_states": (JointState, qos_profile_sensor_data)})
    child = Child(["-m", "oxygen_ros.nodes.replay_node", str(tmp_path / "bag"), "--wait-for", "/joint_states",
                   "--delay", "0.3"], ros_env)
    late: list[bytes] = []
    try:
        assert receiver.wait_for(lambda: len(receiver.received["/joint_states"]) >= 10, timeout=20)  # 0.45 s in
        child.note_shm()
        offered = {}
        for topic in ("/instruction", "/joint_states", "/camera/top/image_raw"):
            [publisher] = receiver.node.get_publishers_info_by_topic(topic)
            offered[topic] = (publisher.qos_profile.reliability, publisher.qos_profile.durability)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        receiver.node.create_subscription(String, "/instruction", late.append, latched, raw=True)
        got_late = receiver.wait_for(lambda: late, timeout=5)
        rc, output = child.wait(timeout=10)
        assert rc == 0, output
    finally:
        receiver.close()
        child.stop()
    assert offered == {
        "/instruction": (ReliabilityPolicy.RELIABLE, DurabilityPolicy.TRANSIENT_LOCAL),
        "/joint_states": (ReliabilityPolicy.BEST_EFFORT, DurabilityPolicy.VOLATILE),
        "/camera/top/image_raw": (ReliabilityPolicy.RELIABLE, DurabilityPolicy.VOLATILE),
    }
    assert got_late and [deserialize_message(d, String).data for d in late] == ["second task"]


def test_sigint_stops_a_looping_replay_with_exit_0(ros_context, ros_env, episode_bag, tmp_path):
    """Stopped part way through its second pass, the replay still writes its schedule report: each pass starts
    over from the bag's first log time, due no earlier than the pass before it ended."""
    receiver = Receiver(ros_context, {"joint_states": (JointState, QoSProfile(depth=100))})
    report_path = tmp_path / "schedule.json"
    child = Child(["-m", "oxygen_ros.nodes.replay_node", str(episode_bag), "--loop", "--topics", "joint_states",
                   "--wait-for", "joint_states", "--delay", "0.3", "--schedule-report", str(report_path)], ros_env)
    try:
        assert receiver.wait_for(lambda: len(receiver.received["joint_states"]) >= 70, timeout=20)  # into loop 2
        rc, output = child.stop(timeout=10)  # a replay that ignored SIGINT would be killed: status -9
        assert rc == 0, output
    finally:
        receiver.close()
        child.stop()
    _, rows, _ = read_schedule(report_path)
    log_times = [raw.log_time_ns for raw in iter_raw(episode_bag, ["joint_states"])]
    passes = [[r for r in rows if r["loop"] == n] for n in (0, 1)]
    assert [r["bag_time_ns"] for r in passes[0]] == log_times
    assert [r["bag_time_ns"] for r in passes[1]] == log_times[:len(passes[1])] and len(passes[1]) >= 20
    assert passes[1][0]["due_ns"] >= passes[0][-1]["due_ns"] and all(r["at_ns"] >= r["due_ns"] for r in rows)


def test_missing_topic_and_unknown_type_are_clear_errors(tmp_path, episode_bag, capsys):
    assert replay_main([str(episode_bag), "--topics", "joint_states", "camera/nope"]) == 1
    assert "requested topics not in bag: ['camera/nope']" in capsys.readouterr().err
    with Writer(tmp_path / "bag", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("gizmo", "acme_msgs/msg/Gizmo", msgdef="uint8 x", rihs01="RIHS01_" + "0" * 64)
        writer.write(conn, 1, b"\x00\x01\x00\x00\x07")
    assert replay_main([str(tmp_path / "bag")]) == 1
    err = capsys.readouterr().err
    assert "acme_msgs/msg/Gizmo (topic 'gizmo') is unknown to rclpy" in err
    assert replay_main([str(episode_bag), "--topics", "joint_states", "--wait-for", "instruction"]) == 1
    assert "--wait-for topics are not being replayed: ['instruction']" in capsys.readouterr().err
    assert replay_main([str(tmp_path / "nothing")]) == 1
    assert "no such bag" in capsys.readouterr().err
    (tmp_path / "report.json").write_text("{}")
    assert replay_main([str(episode_bag), "--schedule-report", str(tmp_path / "report.json")]) == 1
    assert "report.json: output already exists; refusing to overwrite" in capsys.readouterr().err
    assert (tmp_path / "report.json").read_text() == "{}"
    for bad in (["--rate", "nan"], ["--rate", "0"], ["--clock-hz", "inf"]):
        assert replay_main([str(episode_bag), *bad]) == 1
        assert "--rate and --clock-hz must be positive finite numbers" in capsys.readouterr().err
    for bad in ("-1", "nan", "inf"):
        assert replay_main([str(episode_bag), "--ack-timeout", bad]) == 1
        assert "--ack-timeout must be a finite number of seconds, 0 or more" in capsys.readouterr().err
