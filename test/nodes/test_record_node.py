"""The recorder turns live topics (reliable, best effort, latched, our own Narration type) into a readable bag,
with each publisher's offered QoS, and replay turns recorded offers back into a profile every subscriber matches."""

import struct
import time

import numpy as np
from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rosbags.interfaces import QosDurability, QosReliability
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from test_replay_node import Child

from oxygen_ros.data import bag_topics, read_messages
from oxygen_ros.data.episode_bag import LATCHED_QOS, SENSOR_QOS, STATE_QOS
from oxygen_ros.data.mcap_chunks import CRC_AT, chunks
from oxygen_ros.msg import Narration
from oxygen_ros.nodes.bag_qos import offered_profile, replay_profile


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_recorder_writes_every_topic_with_types_and_definitions(ros_context, ros_env, tmp_path):
    import rclpy

    node = rclpy.create_node("publisher", context=ros_context)
    latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    pubs = {
        "joint_states": node.create_publisher(JointState, "joint_states", 10),
        "camera/top/image_raw": node.create_publisher(Image, "camera/top/image_raw", qos_profile_sensor_data),
        "vla/narration": node.create_publisher(Narration, "vla/narration", 10),
        "instruction": node.create_publisher(String, "instruction", latched),
    }
    pubs["instruction"].publish(String(data="stack the cups"))  # before the recorder exists: latched
    out = tmp_path / "rec"
    child = Child(["-m", "oxygen_ros.nodes.record_node", str(out), "--topics", *pubs], ros_env)  # MCAP
    try:
        assert wait_until(lambda: all(p.get_subscription_count() > 0 for p in pubs.values()), timeout=20)
        # Matched both ways: a volatile reader drops what a writer sent before the reader had matched it.
        assert child.wait_for_lines([f"hearing /{topic} from 1" for topic in pubs], timeout=20), child.lines
        child.note_shm()
        for i in range(20):
            pubs["joint_states"].publish(JointState(name=["a", "b"], position=[float(i), -float(i)]))
            image = Image(height=4, width=6, encoding="rgb8", step=18, data=bytes([i]) * 72)
            pubs["camera/top/image_raw"].publish(image)
            text = Narration(request_id=7, text="the cup " * (i + 1), num_tokens=2 * (i + 1), final=i == 19)
            text.header.stamp.sec = 100 + i
            pubs["vla/narration"].publish(text)
            time.sleep(0.01)
        for topic in ("joint_states", "vla/narration"):  # reliable: the recorder holds every message
            assert pubs[topic].wait_for_all_acked(Duration(seconds=30)), topic
        rc, output = child.stop()
    finally:
        child.stop()
        node.destroy_node()
    assert rc == 0, output
    assert not [p for p in tmp_path.iterdir() if p.name != "rec"]  # no staging folder left
    (mcap,) = out.glob("*.mcap")
    with open(mcap, "rb") as file:  # every chunk sealed with its CRC-32 (0 means "not set")
        found = list(chunks(file))
        for offset, _ in found:
            file.seek(offset + CRC_AT)
            assert struct.unpack("<I", file.read(4))[0] != 0
    assert found

    infos = {t.name: t for t in bag_topics(out)}
    topics = {name: (t.msgtype, t.count) for name, t in infos.items()}
    offered = {name: [(q.reliability, q.durability) for q in t.qos] for name, t in infos.items()}
    assert offered == {  # each publisher's offer, as discovery reports it (so a replay keeps it)
        "/joint_states": [(QosReliability.RELIABLE, QosDurability.VOLATILE)],
        "/camera/top/image_raw": [(QosReliability.BEST_EFFORT, QosDurability.VOLATILE)],
        "/vla/narration": [(QosReliability.RELIABLE, QosDurability.VOLATILE)],
        "/instruction": [(QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL)],
    }
    assert topics["/joint_states"] == ("sensor_msgs/msg/JointState", 20)
    assert topics["/vla/narration"] == ("oxygen_ros/msg/Narration", 20)
    assert topics["/instruction"] == ("std_msgs/msg/String", 1)
    assert topics["/camera/top/image_raw"][0] == "sensor_msgs/msg/Image"
    assert topics["/camera/top/image_raw"][1] >= 18  # best effort on a busy machine

    by_topic: dict[str, list] = {}
    for raw, msg in read_messages(out):
        by_topic.setdefault(raw.topic, []).append((raw.log_time_ns, msg))
    joints = by_topic["/joint_states"]
    assert [list(m.position) for _, m in joints] == [[float(i), -float(i)] for i in range(20)]
    assert [t for t, _ in joints] == sorted(t for t, _ in joints)
    narration = [m for _, m in by_topic["/vla/narration"]]
    assert [m.num_tokens for m in narration] == [2 * (i + 1) for i in range(20)]
    assert narration[-1].final and narration[-1].header.stamp.sec == 119 and narration[3].text == "the cup " * 4
    assert by_topic["/instruction"][0][1].data == "stack the cups"
    frames = [m for _, m in by_topic["/camera/top/image_raw"]]
    assert all(np.all(m.data == m.data[0]) and m.width == 6 for m in frames)


def test_replay_profile_matches_every_recorded_publisher():
    """Recorded offers (as discovery reports them: history unknown, depth 0) -> the profile replay publishes with."""
    discovered = [offered_profile(p) for p in (
        QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL), qos_profile_sensor_data)]
    discovered = [q._replace(history=type(q.history).UNKNOWN, depth=0) for q in discovered]
    latched, sensor = (replay_profile([q]) for q in discovered)
    assert (latched.durability, latched.reliability, latched.depth) == (
        DurabilityPolicy.TRANSIENT_LOCAL, ReliabilityPolicy.RELIABLE, 1)  # the last value reaches late subscribers
    assert (sensor.durability, sensor.reliability, sensor.depth) == (
        DurabilityPolicy.VOLATILE, ReliabilityPolicy.BEST_EFFORT, 100)
    mixed = replay_profile([STATE_QOS, SENSOR_QOS, LATCHED_QOS])  # one best-effort or volatile offer decides
    assert (mixed.reliability, mixed.durability, mixed.depth, mixed.history) == (
        ReliabilityPolicy.BEST_EFFORT, DurabilityPolicy.VOLATILE, 100, HistoryPolicy.KEEP_LAST)
    assert replay_profile([LATCHED_QOS, LATCHED_QOS._replace(depth=3)]).depth == 3
