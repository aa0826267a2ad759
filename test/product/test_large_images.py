"""Raw VGA camera frames between processes: lost with Fast DDS defaults here, delivered with the shipped profile.

ALOHA cameras are 640x480 rgb8 (900 KB a frame), larger than Fast DDS's default shared-memory segment; the
profile in config/fastdds_large_images.xml is what the README tells users to set for such cameras.
"""

import textwrap
from pathlib import Path

from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image

from ros_test_utils import spin_until, start_python, stop_process

PROFILE = Path(__file__).resolve().parents[2] / "config" / "fastdds_large_images.xml"
FRAMES = 60

PUBLISHER = textwrap.dedent(f"""
    import time
    import rclpy
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image

    rclpy.init()
    node = rclpy.create_node("vga_camera")
    publisher = node.create_publisher(Image, "camera/cam_high/image_raw", qos_profile_sensor_data)
    while publisher.get_subscription_count() == 0:
        time.sleep(0.05)
    time.sleep(0.5)
    data = bytes(640 * 480 * 3)
    for i in range({FRAMES}):
        msg = Image(height=480, width=640, encoding="rgb8", step=640 * 3, data=data)
        msg.header.frame_id = str(i)
        publisher.publish(msg)
        time.sleep(1 / 30)
    time.sleep(0.5)
    node.destroy_node()
    rclpy.shutdown()
""")


def test_vga_frames_arrive_with_the_shipped_fast_dds_profile(tmp_path, monkeypatch, ros_domain_id, ros_env):
    import rclpy

    for name in ("FASTDDS_DEFAULT_PROFILES_FILE", "FASTRTPS_DEFAULT_PROFILES_FILE"):
        monkeypatch.setenv(name, str(PROFILE))
        ros_env[name] = str(PROFILE)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=ros_domain_id)  # after the variables: the participant reads them
    node = rclpy.create_node("vga_reader", context=context)
    received = []
    node.create_subscription(Image, "camera/cam_high/image_raw", lambda m: received.append(m.header.frame_id),
                             qos_profile_sensor_data)
    camera = start_python(PUBLISHER, ros_env)
    try:
        spin_until(node, lambda: camera.poll() is not None, timeout=60)
        spin_until(node, lambda: False, timeout=0.3)
    finally:
        assert stop_process(camera) == 0, camera.stdout.read()
        node.destroy_node()
        context.try_shutdown()
        context.destroy()
    # Best effort: a reader that a busy machine slows down loses some frames (load is not the point here); with
    # Fast DDS defaults none arrives.
    assert len(received) >= 0.5 * FRAMES, f"{len(received)} of {FRAMES} VGA frames arrived"
    assert len(set(received)) == len(received)
