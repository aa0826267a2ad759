"""Run a gym-aloha task as a robot on ROS 2: cameras and joint states out, action chunks in, on sim time.

Each control step (50 Hz of sim time, paced to the wall clock at `rate_hz`):
  1. publish /clock (sim time of the current frame), `camera/<cam>/image_raw` (rgb8, sensor-data QoS) and
     `joint_states` (the 14 ALOHA joints), all stamped with that sim time;
  2. wait for the step's tick; chunks that arrive meanwhile are handed to the chunk executor;
  3. take the executor's command for this step (time-aligned to each chunk's source stamp, blended across chunks),
     record it with the frame, and step the physics.

`action_chunk` is a trajectory_msgs/JointTrajectory: header.stamp = the camera stamp the chunk was computed from,
point i the joints' position at header.stamp + points[i].time_from_start (a joint_trajectory_controller's reading,
and `vla_node`'s: a chunk's action i at (i + 1) steps after its frame), so the sim commands point i at the step
before that time, the physics step that reaches it; joint_names mapped to the sim joints by name. A chunk
that names other joints, has ragged points or non-uniform timing is rejected (counted, with a throttled warning).
Commands violent enough to make the physics diverge (MuJoCo's invalid-state warnings: random weights do this)
end the episode as a failure, with an error line and a count (`diverged_episodes`); the sim resets and goes on.
With `stamps: wall` (several sims served by one fleet node, which runs on the system clock) frames are stamped
with the system clock when taken and no /clock is sent; a chunk's stamp is mapped back to the sim time of the
frame it names (a stamp that names no recent frame is rejected), so the chunk executor still works in sim time.
`inject_delay_steps: d` injects an inference delay of d steps where the policy can measure it: each frame (camera
images and joint state, stamped with the step they were taken at) is published d steps later, so a chunk computed
from it takes effect d steps plus the policy's own latency after its frame, and a policy that measures its delay
from the frame's stamp to its chunk on its clock (`vla_node`, `fleet_node`: real-time chunking's delay) sees it
whole; the first d steps of an episode publish no frame (the robot holds its start pose).
`policy_reset: <service>` (e.g. `/vla_node/reset`, std_srvs/Trigger) tells the policy that an episode starts: the sim
calls it after each reset of the scene and before the episode's first frame goes out, and waits for the answer (up
to `policy_reset_timeout_s`; a call that fails or times out is logged and counted in `policy_resets_failed`, and
the episode goes on). The policy then forgets the previous episode's chunks and frames (`vla_node`'s `~/reset`).
`instruction` (std_msgs/String, latched) carries the task text; `sim/status` (std_msgs/String, JSON) reports the
achieved rate, chunk latency in sim steps, switch discontinuity and jerk about once a second.

Stepping runs on the main thread (the renderer's GL context lives there) and publishes from it, which is safe;
the subscription is served by a SingleThreadedExecutor on a second thread. SIGINT/SIGTERM stop the loop, write
the episode being recorded (if any) and exit 0.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("sim_node"))

import json
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np
from rclpy.exceptions import ParameterUninitializedException
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.control.chunk_executor import BLENDING_MODES, ChunkExecutor
from oxygen_ros.data.episode import ALOHA_JOINT_NAMES
from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.nodes.conversions import ns_to_stamp
from oxygen_ros.nodes.lifecycle import ros_process, spinning
from oxygen_ros.nodes.qos import LATCHED_QOS
from oxygen_ros.sim.aloha_env import DT, MAX_EPISODE_STEPS, REWARD_STAGES, AlohaSimEnv, SimulationDiverged
from oxygen_ros.sim.recording import EpisodeRecorder, next_episode_path

STEP_NS = round(DT * 1e9)
MAX_LEAD_S = 1.0  # a chunk stamped further ahead of sim time than this is not on sim time at all
STAMP_MODES = ("sim", "wall")
RECENT_FRAMES = 500  # wall stamps remembered for mapping chunks back to sim time (10 s at 50 Hz)


def chunk_from_msg(msg: JointTrajectory, joint_names: Sequence[str] = ALOHA_JOINT_NAMES
                   ) -> tuple[np.ndarray, float, float, float]:
    """(actions [H, 14] in `joint_names` order, the time of the step that commands point 0 in seconds (one step
    before the point's own time, which the physics step reaches), time step, header stamp in seconds: the camera
    frame it was computed from) or ValueError why not."""
    names = list(msg.joint_names)
    if sorted(names) != sorted(joint_names):
        missing = sorted(set(joint_names) - set(names))
        extra = sorted(set(names) - set(joint_names))
        raise ValueError(f"joint_names do not match the sim's joints (missing {missing}, unknown {extra})")
    if not msg.points:
        raise ValueError("no points")
    if any(len(p.positions) != len(names) for p in msg.points):
        raise ValueError(f"every point needs {len(names)} positions")
    order = [names.index(j) for j in joint_names]
    actions = np.array([p.positions for p in msg.points], dtype=np.float64)[:, order]
    offsets = np.array([stamp_to_ns(p.time_from_start) * 1e-9 for p in msg.points])
    time_step = DT
    if len(offsets) > 1:
        gaps = np.diff(offsets)
        time_step = float(gaps[0])
        if time_step <= 0 or np.abs(gaps - time_step).max() > 1e-6:
            raise ValueError("points must be evenly spaced in time_from_start")
    frame_stamp = stamp_to_ns(msg.header.stamp) * 1e-9
    return actions, float(frame_stamp + offsets[0] - DT), time_step, float(frame_stamp)


def image_msg(frame: np.ndarray, camera: str, stamp_ns: int) -> Image:
    msg = Image()
    msg.header.stamp = ns_to_stamp(stamp_ns)
    msg.header.frame_id = camera
    msg.height, msg.width = frame.shape[:2]
    msg.encoding = "rgb8"
    msg.step = frame.shape[1] * 3
    msg.data = frame.tobytes()
    return msg


class SimNode(Node):
    """Parameters, publishers and the chunk subscription; `run(stop)` is the stepping loop."""

    def __init__(self, context=None):
        super().__init__("sim", context=context)
        p = {name: self.declare_parameter(name, default).value for name, default in (
            ("task", "transfer_cube"), ("instruction", ""), ("blending", "newest_wins"), ("temporal_ensemble_m", 0.01),
            ("rtc_overlap", 0), ("cameras", ["top", "left_wrist", "right_wrist"]), ("image_height", 240),
            ("image_width", 320), ("seed", 0), ("rate_hz", 50.0), ("episode_steps", MAX_EPISODE_STEPS),
            ("max_episodes", 0), ("record_path", ""), ("record_compress", False), ("wait_for_policy", False),
            ("status_period_s", 1.0), ("stamps", "sim"), ("inject_delay_steps", 0),
            ("policy_reset", ""), ("policy_reset_timeout_s", 10.0))}
        # Episode k's seed: seeds[k] when the list is given (an evaluation's held-out seeds), else seed + k.
        self.declare_parameter("seeds", Parameter.Type.INTEGER_ARRAY)
        try:
            p["seeds"] = [int(s) for s in self.get_parameter("seeds").value]
        except ParameterUninitializedException:
            p["seeds"] = []
        if p["blending"] not in BLENDING_MODES:
            raise ValueError(f"blending must be one of {BLENDING_MODES}, got {p['blending']!r}")
        if p["seeds"]:
            p["max_episodes"] = p["max_episodes"] or len(p["seeds"])
            if p["max_episodes"] > len(p["seeds"]):
                raise ValueError(f"max_episodes {p['max_episodes']} is more than the {len(p['seeds'])} seeds given")
        if p["inject_delay_steps"] < 0:
            raise ValueError(f"inject_delay_steps must be >= 0, got {p['inject_delay_steps']}")
        if p["stamps"] not in STAMP_MODES:
            raise ValueError(f"stamps must be one of {STAMP_MODES}, got {p['stamps']!r}")
        self.params = p
        self.env = AlohaSimEnv(p["task"], cameras=list(p["cameras"]), height=p["image_height"],
                               width=p["image_width"], max_steps=p["episode_steps"])
        self.instruction = p["instruction"] or self.env.instruction
        self.chunks = ChunkExecutor(len(ALOHA_JOINT_NAMES), DT, mode=p["blending"],
                                    ensemble_m=p["temporal_ensemble_m"], rtc_overlap=p["rtc_overlap"])
        self.lock = threading.Lock()
        self.recorder = EpisodeRecorder(self.env.cameras, self.instruction) if p["record_path"] else None
        self.written: list[str] = []
        self.episode, self.successes, self.diverged_episodes = 0, 0, 0
        self.reward = 0.0
        self.episode_max_rewards: list[float] = []  # the highest reward stage of each ended episode
        self.episode_lengths: list[int] = []  # steps each ended episode ran (to its success, end or divergence)
        self.episode_seeds: list[int] = []  # the seed each episode was reset with
        self.episode_diverged: list[bool] = []  # whether each ended episode ended by diverging physics
        self.chunks_received, self.chunks_malformed = 0, 0
        self._ticks: deque[float] = deque(maxlen=101)
        self._step_ms: deque[float] = deque(maxlen=500)
        self._wall_steps: dict[int, int] = {}  # stamps: wall: a recent frame's stamp -> its step
        self._wall_order: deque[int] = deque()
        self._wall_latency_ms: deque[float] = deque(maxlen=500)  # stamps: wall: chunk receipt - its frame's stamp
        self._started = time.monotonic()
        self._held: deque[tuple[int, int, object]] = deque()  # inject_delay_steps: (step, stamp, observation) taken
        self.policy_resets, self.policy_resets_failed = 0, 0
        self._reset_client = self.create_client(Trigger, p["policy_reset"]) if p["policy_reset"] else None

        if p["stamps"] == "sim":
            self._clock_pub = self.create_publisher(Clock, "/clock", QoSProfile(depth=1))
        self._image_pubs = {cam: self.create_publisher(Image, f"camera/{cam}/image_raw", qos_profile_sensor_data)
                            for cam in self.env.cameras}
        self._joint_pub = self.create_publisher(JointState, "joint_states", QoSProfile(depth=10))
        self._instruction_pub = self.create_publisher(String, "instruction", LATCHED_QOS)
        self._status_pub = self.create_publisher(String, "sim/status", QoSProfile(depth=10))
        # Best effort matches both reliable and best-effort chunk publishers.
        self._chunk_sub = self.create_subscription(
            JointTrajectory, "action_chunk", self._on_chunk,
            QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))

    # -- chunks in -------------------------------------------------------------------------------------------
    def _on_chunk(self, msg: JointTrajectory) -> None:
        self.chunks_received += 1
        try:
            with self.lock:
                if self.params["stamps"] == "wall":
                    stamp_ns = stamp_to_ns(msg.header.stamp)
                    step = self._wall_steps.get(stamp_ns)
                    if step is None:
                        raise ValueError("stamped at no recent frame of this sim")
                    self._wall_latency_ms.append((self.get_clock().now().nanoseconds - stamp_ns) / 1e6)
                    msg.header.stamp = ns_to_stamp(step * STEP_NS)
            actions, stamp, time_step, frame_stamp = chunk_from_msg(msg)
            with self.lock:
                ahead = stamp - self.chunks.step * DT
                if ahead > MAX_LEAD_S:
                    raise ValueError(f"stamped {ahead:.2f} s ahead of sim time (is the policy on use_sim_time?)")
                arrival = self.chunks.add_chunk(actions, stamp, time_step, frame_stamp)
        except ValueError as err:
            self.chunks_malformed += 1
            self.get_logger().warning(f"rejected action chunk: {err} ({self.chunks_malformed} so far)",
                                      throttle_duration_sec=5.0)
            return
        if not arrival.accepted:
            self.get_logger().warning(f"dropped action chunk: {arrival.reason}", throttle_duration_sec=5.0)

    # -- observations out ------------------------------------------------------------------------------------
    def _observe(self, obs, step: int) -> None:
        """The frame taken at `step` is stamped now; /clock goes out, then every frame `inject_delay_steps` old."""
        if self.params["stamps"] == "wall":
            stamp_ns = self.get_clock().now().nanoseconds
            with self.lock:
                self._wall_steps[stamp_ns] = step
                self._wall_order.append(stamp_ns)
                if len(self._wall_order) > RECENT_FRAMES:
                    del self._wall_steps[self._wall_order.popleft()]
        else:
            stamp_ns = step * STEP_NS
            clock = Clock()
            clock.clock = ns_to_stamp(stamp_ns)
            self._clock_pub.publish(clock)
        self._held.append((step, stamp_ns, obs))
        while self._held and self._held[0][0] + self.params["inject_delay_steps"] <= step:
            self._publish_observation(*self._held.popleft()[1:])

    def _publish_observation(self, stamp_ns: int, obs) -> None:
        for cam, pub in self._image_pubs.items():
            pub.publish(image_msg(obs.images[cam], cam, stamp_ns))
        joints = JointState()
        joints.header.stamp = ns_to_stamp(stamp_ns)
        joints.name = list(ALOHA_JOINT_NAMES)
        joints.position = obs.qpos.tolist()
        joints.velocity = obs.qvel.tolist()
        self._joint_pub.publish(joints)

    def _publish_instruction(self) -> None:
        self._instruction_pub.publish(String(data=self.instruction))

    def status(self) -> dict:
        with self.lock:
            summary = self.chunks.stats.summary()
            step = self.chunks.step
            wall_latency = list(self._wall_latency_ms)
        ticks = list(self._ticks)
        rate = (len(ticks) - 1) / (ticks[-1] - ticks[0]) if len(ticks) > 1 and ticks[-1] > ticks[0] else 0.0
        step_ms = np.array(self._step_ms) if self._step_ms else np.zeros(1)
        return {
            "task": self.env.task, "blending": self.chunks.mode, "episode": self.episode, "step": step,
            "episode_step": self.env.steps, "sim_time": step * DT, "successes": self.successes,
            "diverged_episodes": self.diverged_episodes, "reward": self.reward,
            "episode_max_reward": self.env.episode_max_reward, "episode_max_rewards": list(self.episode_max_rewards),
            "episode_lengths": list(self.episode_lengths), "episode_seeds": list(self.episode_seeds),
            "episode_diverged": list(self.episode_diverged),
            "task_max_reward": self.env.max_reward, "reward_stages": list(REWARD_STAGES[self.env.task]),
            "target_rate_hz": self.params["rate_hz"], "achieved_rate_hz": rate,
            "step_ms_p50": float(np.median(step_ms)), "step_ms_max": float(step_ms.max()),
            "chunks_received": self.chunks_received, "chunks_malformed": self.chunks_malformed,
            "chunks_accepted": summary["chunks_accepted"], "chunks_rejected": summary["chunks_rejected"],
            "chunk_latency_steps": summary["latency_steps"], "switch_discontinuity": summary["switch_discontinuity"],
            "jerk_rms": summary["jerk_rms"], "jerk_max": summary["jerk_max"], "held_steps": summary["held_steps"],
            "episodes_written": list(self.written), "wall_s": time.monotonic() - self._started,
            "policy_resets": self.policy_resets, "policy_resets_failed": self.policy_resets_failed,
        } | ({"chunk_wall_latency_ms": {"median": float(np.median(wall_latency)), "max": max(wall_latency)}
              if wall_latency else None} if self.params["stamps"] == "wall" else {})

    def _publish_status(self) -> None:
        self._status_pub.publish(String(data=json.dumps(self.status())))

    # -- the loop --------------------------------------------------------------------------------------------
    def _wait_for_policy(self, stop: threading.Event) -> bool:
        """Block until something publishes chunks and subscribes to a camera (e.g. a model still loading)."""
        self.get_logger().info("waiting for a policy (an action_chunk publisher and a camera subscriber)")
        while not stop.is_set():
            if (self.count_publishers(self._chunk_sub.topic_name) > 0
                    and any(pub.get_subscription_count() > 0 for pub in self._image_pubs.values())):
                return True
            stop.wait(0.05)
        return False

    def _start_episode(self):
        seeds = self.params["seeds"]
        seed = seeds[self.episode] if seeds else self.params["seed"] + self.episode
        obs = self.env.reset(seed=seed)
        self.episode_seeds.append(seed)
        self._held.clear()  # frames of the episode that ended are never published
        with self.lock:
            self.chunks.reset(obs.qpos)
        self._reset_policy()
        self._publish_instruction()
        return obs

    def _reset_policy(self) -> None:
        """Tell the policy that an episode starts (`policy_reset`), and wait for its answer (the stepping thread;
        the answer comes through the spinning one)."""
        if self._reset_client is None:
            return
        timeout = self.params["policy_reset_timeout_s"]
        why = ""
        if not self._reset_client.wait_for_service(timeout_sec=timeout):
            why = "the service is not available"
        else:
            answered = threading.Event()
            future = self._reset_client.call_async(Trigger.Request())
            future.add_done_callback(lambda _: answered.set())
            if not answered.wait(timeout):
                why = f"no answer within {timeout:g} s"
            elif future.exception() is not None:
                why = f"{type(future.exception()).__name__}: {future.exception()}"
            elif not future.result().success:
                why = f"refused: {future.result().message}"
        if why:
            self.policy_resets_failed += 1
            self.get_logger().error(f"policy reset {self.params['policy_reset']} failed at episode {self.episode} "
                                    f"({why}; {self.policy_resets_failed} failed so far)")
        else:
            self.policy_resets += 1

    def _end_episode(self, success: bool, diverged: bool = False) -> None:
        self.episode_diverged.append(diverged)
        self.successes += int(success)
        self.episode_max_rewards.append(self.env.episode_max_reward)
        self.episode_lengths.append(self.env.steps)
        if self.recorder is not None and len(self.recorder):
            path = self.recorder.write(next_episode_path(self.params["record_path"]),
                                       compress=self.params["record_compress"], max_reward=self.env.max_reward)
            self.written.append(str(path))
            self.get_logger().info(f"wrote {path} ({len(self.recorder)} steps, success {success})")
            self.recorder.clear()
        self.episode += 1

    def run(self, stop: threading.Event) -> None:
        if self.params["wait_for_policy"] and not self._wait_for_policy(stop):
            return
        period = 1.0 / self.params["rate_hz"] if self.params["rate_hz"] > 0 else 0.0
        obs = self._start_episode()
        next_tick = next_status = self._started = time.monotonic()
        while not stop.is_set():
            self._observe(obs, self.chunks.step)
            if period:
                next_tick += period
                delay = next_tick - time.monotonic()
                if delay > 0:
                    if stop.wait(delay):
                        break
                elif delay < -period:  # fell behind by more than a step: carry on, do not burst to catch up
                    next_tick = time.monotonic()
            now = time.monotonic()
            self._ticks.append(now)
            with self.lock:
                command = self.chunks.next_command()
            if self.recorder is not None:
                self.recorder.add(obs.images, obs.qpos, obs.qvel, command)
            started = time.perf_counter()
            try:
                result = self.env.step(command)
            except SimulationDiverged as err:
                self.diverged_episodes += 1
                self.get_logger().error(f"{err}: episode {self.episode} ends as a failure and the sim resets "
                                        f"({self.diverged_episodes} diverged so far)")
                result = None
            self._step_ms.append((time.perf_counter() - started) * 1e3)
            self.reward = result.reward if result is not None else 0.0
            if self.recorder is not None:
                self.recorder.add_reward(self.reward)
            if result is None or result.success or result.truncated:
                self._end_episode(result is not None and result.success, diverged=result is None)
                if 0 < self.params["max_episodes"] <= self.episode:
                    break
                obs = self._start_episode()
            else:
                obs = result.observation
            if now >= next_status:
                self._publish_status()
                next_status = now + self.params["status_period_s"]
        if self.recorder is not None and len(self.recorder):
            self._end_episode(self.env.success)
        self._publish_status()

    def close(self) -> None:
        self.env.close()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with ros_process("sim_node", argv) as (context, stop):
        try:
            node = SimNode(context=context)
        except (ValueError, ImportError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        with spinning(node, before_destroy=node.close):
            p = node.params
            node.get_logger().info(
                f"sim {p['task']} ({node.instruction!r}), cameras {list(node.env.cameras)} at "
                f"{p['image_height']}x{p['image_width']}, blending {p['blending']}, rate {p['rate_hz']} Hz")
            node.run(stop)
            node.get_logger().info("sim summary: " + json.dumps(node.status()))
        return 0

