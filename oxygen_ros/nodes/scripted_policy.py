"""`scripted_policy`: the scripted `transfer_cube` plan (oxygen_ros/sim/scripted.py) as a policy node.

It speaks the VLA node's topics: for every frame on `camera/<camera>/image_raw` it publishes `action_chunk`, the
plan's next `horizon` joint targets from that frame's sim step (header.stamp = the frame's stamp, target k of
step s + k as the position for s + k + 1, one `control.time_step` apart, as `vla_node` times its points), so `sim_node` executes the plan in closed loop. Parameters: `seed` (the sim's episode
seed: the plan grasps the cube where that seed puts it), `camera`, `horizon`. After the plan ends the last targets
are held. Run it on sim time (`use_sim_time:=true`); `oxygen-ros sim-demo --policy scripted` does.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("scripted_policy"))

from collections.abc import Sequence

import numpy as np
from rclpy.node import Node
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import Image
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.data.episode import ALOHA_JOINT_NAMES
from oxygen_ros.data.stamps import split_ns, stamp_to_ns
from oxygen_ros.nodes.lifecycle import ros_process, spinning
from oxygen_ros.sim.aloha_env import DT
from oxygen_ros.sim.scripted import transfer_cube_lift_plan

STEP_NS = int(round(DT * 1e9))


class ScriptedPolicy(Node):
    def __init__(self, context=None):
        super().__init__("scripted_policy", context=context)
        seed = self.declare_parameter("seed", 0).value
        camera = self.declare_parameter("camera", "top").value
        self.horizon = int(self.declare_parameter("horizon", 20).value)
        if self.horizon < 1:
            raise ValueError(f"horizon must be at least 1, got {self.horizon}")
        self.plan = transfer_cube_lift_plan(int(seed))
        self.pub = self.create_publisher(JointTrajectory, "action_chunk", QoSProfile(depth=10))
        self.create_subscription(Image, f"camera/{camera}/image_raw", self._on_image, qos_profile_sensor_data)
        self.get_logger().info(f"scripted transfer_cube plan for seed {seed}: {len(self.plan)} steps, "
                               f"chunks of {self.horizon} on camera/{camera}/image_raw")

    def _on_image(self, msg: Image) -> None:
        step = stamp_to_ns(msg.header.stamp) // STEP_NS
        rows = np.minimum(np.arange(step, step + self.horizon), len(self.plan) - 1)
        chunk = JointTrajectory(joint_names=list(ALOHA_JOINT_NAMES))
        chunk.header.stamp = msg.header.stamp
        for i, row in enumerate(self.plan[rows]):
            point = JointTrajectoryPoint(positions=row.tolist())
            point.time_from_start.sec, point.time_from_start.nanosec = split_ns((i + 1) * STEP_NS)
            chunk.points.append(point)
        self.pub.publish(chunk)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with ros_process("scripted_policy", argv) as (context, stop):
        try:
            node = ScriptedPolicy(context=context)
        except (ValueError, ImportError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        with spinning(node, stop):
            stop.wait()
        return 0

