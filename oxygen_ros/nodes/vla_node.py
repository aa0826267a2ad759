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

Output: every acted chunk is first made the robot's absolute command by the `embodiment` profile
(`oxygen_ros.control.embodiment`: deltas added to and velocities integrated from the state of the frame the model
saw, signs and units), then becomes one plan (`output.handover`: the chunk as computed, or the blend of the
received chunks from the present control step on, `oxygen_ros.control.handover`), published whole on
`action_chunk` and, per declared `output.groups`, as one JointTrajectory per controller with that group's joints in
the controller's units (`oxygen_ros.control.joint_groups`). A chunk the hand-over cannot use (every point already past) is counted
and logged, and nothing is published for it.

Inputs stamped on another clock than the node's (a bag played without `--clock`, wall-clock stamps under
`use_sim_time`) are named once per source and condition in the log, with the fix; ticks they make skip report
state `clock_mismatch` with the same hint (`clock_check`).

A model error in a tick, or a chunk with a non-finite value (never published), is logged, counted and reported
as state `model_error`; the node keeps running. Every drop is logged with its source and reason, throttled per
(source, reason) so that one repeating fault never hides another.
SIGINT/SIGTERM (caught from the process's first line, `entry`): the executor stops, the runtime's worker is
joined, the node destroyed, exit code 0.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("vla_node"))

import time
from collections import deque
from collections.abc import Sequence

import numpy as np
import rclpy
import torch
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.exceptions import InvalidTopicNameException
from rclpy.node import Node
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.control.handover import Handover, Plan
from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.engine.runtime import Runtime, RuntimeConfig, Served, TextUpdate
from oxygen_ros.engine.scheduler import SchedulerConfig, node_decode_policy
from oxygen_ros.engine.stats import percentile_ms
from oxygen_ros.model.preprocess import Observation
from oxygen_ros.msg import EngineStatus, Narration

from .clock_check import CLOCK_MISMATCH, ClockCheck
from .conversions import ConversionError, ImageLimits, chunk_to_trajectory, ns_to_stamp
from .diagnostics import Health, diagnostic_array, engine_status
from .frame_inputs import (
    JOINT_STATES,
    MODEL_ERROR,
    SKIPPED_TICK_STATES,
    WAITING_FOR_CAMERA,
    Frame,
    FrameInputs,
    InputLimits,
    Instruction,
)
from .lifecycle import ros_process, spinning
from .log_throttle import LogThrottle
from .markers import MarkerOutput
from .model_setup import load_policy
from .parameters import ParameterError, declare_parameters, read_parameters
from .qos import LATCHED_QOS, SENSOR_QOS

NODE_NAME = "vla_node"
LOG_THROTTLE_S = 5.0


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
        scheduler = SchedulerConfig(num_steps=p.denoise_steps or config.num_steps, control_period_s=p.period_s,
                                    deadline_margin_s=p.deadline_margin_s, max_new_tokens=p.max_new_tokens,
                                    **node_decode_policy(p.tokens_per_frame, p.min_steps_per_frame,
                                                         p.max_new_tokens),
                                    admission=p.admission, max_preempted=p.max_preempted,
                                    temperature=p.temperature, seed=p.seed)
        runtime_config = RuntimeConfig(scheduler=scheduler, pool_slots=p.pool_slots, stream_every=p.stream_every,
                                       seed=p.seed, overlap_threads=p.overlap_threads)
        limits = InputLimits(max_image_age_s=p.max_image_age_s, max_state_age_s=p.max_state_age_s,
                             future_tolerance_s=p.future_tolerance_s,
                             images=ImageLimits(p.max_pixels, config.vision.image_size))
        self.inputs = FrameInputs(p.camera_topics, p.camera_keys, p.camera_compressed, p.state_names, limits)
        self.instruction = Instruction(p.default_instruction, p.max_chars)
        self.state = WAITING_FOR_CAMERA
        self.detail = ""
        self.model_errors = 0
        self.nonfinite_chunks = 0
        self._log = LogThrottle(LOG_THROTTLE_S)
        self.actions_published = 0
        self.narrations_published = 0
        self._acted = 0
        self._narrated_version = -1
        self._tick_times: deque[float] = deque(maxlen=500)  # whole control tick (frame, act, publish)
        self._act_times: deque[float] = deque(maxlen=500)  # runtime.act alone
        self._frame_ages: deque[float] = deque(maxlen=500)  # tick start (node clock) - source image stamp

        # the plan's columns: positions, then velocities when the embodiment has them (blended alike)
        columns = len(p.action_names) * (2 if p.embodiment.has_velocity else 1)
        self.handover = Handover(p.handover, columns, p.time_step_s, p.ensemble_m, p.rtc_overlap)
        self.chunks_unused = 0  # acted chunks the hand-over could not use (nothing published for them)
        self.clock_check = ClockCheck()
        self.chunk_pub = self.create_publisher(JointTrajectory, "action_chunk", 10)
        self.group_pubs = []
        for group in p.groups:
            try:
                self.group_pubs.append((group, self.create_publisher(JointTrajectory, group.topic, 10)))
            except InvalidTopicNameException as err:
                raise ParameterError(f"output.{group.name}.topic: {err}") from None
        self.narration_pub = self.create_publisher(Narration, "narration", 50)
        self.status_pub = self.create_publisher(EngineStatus, "engine_status", 10)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.markers = MarkerOutput(self, p.markers, p.marker_frame)
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
            f"{len(p.state_names)} state / {len(p.action_names)} action joints, embodiment {p.embodiment.name}, "
            f"{p.rate_hz:g} Hz, horizon {self.horizon} x {p.time_step_s:g} s, language {p.language_policy}, "
            f"hand-over {p.handover}" + "".join(f", {g.name} -> {self.group_pubs[i][1].topic_name} {list(g.joints)}"
                                                for i, g in enumerate(p.groups)))
        if self.policy.embodiment_warning:
            self.get_logger().warning(f"{self.policy.embodiment_warning} (starting: embodiment_override is true)")

    def close(self) -> None:
        """Stop the language worker (call after the executor has stopped, before destroy_node)."""
        self.runtime.close()

    # ---- subscriptions: keep the newest message ------------------------------------------------------------------

    def _on_image(self, index: int, msg) -> None:
        self._check_clock(self.params.camera_topics[index], msg)
        try:
            self.inputs.on_image(index, msg)
        except ConversionError as err:
            self._warn_drop(self.params.camera_topics[index], err.reason, str(err))

    def _on_joint_state(self, msg: JointState) -> None:
        self._check_clock(JOINT_STATES, msg)
        try:
            self.inputs.on_joint_state(msg)
        except ConversionError as err:
            self._warn_drop(JOINT_STATES, err.reason, str(err))

    def _on_instruction(self, msg: String) -> None:
        outcome = self.instruction.set(msg.data)
        if outcome == "ignored":
            self.get_logger().warning("ignoring an empty instruction; keeping the current task")
        elif outcome == "truncated":
            self.get_logger().warning(f"instruction longer than instruction.max_chars={self.params.max_chars}; "
                                      f"cut to {self.instruction.text!r}")
        else:
            self.get_logger().info(f"instruction: {self.instruction.text!r}")

    def _check_clock(self, source: str, msg) -> None:
        clock = self.get_clock()
        line = self.clock_check.observe(source, stamp_to_ns(msg.header.stamp), clock.now().nanoseconds,
                                        clock.ros_time_is_active)
        if line is None:
            return
        entered, text = line
        if entered:
            self.get_logger().warning(f"clock mismatch: {text}")
        else:
            self.get_logger().info(f"clock mismatch over: {text}")

    def _warn_drop(self, source: str, reason: str, message: str) -> None:
        if (suffix := self._throttled((source, reason))) is not None:
            self.get_logger().warning(f"dropped a message from {source} ({reason}): {message}{suffix}")

    # ---- control path -------------------------------------------------------------------------------------------

    def _control_tick(self) -> None:
        start = time.perf_counter()
        now_ns = self.get_clock().now().nanoseconds
        decision = self.inputs.next_frame(now_ns)
        for dropped in decision.dropped:
            self._warn_drop(dropped.source, dropped.reason, dropped.message)
        self.state, self.detail, frame = decision.state, decision.detail, decision.frame
        if self.state in SKIPPED_TICK_STATES and (hint := self.clock_check.hint()):
            self.state, self.detail = CLOCK_MISMATCH, f"{self.detail}: {hint}"
        if frame is None:
            if self.state in (*SKIPPED_TICK_STATES, CLOCK_MISMATCH) and (suffix := self._throttled(self.state)) \
                    is not None:
                self.get_logger().warning(f"not acting ({self.state}): {self.detail}{suffix}")
            return
        narrate = self._should_narrate()
        try:
            chunk, actions = self._act(frame, narrate, (now_ns - frame.stamp_ns) / 1e9)
        except Exception as err:  # a model error must not stop the robot's node; it is reported instead
            self.model_errors += 1
            self.state, self.detail = MODEL_ERROR, f"{type(err).__name__}: {err}"
            if (suffix := self._throttled("act")) is not None:
                self.get_logger().error(f"act failed ({self.model_errors} so far): {self.detail}{suffix}")
            return
        self._acted += 1  # narration cadence counts frames the model ran on, published or not
        if narrate:
            self._narrated_version = self.instruction.version
        finite = np.isfinite(actions)
        if not finite.all():  # never sent to a robot
            self.nonfinite_chunks += 1
            per_joint = finite.reshape(len(finite), -1, len(self.params.action_names)).all(axis=(0, 1))
            bad_joints = [name for name, ok in zip(self.params.action_names, per_joint, strict=True) if not ok]
            self.state, self.detail = MODEL_ERROR, (
                f"action chunk has {finite.size - finite.sum()} non-finite values of {finite.size} (joints "
                f"{', '.join(bad_joints)}); not published")
            if (suffix := self._throttled("nonfinite")) is not None:
                self.get_logger().error(f"{self.detail} ({self.nonfinite_chunks} such chunks so far){suffix}")
            return
        step_ns = self.handover.step_ns  # point i of the chunk is for its frame's time + (i + 1) steps
        plan = self.handover.add(actions[:self.horizon], frame.stamp_ns + step_ns, self.get_clock().now().nanoseconds)
        if isinstance(plan, str):
            self.chunks_unused += 1
            if (suffix := self._throttled("unused")) is not None:
                self.get_logger().warning(f"acted chunk not published ({self.params.handover}): {plan} "
                                          f"({self.chunks_unused} so far){suffix}")
            return
        if not self._publish_plan(plan):
            return
        self.actions_published += 1
        self._act_times.append(chunk.latency_s)
        self._frame_ages.append((now_ns - frame.stamp_ns) / 1e9)
        self._tick_times.append(time.perf_counter() - start)

    def _publish_plan(self, plan: Plan) -> bool:
        """`action_chunk` (every action joint, the robot's absolute command), then each group's joints in its
        controller's units; header.stamp one step before the first point, point i at (i + 1) steps, as
        `chunk_to_trajectory` lays them out. All or nothing: False (nothing published) if a value in a controller's
        units is not finite."""
        stamp_ns, time_step, count = plan.first_ns - plan.step_ns, self.params.time_step_s, len(plan.values)
        joints = len(self.params.action_names)
        positions, velocities = plan.values[:, :joints], plan.values[:, joints:] if plan.values.shape[1] > joints \
            else None
        outputs = [(self.chunk_pub, self.params.action_names, positions, velocities)]
        outputs += [(pub, group.joints, group.to_robot(positions),
                     None if velocities is None else group.velocities_to_robot(velocities))
                    for group, pub in self.group_pubs]
        if not all(np.isfinite(p).all() and (v is None or np.isfinite(v).all()) for _, _, p, v in outputs):
            self.nonfinite_chunks += 1  # a scale beyond float range
            self.state, self.detail = MODEL_ERROR, "a plan overflows in robot units (output.*.scale / offset); " \
                                                   "not published"
            if (suffix := self._throttled("overflow")) is not None:
                self.get_logger().error(f"{self.detail}{suffix}")
            return False
        for publisher, names, values, rates in outputs:
            publisher.publish(chunk_to_trajectory(values, names, stamp_ns, time_step, count, rates))
        self.markers.plan(positions, time_step, stamp_ns)
        return True

    def _act(self, frame: Frame, narrate: bool, age_s: float):
        """The chunk (the camera frame_id travels as its context, for the narration) and the robot's absolute
        command [H, joints (x2 with velocities)] that the embodiment makes of it from the frame's own state (never a
        newer one: a delta or a velocity is relative to what the model saw)."""
        embodiment = self.params.embodiment
        state = embodiment.state_to_model(frame.state)
        # the prompt must fit max_token_len with this instruction and state: shortened before acting if need be
        outcome = self.instruction.fit_prompt(self.policy.tokenizer, state, self.policy.config,
                                              self.policy.norm_stats)
        if outcome == "cut":
            self.get_logger().warning(f"instruction too long for the model's prompt; using {self.instruction.text!r}")
        elif outcome == "previous":
            self.get_logger().warning(f"no part of the instruction fits the model's prompt; keeping the previous task "
                                      f"{self.instruction.text!r}")
        start = time.perf_counter()  # the chunk's latency includes preprocessing
        observation = Observation(images=frame.images, state=state, task=self.instruction.text)
        inputs = self.runtime.prepare(observation)
        chunk = self.runtime.act(self.runtime.frame(inputs, narrate, stamp_ns=frame.stamp_ns, age_s=age_s,
                                                    context=frame.frame_id, arrival=start))
        command = embodiment.actions_to_robot(self.runtime.robot_actions(chunk, len(self.params.action_names)),
                                              frame.state)
        return chunk, command.stacked()

    def _throttled(self, key) -> str | None:
        """None if a line of this kind went out less than LOG_THROTTLE_S ago, else the line's suffix.

        (Each severity needs its own logging call site: rclpy refuses one site logging at two severities.)"""
        held = self._log.allow(key)
        return None if held is None else LogThrottle.suffix(held)

    def _should_narrate(self) -> bool:
        policy = self.params.language_policy
        if policy == "every_n_frames":
            return self._acted % self.params.every_n_frames == 0
        if policy == "on_instruction_change":
            return self.instruction.version != self._narrated_version
        return False

    # ---- language path (runtime worker thread) ------------------------------------------------------------------

    def _publish_text(self, update: TextUpdate) -> None:
        msg = Narration(request_id=update.request_id, text=update.text, num_tokens=update.num_tokens,
                        final=update.final)
        msg.header.stamp = ns_to_stamp(update.stamp_ns)
        msg.header.frame_id = update.context or ""
        self.narration_pub.publish(msg)
        self.narrations_published += 1
        if update.final:
            self.markers.narration(update.text, update.stamp_ns)

    # ---- monitoring ---------------------------------------------------------------------------------------------

    def health(self) -> Health:
        worker_error = self.runtime.worker_error
        overhead = [t - a for t, a in zip(self._tick_times, self._act_times, strict=True)]
        drops = self.inputs.drops
        image_age, state_age = self.inputs.image_age_ns, self.inputs.state_age_ns
        return Health(
            state=self.state, detail=self.detail, stats=self.runtime.stats(), target_rate_hz=self.params.rate_hz,
            actions_published=self.actions_published, dropped_frames=self.inputs.dropped_frames,
            worker_error=f"{type(worker_error).__name__}: {worker_error}" if worker_error else None,
            values={
                "frame_age_ms_p50": f"{percentile_ms(self._frame_ages, 0.5):.2f}",
                "frame_age_ms_p99": f"{percentile_ms(self._frame_ages, 0.99):.2f}",
                "tick_ms_p50": f"{percentile_ms(self._tick_times, 0.5):.2f}",
                "tick_ms_p99": f"{percentile_ms(self._tick_times, 0.99):.2f}",
                "node_overhead_ms_p50": f"{percentile_ms(overhead, 0.5):.2f}",
                "node_overhead_ms_p99": f"{percentile_ms(overhead, 0.99):.2f}",
                "narrations_published": self.narrations_published,
                "reused_frames": self.inputs.reused_frames,
                "image_age_ms": f"{image_age / 1e6:.2f}" if image_age is not None else "none",
                "state_age_ms": f"{state_age / 1e6:.2f}" if state_age is not None else "none",
                "model_errors": self.model_errors,
                "nonfinite_chunks": self.nonfinite_chunks,
                "handover": self.params.handover,
                "chunks_unused": self.chunks_unused,
                "clock_mismatch": self.clock_check.hint() or "none",
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
            failure = spinner.failure
            rclpy.logging.get_logger(NODE_NAME).fatal(f"a callback raised {type(failure).__name__}: {failure}")
            return 1
        return 0
