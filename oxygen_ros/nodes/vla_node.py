"""The VLA node: camera images + joint state + instruction in, action chunks and narration out, one prefill per tick.

`ros2 run oxygen_ros vla_node --ros-args --params-file config/aloha.yaml` (or `ros2 launch oxygen_ros
oxygen.launch.py`). Threads:

- the executor thread (a SingleThreadedExecutor) runs every callback: subscriptions only keep the newest message;
  the control timer at `control.rate_hz` builds the frame (`FrameInputs`), calls `Runtime.act` (one prefill,
  the action chunk, and - when this frame narrates - the hand-over of its KV slot to a language request) and
  publishes the chunk; the status timer publishes `engine_status` and `/diagnostics`;
- the runtime's language worker decodes narrations in batches between control ticks and publishes `narration`
  from its own thread through `on_text` (rclpy publishers are safe to use from a plain thread). The control tick
  never waits for language beyond the one decode step that may be in flight: the runtime runs with adaptive k,
  decoding only in the slack before the next tick (the runtime's `ControlGate` and scheduler).

A model error in a tick is logged (throttled), counted and reported as state `model_error`; the node keeps running.
SIGINT/SIGTERM: the executor stops, the runtime's worker is joined, the node destroyed, exit code 0.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence

import rclpy
import torch
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.exceptions import InvalidTopicNameException
from rclpy.node import Node
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.engine.runtime import Runtime, RuntimeConfig, Served, TextUpdate
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.engine.stats import percentile
from oxygen_ros.model.preprocess import Observation
from oxygen_ros.msg import EngineStatus, Narration

from .conversions import ConversionError, chunk_to_trajectory, ns_to_stamp
from .diagnostics import Health, diagnostic_array, engine_status
from .frame_inputs import MODEL_ERROR, WAITING_FOR_CAMERA, Frame, FrameInputs, Instruction
from .lifecycle import ros_process, spinning
from .model_setup import load_policy
from .parameters import ParameterError, declare_parameters, read_parameters
from .qos import LATCHED_QOS, SENSOR_QOS

NODE_NAME = "vla_node"
LOG_THROTTLE_S = 5.0


def _percentile_ms(samples: Sequence[float], q: float) -> float:
    return 1e3 * percentile(samples, q)


class VlaNode(Node):
    def __init__(self, context=None):
        super().__init__(NODE_NAME, context=context)
        try:
            self._setup()
        except BaseException:
            if hasattr(self, "runtime"):
                self.runtime.close()
            self.destroy_node()
            raise

    def _setup(self) -> None:
        self.params = p = read_parameters(declare_parameters(self))
        if p.cpu_threads:
            torch.set_num_threads(p.cpu_threads)
        self.policy = load_policy(p)
        config = self.policy.config
        self.horizon = p.horizon or config.action_horizon
        # adaptive k: text decodes only in the slack before the next tick (at most one narration's budget of
        # steps per period), so the control rate holds however long the text
        scheduler = SchedulerConfig(num_steps=p.denoise_steps or config.num_steps, control_period_s=p.period_s,
                                    deadline_margin_s=p.deadline_margin_s, max_new_tokens=p.max_new_tokens,
                                    adaptive_k=True, tokens_per_frame=p.max_new_tokens,
                                    admission=p.admission, temperature=p.temperature, seed=p.seed)
        runtime_config = RuntimeConfig(scheduler=scheduler, pool_slots=p.pool_slots, stream_every=p.stream_every,
                                       seed=p.seed)
        self.inputs = FrameInputs(p.camera_keys, p.camera_compressed, p.state_names, p.max_image_age_s)
        self.instruction = Instruction(p.default_instruction, p.max_chars)
        self.state = WAITING_FOR_CAMERA
        self.detail = ""
        self.model_errors = 0
        self.actions_published = 0
        self.narrations_published = 0
        self._acted = 0
        self._narrated_version = -1
        self._tick_times: deque[float] = deque(maxlen=500)  # whole control tick (frame, act, publish)
        self._act_times: deque[float] = deque(maxlen=500)  # runtime.act alone
        self._frame_ages: deque[float] = deque(maxlen=500)  # tick start (node clock) - source image stamp

        self.chunk_pub = self.create_publisher(JointTrajectory, "action_chunk", 10)
        self.narration_pub = self.create_publisher(Narration, "narration", 50)
        self.status_pub = self.create_publisher(EngineStatus, "engine_status", 10)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        served = Served(self.policy.model, self.policy.tokenizer, self.policy.norm_stats)
        self.runtime = Runtime(served, runtime_config, on_text=self._publish_text).start()
        for index, (topic, compressed) in enumerate(zip(p.camera_topics, p.camera_compressed, strict=True)):
            try:
                self.create_subscription(CompressedImage if compressed else Image,
                                         f"{topic}/compressed" if compressed else topic,
                                         lambda msg, i=index: self._on_image(i, msg), SENSOR_QOS)
            except InvalidTopicNameException as err:
                raise ParameterError(f"cameras.topics: {err}") from None
        self.create_subscription(JointState, "joint_states", self._on_joint_state, SENSOR_QOS)
        self.create_subscription(String, "instruction", self._on_instruction, LATCHED_QOS)
        self.control_timer = self.create_timer(p.period_s, self._control_tick)
        self.status_timer = self.create_timer(1.0 / p.status_rate_hz, self._publish_status)
        self.get_logger().info(
            f"{self.policy.source} on {p.device}: cameras {dict(zip(p.camera_topics, p.camera_keys, strict=True))}, "
            f"{len(p.state_names)} state / {len(p.action_names)} action joints, {p.rate_hz:g} Hz, horizon "
            f"{self.horizon} x {p.time_step_s:g} s, language {p.language_policy}")

    def close(self) -> None:
        """Stop the language worker (call after the executor has stopped, before destroy_node)."""
        self.runtime.close()

    # ---- subscriptions: keep the newest message ------------------------------------------------------------------

    def _on_image(self, index: int, msg) -> None:
        try:
            self.inputs.on_image(index, msg)
        except ConversionError as err:
            self._warn_drop(f"{self.params.camera_topics[index]}: {err}")

    def _on_joint_state(self, msg: JointState) -> None:
        try:
            self.inputs.on_joint_state(msg)
        except ConversionError as err:
            self._warn_drop(f"joint_states: {err}")

    def _on_instruction(self, msg: String) -> None:
        outcome = self.instruction.set(msg.data)
        if outcome == "ignored":
            self.get_logger().warning("ignoring an empty instruction; keeping the current task")
        elif outcome == "truncated":
            self.get_logger().warning(f"instruction longer than instruction.max_chars={self.params.max_chars}; "
                                      f"cut to {self.instruction.text!r}")
        else:
            self.get_logger().info(f"instruction: {self.instruction.text!r}")

    def _warn_drop(self, message: str) -> None:
        self.get_logger().warning(f"dropped input: {message}", throttle_duration_sec=LOG_THROTTLE_S)

    # ---- control path -------------------------------------------------------------------------------------------

    def _control_tick(self) -> None:
        start = time.perf_counter()
        now_ns = self.get_clock().now().nanoseconds
        state, frame, errors = self.inputs.next_frame(now_ns)
        for err in errors:
            self._warn_drop(str(err))
        self.state = state
        if frame is None:
            self.detail = self._waiting_detail()
            return
        narrate = self._should_narrate()
        try:
            chunk, actions = self._act(frame, narrate, (now_ns - frame.stamp_ns) / 1e9)
        except Exception as err:  # a model error must not stop the robot's node; it is reported instead
            self.model_errors += 1
            self.state, self.detail = MODEL_ERROR, f"{type(err).__name__}: {err}"
            self.get_logger().error(f"act failed ({self.model_errors} so far): {self.detail}",
                                    throttle_duration_sec=LOG_THROTTLE_S)
            return
        self.detail = ""
        self._acted += 1
        if narrate:
            self._narrated_version = self.instruction.version
        self.chunk_pub.publish(chunk_to_trajectory(actions, self.params.action_names, frame.stamp_ns,
                                                   self.params.time_step_s, self.horizon))
        self.actions_published += 1
        self._act_times.append(chunk.latency_s)
        self._frame_ages.append((now_ns - frame.stamp_ns) / 1e9)
        self._tick_times.append(time.perf_counter() - start)

    def _act(self, frame: Frame, narrate: bool, age_s: float):
        """The chunk (the camera frame_id travels as its context, for the narration) and its robot actions."""
        # the prompt must fit max_token_len with this instruction and state: cut it by words first if need be
        if self.instruction.fit_prompt(self.policy.tokenizer, frame.state, self.policy.config, self.policy.norm_stats):
            self.get_logger().warning(f"instruction too long for the model's prompt; using {self.instruction.text!r}")
        start = time.perf_counter()  # the chunk's latency includes preprocessing
        observation = Observation(images=frame.images, state=frame.state, task=self.instruction.text)
        inputs = self.runtime.prepare(observation)
        chunk = self.runtime.act(self.runtime.frame(inputs, narrate, stamp_ns=frame.stamp_ns, age_s=age_s,
                                                    context=frame.frame_id, arrival=start))
        return chunk, self.runtime.robot_actions(chunk, len(self.params.action_names))

    def _should_narrate(self) -> bool:
        policy = self.params.language_policy
        if policy == "every_n_frames":
            return self._acted % self.params.every_n_frames == 0
        if policy == "on_instruction_change":
            return self.instruction.version != self._narrated_version
        return False

    def _waiting_detail(self) -> str:
        if self.state == WAITING_FOR_CAMERA:
            return "no image yet from " + ", ".join(
                topic for topic, camera in zip(self.params.camera_topics, self.inputs.cameras, strict=True)
                if camera.image is None)
        return ""

    # ---- language path (runtime worker thread) ------------------------------------------------------------------

    def _publish_text(self, update: TextUpdate) -> None:
        msg = Narration(request_id=update.request_id, text=update.text, num_tokens=update.num_tokens,
                        final=update.final)
        msg.header.stamp = ns_to_stamp(update.stamp_ns)
        msg.header.frame_id = update.context or ""
        self.narration_pub.publish(msg)
        self.narrations_published += 1

    # ---- monitoring ---------------------------------------------------------------------------------------------

    def health(self) -> Health:
        worker_error = self.runtime.worker_error
        overhead = [t - a for t, a in zip(self._tick_times, self._act_times, strict=True)]
        drops = self.inputs.drops
        return Health(
            state=self.state, detail=self.detail, stats=self.runtime.stats(), target_rate_hz=self.params.rate_hz,
            actions_published=self.actions_published, dropped_frames=self.inputs.dropped_frames,
            worker_error=f"{type(worker_error).__name__}: {worker_error}" if worker_error else None,
            values={
                "frame_age_ms_p50": f"{_percentile_ms(self._frame_ages, 0.5):.2f}",
                "frame_age_ms_p99": f"{_percentile_ms(self._frame_ages, 0.99):.2f}",
                "tick_ms_p50": f"{_percentile_ms(self._tick_times, 0.5):.2f}",
                "tick_ms_p99": f"{_percentile_ms(self._tick_times, 0.99):.2f}",
                "node_overhead_ms_p50": f"{_percentile_ms(overhead, 0.5):.2f}",
                "node_overhead_ms_p99": f"{_percentile_ms(overhead, 0.99):.2f}",
                "narrations_published": self.narrations_published,
                "reused_frames": self.inputs.reused_frames,
                "model_errors": self.model_errors,
                "instructions_ignored": self.instruction.ignored,
                "instructions_truncated": self.instruction.truncated,
                **{f"dropped_{reason}": count for reason, count in sorted(drops.items())},
            })

    def _publish_status(self) -> None:
        health = self.health()
        stamp = self.get_clock().now().to_msg()
        self.status_pub.publish(engine_status(health, stamp))
        name = f"{self.get_fully_qualified_name()}: vla engine"
        self.diagnostics_pub.publish(diagnostic_array(health, stamp, name, self.params.device))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with ros_process(NODE_NAME, argv) as (context, stop):
        try:
            node = VlaNode(context=context)
        except ParameterError as err:
            rclpy.logging.get_logger(NODE_NAME).fatal(f"cannot start: {err}")
            return 1
        with spinning(node, stop, before_destroy=node.close) as spinner:
            stop.wait()
        if spinner.failure is not None:
            rclpy.logging.get_logger(NODE_NAME).fatal(f"a callback raised: {spinner.failure!r}")
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
