"""The package's own messages go over real DDS between processes, fields intact."""

import re
import textwrap
from pathlib import Path

from oxygen_ros.msg import EngineStatus, Narration

from ros_test_utils import spin_until, start_python, stop_process

PUBLISHER = textwrap.dedent("""
    import rclpy
    from rclpy.executors import ExternalShutdownException
    from oxygen_ros.msg import EngineStatus, Narration

    rclpy.init()
    node = rclpy.create_node("interface_test_publisher")
    narration_pub = node.create_publisher(Narration, "narration", 10)
    status_pub = node.create_publisher(EngineStatus, "engine_status", 10)

    def publish():
        narration = Narration()
        narration.header.stamp.sec = 1700000000
        narration.header.stamp.nanosec = 123456789
        narration.header.frame_id = "cam_high"
        narration.request_id = 2**40 + 7
        narration.text = "picking up the red cube \u2713"
        narration.num_tokens = 17
        narration.final = True
        narration_pub.publish(narration)
        status = EngineStatus()
        status.header.stamp = node.get_clock().now().to_msg()
        status.state = "running"
        status.action_rate_hz = 49.5
        status.action_latency_p50_ms = 12.25
        status.action_latency_p99_ms = 19.5
        status.actions_published = 1234
        status.deadline_misses = 3
        status.dropped_frames = 5
        status.language_tokens_per_s = 210.0
        status.active_language_requests = 6
        status.language_requests_dropped = 1
        status.kv_slots_used = 6
        status.kv_slots_total = 8
        status.kv_bytes_used = 3 * 2**30
        status.kv_bytes_total = 4 * 2**30
        status_pub.publish(status)

    node.create_timer(0.05, publish)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
""")


def test_custom_messages_cross_processes_intact(ros_context, ros_env):
    import rclpy

    publisher = start_python(PUBLISHER, ros_env)
    node = rclpy.create_node("interface_test_subscriber", context=ros_context)
    received: dict[str, object] = {}
    node.create_subscription(Narration, "narration", lambda m: received.setdefault("narration", m), 10)
    node.create_subscription(EngineStatus, "engine_status", lambda m: received.setdefault("status", m), 10)
    try:
        assert spin_until(node, lambda: len(received) == 2, timeout=20.0), "messages did not arrive over DDS"
    finally:
        node.destroy_node()
        assert stop_process(publisher) == 0, publisher.stdout.read()

    narration = received["narration"]
    assert (narration.header.stamp.sec, narration.header.stamp.nanosec) == (1700000000, 123456789)
    assert narration.header.frame_id == "cam_high"
    assert narration.request_id == 2**40 + 7
    assert narration.text == "picking up the red cube \u2713"
    assert narration.num_tokens == 17 and narration.final is True

    status = received["status"]
    assert status.state == "running"
    assert abs(status.action_rate_hz - 49.5) < 1e-6 and abs(status.action_latency_p50_ms - 12.25) < 1e-6
    assert abs(status.action_latency_p99_ms - 19.5) < 1e-6 and status.language_tokens_per_s == 210.0
    assert (status.actions_published, status.deadline_misses, status.dropped_frames) == (1234, 3, 5)
    assert (status.active_language_requests, status.language_requests_dropped) == (6, 1)
    assert (status.kv_slots_used, status.kv_slots_total) == (6, 8)
    assert (status.kv_bytes_used, status.kv_bytes_total) == (3 * 2**30, 4 * 2**30)


def test_engine_status_lists_every_state_the_node_reports():
    """msg/EngineStatus.msg names the states, docs/nodes.md says what each means: both have every state vla_node
    sets (the input rules', the clock check's, the limits', a failed configure's, the lifecycle's and a remote engine's), the message
    no other."""
    from oxygen_ros.nodes import clock_check, diagnostics, frame_inputs, vla_node
    from oxygen_ros.serving import client

    repo = Path(__file__).resolve().parents[2]
    definition = (repo / "msg" / "EngineStatus.msg").read_text()
    comment = definition[:definition.index("string state")]
    listed = re.findall(r'"([a-z_]+)"', comment[comment.index("# Why the node"):])
    reported = {frame_inputs.RUNNING, frame_inputs.WAITING_FOR_CAMERA, frame_inputs.WAITING_FOR_STATE,
                frame_inputs.FUTURE_FRAME, frame_inputs.STALE_FRAME, frame_inputs.STALE_STATE, frame_inputs.MODEL_ERROR,
                clock_check.CLOCK_MISMATCH, vla_node.LIMIT_REJECTED, diagnostics.CONFIGURE_FAILED,
                "unconfigured", "inactive", "finalized",  # the lifecycle's, set in VlaNode's transitions
                client.UNREACHABLE, client.REFUSED, client.BAD_REPLY, client.FENCED}  # with engine.remote
    assert sorted(listed) == sorted(reported)
    nodes = (repo / "docs" / "nodes.md").read_text()
    start = nodes.index("- `engine_status.state` says why")
    meanings = nodes[start:nodes.index("`dropped_frames` counts", start)]
    assert [name for name in listed if f"`{name}`" not in meanings] == []
