"""The VLA node with `config/droid.yaml` (embodiment droid) on a tiny checkpoint, over real DDS: what it publishes is
the model's raw output (DROID's normalized joint velocities: 0.2 x v rad per 1/15 s step) summed from the frame's
state, the velocities in rad/s in `velocities`. The raw output is recomputed here with the engine's own runtime, the same checkpoint,
inputs and noise seed, and asked of `oxygen-ros serve` on the same checkpoint and parameter file through the real
`openpi-client` with DROID's observation keys: its replies are the model's numbers the node turned into steps. The arm also
goes to a velocity controller (std_msgs/Float64MultiArray, one velocity per joint each tick) and the gripper to a
trajectory controller; at exit each gets its hold. The shipped file starts disarmed: the node stays unconfigured,
commanding nothing, until the test configures and activates it."""

import time
from pathlib import Path

import numpy as np
import rclpy
import torch
from lifecycle_msgs.msg import Transition
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from serve_process import ServeProcess
from std_msgs.msg import Float64MultiArray
from test_replay_node import Child
from test_vla_node_ros import STARTUP_TIMEOUT_S, Spinner, wait_until
from test_vla_node_safety import Lifecycle
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.control.trajectory_rules import ControllerSettings
from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.engine.runtime import Runtime, RuntimeConfig, Served
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.model.checkpoint import save_checkpoint
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.loading import load_model_source
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.preprocess import Observation
from oxygen_ros.model.tokenizer import load_tokenizer, train_tokenizer
from oxygen_ros.nodes.conversions import trajectory_refusal
from oxygen_ros.nodes.latency_probe import SensorPublisher

DROID = Path(__file__).resolve().parents[2] / "config" / "droid.yaml"
CAMERAS = ["camera/exterior_image_1_left/image_raw", "camera/wrist_image_left/image_raw"]
JOINTS = [f"panda_joint{i}" for i in range(1, 8)] + ["gripper"]
STEP = 1 / 15  # pi05_droid's control period


def raw_chunks(folder: Path, tokenizer: Path, images: list[np.ndarray], state: np.ndarray, count: int) -> list:
    """The node's first `count` model outputs (unnormalized, 8 dims) for this observation: noise draws in order."""
    loaded = load_model_source(str(folder), "cpu", dtype=torch.float32)
    runtime = Runtime(Served(loaded.model, load_tokenizer(tokenizer), loaded.norm_stats),
                      RuntimeConfig(scheduler=SchedulerConfig(num_steps=10), seed=0))
    observation = Observation(images={"base_0_rgb": images[0], "left_wrist_0_rgb": images[1]}, state=state, task="")
    chunks = []
    for _ in range(count):
        chunk = runtime.act(runtime.frame(runtime.prepare(observation), False))
        chunks.append(runtime.robot_actions(chunk, len(JOINTS)))
    runtime.close()
    return chunks


def served_chunks(port: int, images: list[np.ndarray], state: np.ndarray, count: int) -> tuple[dict, list]:
    """The server's metadata and its replies for the same observation, sent as DROID's robot laptop sends it,
    with the noise of the node's first `count` draws (a runtime seeded 0)."""
    policy = WebsocketClientPolicy("127.0.0.1", port)
    generator = torch.Generator().manual_seed(0)
    replies = []
    for _ in range(count):
        noise = torch.randn(1, 8, 16, generator=generator)[0].numpy()  # the tiny preset's horizon x action dims
        obs = {"observation/exterior_image_1_left": images[0], "observation/wrist_image_left": images[1],
               "observation/joint_position": state[:7], "observation/gripper_position": state[7],  # a scalar
               "prompt": "", "noise": noise}
        replies.append(policy.infer(obs)["actions"])
    metadata = policy.get_server_metadata()
    policy._ws.close()
    return metadata, replies


def droid_velocities(raw: np.ndarray) -> np.ndarray:
    """DROID's meaning of the model's 7 joint numbers, worked here apart from the profile: clipped to [-1, 1] (the
    shipped profile's filter), the vector divided by max |v| past 1, 0.2 rad per 1/15 s step: rad/s."""
    v = np.clip(raw[:, :7], -1.0, 1.0)
    v = v / np.maximum(np.abs(v).max(axis=1, keepdims=True), 1.0)
    return 0.2 * v / STEP


def test_droid_velocities_are_integrated_from_the_frame_state(ros_context, ros_env, tmp_path):
    config = get_preset("tiny")
    stats = {"observation.state": {"q01": -np.ones(8), "q99": np.ones(8)},
             "action": {"q01": -0.5 * np.ones(8), "q99": 0.5 * np.ones(8)}}
    folder = save_checkpoint(build_model(config, seed=3), tmp_path / "droid_tiny", stats, embodiment="droid")
    tokenizer = train_tokenizer(tmp_path / "tok.model", config.vocab_size)
    robot = rclpy.create_node("droid_side", context=ros_context)
    sensors = SensorPublisher(robot, CAMERAS, JOINTS)
    heard: list[JointTrajectory] = []
    robot.create_subscription(JointTrajectory, "action_chunk", heard.append, 100)
    arm: list[Float64MultiArray] = []
    hand: list[JointTrajectory] = []
    robot.create_subscription(Float64MultiArray, "arm_controller/commands", arm.append, 100)
    robot.create_subscription(JointTrajectory, "hand_controller/joint_trajectory", hand.append, 100)
    spinner = Spinner(ros_context, [robot])
    server = ServeProcess("--checkpoint", str(folder), "--tokenizer", str(tokenizer), "--params-file", str(DROID),
                          "-p", "model.dtype=float32", "-p", "model.cpu_kernel=off", "-p", "model.cpu_threads=1",
                          env=dict(ros_env, XDG_CACHE_HOME=str(tmp_path)))
    child = Child(["-m", "oxygen_ros.nodes.vla_node", "--ros-args", "--params-file", str(DROID),
                   "-p", f"model.checkpoint:={folder}", "-p", f"model.tokenizer:={tokenizer}",
                   "-p", "model.dtype:=float32", "-p", "model.cpu_kernel:=off", "-p", "model.cpu_threads:=1",
                   "-p", "control.rate_hz:=5.0", "-p", "control.horizon:=8", "-p", "language.policy:=off",
                   "-p", "output.groups:=[arm,hand]", "-p", f"output.arm.joints:={JOINTS[:7]}",
                   "-p", "output.arm.interface:=velocity", "-p", "output.hand.joints:=[gripper]"],
                  dict(ros_env, XDG_CACHE_HOME=str(tmp_path)))
    try:
        def enough() -> bool:
            sensors.publish_frame()
            time.sleep(1 / 20)
            return len(heard) >= 3 and len(arm) >= 3

        # config/droid.yaml starts disarmed: unconfigured, nothing commanded while frames flow, until activated
        lifecycle = Lifecycle(robot)
        assert wait_until(lifecycle.get.service_is_ready, STARTUP_TIMEOUT_S, child), child.stop()[1]
        assert lifecycle.state() == "unconfigured"
        for _ in range(40):
            sensors.publish_frame()
            time.sleep(1 / 20)
        assert (heard, arm, hand) == ([], [], []) and lifecycle.state() == "unconfigured"
        assert lifecycle.transition(Transition.TRANSITION_CONFIGURE), child.stop()[1]
        assert lifecycle.transition(Transition.TRANSITION_ACTIVATE), child.stop()[1]
        assert wait_until(enough, STARTUP_TIMEOUT_S, child), child.stop()[1]
        rc, output = child.stop()
        # the holds of the exit: zero velocities for the arm, the gripper held where it was measured
        assert wait_until(lambda: arm and not any(arm[-1].data) and hand and len(hand[-1].points) == 1, 10), arm[-1:]
        metadata, replies = served_chunks(server.wait_ready(), sensors.images, np.linspace(-0.5, 0.5, 8),
                                          len(heard) + 10)
    finally:
        child.stop()
        server.stop()
        spinner.close([robot])
    assert rc == 0, output
    assert metadata["embodiment"] == "droid" and metadata["action_dim"] == 8
    assert "embodiment droid" in output and "horizon 8 x 0.0666667 s" in output
    assert "arm -> /arm_controller/commands" in output and "(hold zero)" in output

    state = np.linspace(-0.5, 0.5, len(JOINTS))  # what SensorPublisher sends, every frame
    chunks = [(np.array([p.positions for p in m.points]), np.array([p.velocities for p in m.points])) for m in heard]
    raws = raw_chunks(folder, tokenizer, sensors.images, state, len(chunks) + 10)
    draw, commanded = 0, []
    for msg, (positions, velocities) in zip(heard, chunks, strict=True):
        assert list(msg.joint_names) == JOINTS and positions.shape == velocities.shape == (8, 8)
        offsets = [stamp_to_ns(p.time_from_start) for p in msg.points]
        assert offsets == [round(STEP * 1e9) * (i + 1) for i in range(8)]
        # each chunk is one of the node's model outputs, in order (the first may go out before DDS matched)
        assert not velocities[-1].any()  # the plan ends at rest, as the controller requires
        while not np.allclose(velocities[:-1, :7], droid_velocities(raws[draw])[:-1], atol=1e-4):
            draw += 1
            assert draw < len(raws), (velocities, raws[0])
        raw = raws[draw]
        commanded.append(droid_velocities(raw))
        steps = droid_velocities(raw) * STEP  # rad per 1/15 s step
        np.testing.assert_allclose(positions[:, :7], state[:7] + np.cumsum(steps, axis=0), atol=1e-4)
        np.testing.assert_allclose(positions[:, 7], np.clip(raw[:, 7], -1, 1), atol=1e-4)  # the gripper: a position
        assert np.abs(raw[:, :7]).max() > 0.05 and not np.allclose(positions[:, :7], raw[:, :7], atol=1e-2)
        # the server returns what openpi's DroidOutputs does: the model's normalized velocities (and the gripper)
        served = replies[draw]
        assert served.shape == (8, 8) and np.isfinite(served).all()
        np.testing.assert_allclose(served[:, :7], raw[:, :7], atol=1e-4)
        np.testing.assert_allclose(served[:, 7], raw[:, 7], atol=1e-4)
        draw += 1
    # each velocity command is a point of a published plan (the step executing when it went out), arm joints only
    rows = np.concatenate(commanded)
    for command in (c for c in arm if any(c.data)):  # (all zeros: a hold, at exit or when a frame went stale)
        assert len(command.data) == 7 and np.abs(rows - np.array(command.data)).max(axis=1).min() < 1e-9, command
    np.testing.assert_allclose(hand[-1].points[0].positions, [state[7]])  # the measured gripper position
    assert all(list(m.joint_names) == ["gripper"] for m in hand)
    # a joint_trajectory_controller with Jazzy's and Kilted's defaults takes every one of them (the plans end at
    # rest); arrival in time is this machine's speed, not checked here (now 0)
    for joints, messages in ((JOINTS, heard), (["gripper"], hand)):
        for msg in messages:
            assert trajectory_refusal(msg, ControllerSettings(tuple(joints)), 0) is None
