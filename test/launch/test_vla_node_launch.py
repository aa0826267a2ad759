"""launch_testing test of the installed vla_node, for `colcon test` on a ROS 2 install (Jazzy or Kilted).

The node starts as `ros2 launch` would start it (installed executable, installed config/aloha.yaml plus overrides
for the tiny test preset, which has two cameras); a publisher in this test feeds it camera images and joint states
until an action chunk arrives; after shutdown (SIGINT from launch) the node must have exited with code 0.
pytest runs the same checks without launch_testing in test/nodes/test_vla_node_ros.py.
"""

import os
import time
import unittest

import launch
import launch_testing
import launch_testing.actions
import launch_testing.asserts
import pytest
import rclpy
from ament_index_python.packages import get_package_share_directory
from launch_ros.actions import Node
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.data.episode import ALOHA_JOINT_NAMES
from oxygen_ros.nodes.latency_probe import SensorPublisher

CAMERAS = ["camera/cam_high/image_raw", "camera/cam_left_wrist/image_raw"]
HORIZON = 6


@pytest.mark.launch_test
def generate_test_description():
    params_file = os.path.join(get_package_share_directory("oxygen_ros"), "config", "aloha.yaml")
    vla = Node(
        package="oxygen_ros",
        executable="vla_node",
        parameters=[params_file, {
            "autostart": True,  # the installed file starts disarmed; this test drives a test robot at once
            "model.preset": "tiny",
            "cameras.topics": CAMERAS,
            "cameras.keys": ["base_0_rgb", "left_wrist_0_rgb"],
            "cameras.compressed": [False, False],
            "control.rate_hz": 10.0,
            "control.horizon": HORIZON,
        }],
        output="screen",
    )
    return launch.LaunchDescription([vla, launch_testing.actions.ReadyToTest()]), {"vla": vla}


class TestActionChunks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rclpy.init()

    @classmethod
    def tearDownClass(cls):
        rclpy.shutdown()

    def test_action_chunk_arrives_for_published_frames(self, vla):
        node = rclpy.create_node("vla_node_launch_test")
        sensors = SensorPublisher(node, CAMERAS, ALOHA_JOINT_NAMES)
        chunks = []
        node.create_subscription(JointTrajectory, "action_chunk", chunks.append, 10)
        try:
            deadline = time.monotonic() + 120.0  # the node loads torch and builds the model first
            while not chunks and time.monotonic() < deadline:
                sensors.publish_frame()
                rclpy.spin_once(node, timeout_sec=0.05)
        finally:
            node.destroy_node()
        self.assertTrue(chunks, "no action_chunk within 120 s")
        chunk = chunks[0]
        self.assertEqual(list(chunk.joint_names), list(ALOHA_JOINT_NAMES))
        self.assertEqual(len(chunk.points), HORIZON)
        stamp = chunk.header.stamp.sec * 1_000_000_000 + chunk.header.stamp.nanosec
        self.assertIn(stamp, sensors.stamps)


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    def test_vla_node_exits_cleanly(self, proc_info, vla):
        launch_testing.asserts.assertExitCodes(proc_info, [launch_testing.asserts.EXIT_OK], vla)
