"""The VLA node: camera images + joint state + instruction in, action chunks and narration out, one prefill per tick.

`ros2 run oxygen_ros vla_node --ros-args --params-file config/aloha.yaml` (or `ros2 launch oxygen_ros
oxygen.launch.py`). A managed (lifecycle) node: constructing it reads and checks the parameters (a bad one is one
start-up line, exit 1); `configure` loads the model, warms it up with one frame and subscribes; `activate` starts
the control timer; `deactivate` stops it and holds; `cleanup` and `shutdown` release everything `configure` made;
`~/reset` (std_srvs/Trigger) starts an episode: held, the executed plan and the inputs kept forgotten (`_on_reset`).
With `autostart` (the default) the process walks itself to active; otherwise the standard lifecycle services
(`<node>/change_state`, `<node>/get_state`) do. A failed `configure` leaves the node unconfigured, the reason in
the log and on `/diagnostics`. `engine_status` and `/diagnostics` go out in every state. Threads:

- the executor thread (a SingleThreadedExecutor) runs every callback: subscriptions only keep the newest message;
  the control timer at `control.rate_hz` builds the frame (`FrameInputs`), calls `Runtime.act` (one prefill,
  the action chunk, and - when this frame narrates - the hand-over of its KV slot to a language request) and
  publishes the chunk; the status timer publishes `engine_status` and `/diagnostics`; lifecycle transitions;
- a decoder thread (`DecodeThread`) decodes camera images as they arrive, so a tick only uses decoded ones;
- the runtime's language worker decodes narrations in batches between control ticks and publishes `narration`
  from its own thread through `on_text` (rclpy publishers are safe to use from a plain thread). The control tick
  never waits for language beyond the one decode step that may be in flight: the runtime runs with adaptive k,
  decoding only in the slack before the next tick (the runtime's `ControlGate` and scheduler).

Output: every acted chunk is first made the robot's absolute command by the `embodiment` profile
(`oxygen_ros.control.embodiment`: deltas added to and velocities integrated from the state of the frame the model
saw, signs and units), then goes through the one command path (`oxygen_ros.robots.command_path`): one plan
(`output.handover`: the chunk as computed, or the blend of the received chunks from the present control step on;
`rtc_guided`: the chunk as computed, sampled with real-time chunking's guidance toward the chunk being executed and
the measured delay, `robots.rtc_guide`),
published whole on `action_chunk` and, per declared `output.groups`, as one JointTrajectory per controller with that
group's joints in the controller's units, within the joint limits (clamped or refused). A chunk the hand-over cannot
use (every point already past) is counted and logged, and nothing is published for it. When the node stops
commanding the groups (inputs stale, a model error, a plan refused by the limits, deactivation, shutdown) each
group's controller gets one hold (`holds`, `docs/safety.md`). A joint state that moved faster than its velocity
limit allows is dropped and counted (`oxygen_ros.robots.state_check`).

Inputs stamped on another clock than the node's (a bag played without `--clock`, wall-clock stamps under
`use_sim_time`) are named once per source and condition in the log, with the fix; ticks they make skip report
state `clock_mismatch` with the same hint (`clock_check`).

A model error in a tick, or a chunk with a non-finite value (never published), is logged, counted and reported
as state `model_error`; the node keeps running. Every drop is logged with its source and reason, throttled per
(source, reason) so that one repeating fault never hides another.
SIGINT/SIGTERM (caught from the process's first line, `entry`): the executor stops, the groups get their holds,
the runtime's worker is joined, the node destroyed, exit code 0. `use_sim_time` is read at start-up: a change at
run time is refused (a node switched to sim time without `/clock` would stop its timers, status included).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("vla_node"))

import os
import time
from collections import deque
from collections.abc import Sequence

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.exceptions import InvalidTopicNameException
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory
from visualization_msgs.msg import MarkerArray

from oxygen_ros.control.joint_groups import TRAJECTORY
from oxygen_ros.data.stamps import stamp_to_ns
from oxygen_ros.engine.runtime import Runtime, TextUpdate
from oxygen_ros.engine.stats import percentile_ms
from oxygen_ros.msg import EngineStatus, Narration
from oxygen_ros.robots.command_path import (
    LIMIT_REJECTED,
    LIMITS,
    NONFINITE,
    PAST,
    UNUSED,
    Command,
    CommandPath,
    Refusal,
)
from oxygen_ros.robots.engine import build_runtime
from oxygen_ros.robots.instruction import Instruction
from oxygen_ros.robots.rtc_guide import REFUSED, Plain, rtc_guide
from oxygen_ros.robots.session import RobotSession
from oxygen_ros.robots.state_check import StateCheck
from oxygen_ros.serving.client import API_KEY_ENV, RemoteEngine, RemoteError

from .clock_check import CLOCK_MISMATCH, ClockCheck
from .command_messages import plan_messages, plan_stamp_ns
from .conversions import ConversionError, ImageLimits, ns_to_stamp
from .diagnostics import CONFIGURE_FAILED, NO_STATS, Health, diagnostic_array, engine_status
from .frame_inputs import (
    JOINT_STATES,
    MODEL_ERROR,
    SKIPPED_TICK_STATES,
    STALE_FRAME,
    WAITING_FOR_CAMERA,
    DecodeThread,
    FrameInputs,
    InputFrame,
    InputLimits,
)
from .holds import hold_message
from .log_throttle import LogThrottle
from .managed_node import ManagedNode
from .managed_node import main as run_managed
from .markers import TOPIC as MARKER_TOPIC
from .markers import MarkerOutput
from .model_setup import load_policy
from .parameters import ParameterError, declare_parameters, read_description_wait, read_parameters
from .qos import LATCHED_QOS, SENSOR_QOS
from .robot_description import description_from_topic

NODE_NAME = "vla_node"
LOG_THROTTLE_S = 5.0
WARM_UP_PIXELS = 224  # the warm-up frame's images (any size: they are resized to the model's input)


class VlaNode(ManagedNode):
    """The lifecycle of `managed_node`: `configure` loads the model, warms it up with one frame and subscribes;
    `activate` starts the control timer; `deactivate` stops it and holds; `cleanup` and `shutdown` release it."""

    def __init__(self, context=None):
        super().__init__(NODE_NAME, context=context)
        try:
            values = declare_parameters(self)
            wait_s = read_description_wait(values)
            if not values["robot_description"] and wait_s > 0:
                values["robot_description"] = description_from_topic(self, wait_s)
            self.params = read_parameters(values)
        except BaseException:
            self.destroy_node()
            raise
        p = self.params
        self.autostart_param = p.autostart
        self.add_on_set_parameters_callback(self._refuse_clock_change)
        self.runtime: Runtime | None = None
        self.remote: RemoteEngine | None = None  # with engine.remote: the engine this node sends its frames to
        self.policy = None
        self.rtc = None  # with handover rtc_guided: the robot's real-time chunking (`robots.rtc_guide`)
        self.decoder: DecodeThread | None = None
        self.control_timer = None
        self.state = "unconfigured"
        self.detail = ""
        self.model_errors = 0
        self.language_errors = 0  # narrations ended by non-finite logits
        self.language_error: str | None = None  # the last one's, until a narration ends well
        self._log = LogThrottle(LOG_THROTTLE_S)
        self.actions_published = 0
        self.narrations_published = 0
        self.path = CommandPath(p.groups, p.holds, p.limits, p.limit_policy, p.state_names, p.action_names,
                                p.time_step_s, p.embodiment.has_velocity, p.handover, p.ensemble_m, p.rtc_overlap)
        self.clock_check = ClockCheck()
        self.instruction = Instruction(p.default_instruction, p.max_chars)
        self.status_pub = self.create_publisher(EngineStatus, "engine_status", 10)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.status_timer = self.create_timer(1.0 / p.status_rate_hz, self._publish_status)
        self.resets = 0  # episodes started by `~/reset`
        self.reset_service = self.create_service(Trigger, "~/reset", self._on_reset)

    # ---- lifecycle (`managed_node`) ------------------------------------------------------------------------------

    def _entered(self, lifecycle: str, detail: str, failed: bool = False) -> None:
        self.lifecycle, self.detail = lifecycle, detail
        self.state = CONFIGURE_FAILED if failed else WAITING_FOR_CAMERA if lifecycle == "active" else lifecycle

    def _start_acting(self) -> None:
        self.path.start()  # nothing planned before this activation is blended into what comes after
        self.control_timer = self.create_timer(self.params.period_s, self._control_tick)
        if (suffix := self._throttled("active")) is not None:  # a transition storm logs one line per period
            self.get_logger().info(f"active: acting on the inputs{suffix}")

    def _stop_acting(self, reason: str) -> None:
        if self.control_timer is not None:
            self.destroy_timer(self.control_timer)
            self.control_timer = None
            self._hold(reason)

    def _on_reset(self, request, response):
        """`~/reset` (std_srvs/Trigger): a new episode starts. The groups get their holds, the hand-over forgets
        what it executed (`CommandPath.start`, `RtcGuide.stop`: the next chunk is sampled plainly and nothing of the
        old episode is blended into it), and the inputs kept are dropped with every one stamped at or before now on
        the node's clock (`FrameInputs.forget`), so the node acts again on the first frame taken after the call.
        The measured delays are kept: they are the robot's link and the node's, not the episode's."""
        if self.lifecycle not in ("inactive", "active"):
            response.success, response.message = False, f"not configured ({self.lifecycle}): nothing to reset"
            return response
        since_ns = self.get_clock().now().nanoseconds
        self._hold("reset")
        self.path.start()
        self.inputs.forget(since_ns)
        self.resets += 1
        if self.lifecycle == "active":
            self.state, self.detail = WAITING_FOR_CAMERA, "reset: waiting for the new episode's first frame"
        if (suffix := self._throttled("reset")) is not None:
            self.get_logger().info(f"reset ({self.resets} so far): frames stamped up to {since_ns / 1e9:.3f} s are "
                                   f"the previous episode's{suffix}")
        response.success, response.message = True, f"reset at {since_ns} ns (node clock)"
        return response

    def _configure(self) -> None:
        p = self.params
        if p.remote:  # the engine is elsewhere: frames go there, the checks and the command path stay here
            self.remote = RemoteEngine(p.remote, os.environ.get(API_KEY_ENV) or None, p.embodiment.openpi_keys,
                                       len(p.action_names), p.remote_timeout_s)
            self.horizon, image_size, crops = p.horizon or None, 0, ()
            source = f"remote engine {p.remote.split('?')[0]}"
        else:
            self.policy = load_policy(p)
            self.horizon, image_size = p.horizon or self.policy.config.action_horizon, \
                self.policy.config.vision.image_size
            crops, source = self.policy.config.image_crops, f"{self.policy.source} on {p.device}"
        limits = InputLimits(max_image_age_s=p.max_image_age_s, max_state_age_s=p.max_state_age_s,
                             future_tolerance_s=p.future_tolerance_s,
                             images=ImageLimits(p.max_pixels, image_size, crops))
        self.inputs = FrameInputs(p.camera_topics, p.camera_keys, p.camera_compressed, p.state_names, limits,
                                  StateCheck(p.groups, p.limits, p.state_names), p.state_units)
        self._acted = 0
        self._narrated_version = -1
        self._tick_times: deque[float] = deque(maxlen=500)  # whole control tick (frame, act, publish)
        self._act_times: deque[float] = deque(maxlen=500)  # runtime.act (or the remote engine's round trip) alone
        self._frame_ages: deque[float] = deque(maxlen=500)  # tick start (node clock) - source image stamp
        if self.remote is None:
            self._start_engine()
        self.decoder = DecodeThread(self.inputs)
        self.chunk_pub = self.create_publisher(JointTrajectory, "action_chunk", 10)
        self.group_pubs = []
        for group in p.groups:
            try:
                kind = JointTrajectory if group.interface == TRAJECTORY else Float64MultiArray
                self.group_pubs.append((group, self.create_publisher(kind, group.topic, 10)))
            except InvalidTopicNameException as err:
                raise ParameterError(f"output.{group.name}.topic: {err}") from None
        self.narration_pub = self.create_publisher(Narration, "narration", 50)
        self.markers = MarkerOutput(self.create_publisher(MarkerArray, MARKER_TOPIC, 10)
                                    if p.markers else None, p.marker_frame)
        for index, (topic, compressed) in enumerate(zip(p.camera_topics, p.camera_compressed, strict=True)):
            try:
                self.create_subscription(CompressedImage if compressed else Image,
                                                    f"{topic}/compressed" if compressed else topic,
                                                    lambda msg, i=index: self._on_image(i, msg), SENSOR_QOS)
            except InvalidTopicNameException as err:
                raise ParameterError(f"cameras.topics: {err}") from None
        self.create_subscription(JointState, "joint_states", self._on_joint_state, SENSOR_QOS)
        self.create_subscription(String, "instruction", self._on_instruction, LATCHED_QOS)
        limits_text = "none" if p.limits is None else f"{p.limit_policy} ({len(p.limits.joints)} joints)"
        self.get_logger().info(
            f"{source}: cameras {dict(zip(p.camera_topics, p.camera_keys, strict=True))}, "
            f"{len(p.state_names)} state / {len(p.action_names)} action joints, embodiment {p.embodiment.name}, "
            f"{p.rate_hz:g} Hz, horizon {self.horizon or 'of each reply'} x {p.time_step_s:g} s, language "
            f"{'none (remote engine)' if self.remote else p.language_policy}, "
            f"hand-over {p.handover}, limits {limits_text}"
            + "".join(f", {g.name} -> {self.group_pubs[i][1].topic_name} {list(g.joints)} (hold {p.holds[i]})"
                      for i, g in enumerate(p.groups)))
        if self.policy is not None and self.policy.embodiment_warning:
            self.get_logger().warning(f"{self.policy.embodiment_warning} (starting: embodiment_override is true)")

    def _start_engine(self) -> None:
        """The model in this node: loaded runtime, warmed up with one frame, started."""
        p, config = self.params, self.policy.config
        # real-time chunking (handover rtc_guided): the chunk being executed and the measured delays guide each frame
        self.rtc = rtc_guide(p.handover, p.rtc, self.path.step_ns, self.horizon, config, p.embodiment,
                             self.policy.norm_stats)
        self.runtime = build_runtime(p, self.policy, self._publish_text, stream_every=p.stream_every,
                                     deadline_margin_s=p.deadline_margin_s,
                                     rtc=self.rtc.config if self.rtc else None)
        self.session = RobotSession(self.runtime, p.embodiment, self.instruction, len(p.action_names))
        warm_up, _ = self.session.frame({key: np.zeros((WARM_UP_PIXELS, WARM_UP_PIXELS, 3), np.uint8)
                                         for key in p.camera_keys}, np.zeros(len(p.state_names)), False)
        self.runtime.warm_up(warm_up.inputs)
        self.runtime.start()

    def _release_engine(self) -> None:
        """Undo `_configure` (whatever of it was done): threads joined, the model dropped."""
        if self.remote is not None:
            self.remote.close()
            self.remote = None
        if self.decoder is not None:
            self.decoder.close()
            self.decoder = None
        if self.runtime is not None:
            if self.rtc is not None:  # the run's guidance in one line (/diagnostics' counters, at the end)
                self.get_logger().info("real-time chunking: " + ", ".join(f"{k} {v}" for k, v in
                                                                          self.rtc.counts().items()))
            self.runtime.close()
            self.runtime = None
        self.policy = None

    def _refuse_clock_change(self, parameters) -> SetParametersResult:
        """use_sim_time is read at start-up; switched at run time without /clock, every timer would stop."""
        if any(parameter.name == "use_sim_time" for parameter in parameters):
            return SetParametersResult(successful=False, reason="use_sim_time is read at start-up: restart the node "
                                                                "with use_sim_time:=true or false")
        return SetParametersResult(successful=True)

    # ---- subscriptions: keep the newest message ------------------------------------------------------------------

    def _on_image(self, index: int, msg) -> None:
        self._check_clock(self.params.camera_topics[index], msg)
        try:
            self.inputs.on_image(index, msg, self.get_clock().now().nanoseconds)
        except ConversionError as err:
            self._warn_drop(self.params.camera_topics[index], err.reason, str(err))
            return
        self.decoder.wake()

    def _on_joint_state(self, msg: JointState) -> None:
        self._check_clock(JOINT_STATES, msg)
        try:
            self.inputs.on_joint_state(msg, self.get_clock().now().nanoseconds)
        except ConversionError as err:
            self._warn_drop(JOINT_STATES, err.reason, str(err))

    def _on_instruction(self, msg: String) -> None:
        """Logged at most once per LOG_THROTTLE_S per outcome (a publisher may change its text at any rate); the
        counters keep every one."""
        outcome = self.instruction.set(msg.data)
        if (suffix := self._throttled(("instruction", outcome))) is None:
            return
        if outcome == "ignored":
            self.get_logger().warning(f"ignoring an empty instruction; keeping the current task{suffix}")
        elif outcome == "truncated":
            self.get_logger().warning(f"instruction longer than instruction.max_chars={self.params.max_chars}; "
                                      f"cut to {_shown(self.instruction.text)}{suffix}")
        else:
            self.get_logger().info(f"instruction: {_shown(self.instruction.text)}{suffix}")

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
            self._hold(self.state)
            return
        narrate = self._should_narrate()
        try:
            chunk, actions = self._act(frame, narrate, (now_ns - frame.stamp_ns) / 1e9)
        except RemoteError as err:
            self._remote_failed(err)
            return
        except Exception as err:  # a model error must not stop the robot's node; it is reported instead
            self.model_errors += 1
            self.state, self.detail = MODEL_ERROR, f"{type(err).__name__}: {err}"
            if (suffix := self._throttled("act")) is not None:
                self.get_logger().error(f"act failed ({self.model_errors} so far): {self.detail}{suffix}")
            self._hold(MODEL_ERROR)
            return
        self._acted += 1  # narration cadence counts frames the model ran on, published or not
        if narrate:
            self._narrated_version = self.instruction.version
        step_ns = self.path.step_ns  # point i of the chunk is for its frame's time + (i + 1) steps
        command = self.path.command(actions[:self.horizon or None], frame.stamp_ns + step_ns,
                                    self.get_clock().now().nanoseconds, self.inputs.state)
        if isinstance(command, Refusal):
            self._refused(command)
            return
        self._publish(command)
        if self.rtc is not None:  # the robot executes this chunk now
            self.rtc.executing(chunk.actions, frame.stamp_ns, self._rtc_state)
        self.actions_published += 1
        self._act_times.append(chunk.latency_s)
        self._frame_ages.append((now_ns - frame.stamp_ns) / 1e9)
        self._tick_times.append(time.perf_counter() - start)

    def _remote_failed(self, err: RemoteError) -> None:
        """A frame the remote engine gave no chunk to act on: the groups are held, whatever the kind (an engine out
        of reach is a stale input; a chunk from a replica that no longer owns the robot never reaches a
        controller), the state names it, and it is logged (throttled per kind) and counted (`RemoteEngine`)."""
        self.state, self.detail = err.kind, str(err)
        if (suffix := self._throttled(("remote", err.kind))) is not None:
            self.get_logger().warning(f"remote engine: {self.detail} ({self.remote.failures[err.kind]} such frames "
                                      f"so far){suffix}")
        self._hold(err.kind)

    def _refused(self, refusal: Refusal) -> None:
        """A chunk the command path did not pass: logged (throttled per kind), state set, and the groups held,
        except for a chunk the hand-over could not use (the previous plan still stands)."""
        path = self.path
        if refusal.kind == UNUSED:
            if (suffix := self._throttled("unused")) is not None:
                self.get_logger().warning(f"acted chunk not published ({self.params.handover}): {refusal.detail} "
                                          f"({path.chunks_unused} so far){suffix}")
            return
        if refusal.kind == LIMITS:
            self.state, self.detail = LIMIT_REJECTED, refusal.detail
            if (suffix := self._throttled(("limits", refusal.limit))) is not None:
                self.get_logger().warning(f"{self.detail} ({sum(path.limits_rejected.values())} refusals so far, "
                                          f"by joint){suffix}")
        elif refusal.kind == PAST:  # the frame was too old for its plan: as a stale frame, the groups are held
            self.state, self.detail = STALE_FRAME, refusal.detail
            if (suffix := self._throttled(PAST)) is not None:
                self.get_logger().warning(f"{self.detail} ({path.plans_past} such plans so far){suffix}")
        else:  # non-finite actions, or a plan that overflows in a controller's units
            self.state, self.detail = MODEL_ERROR, refusal.detail
            if (suffix := self._throttled(refusal.kind)) is not None:
                count = f" ({path.nonfinite_chunks} such chunks so far)" if refusal.kind == NONFINITE else ""
                self.get_logger().error(f"{self.detail}{count}{suffix}")
        self._hold(self.state)

    def _publish(self, command: Command) -> None:
        """`action_chunk`, then each group's controller (`command_messages`); the markers' chart of the plan."""
        chunk, outputs = plan_messages(command, self.params.action_names, self.params.groups,
                                       self.params.time_step_s)
        self.chunk_pub.publish(chunk)
        for (_, publisher), msg in zip(self.group_pubs, outputs, strict=True):
            publisher.publish(msg)
        self.markers.plan(command.positions, self.params.time_step_s, plan_stamp_ns(command))

    def _hold(self, reason: str) -> None:
        """One hold to each group's controller that was being commanded (`holds`); nothing if none was. Logged at
        most once per LOG_THROTTLE_S per reason: plans refused every other tick hold at control rate (every hold
        is counted in `holds_sent`)."""
        due = self.path.stop(reason, self.inputs.state)
        if self.rtc is not None:  # holding: no chunk is executed, the next one is sampled plainly
            self.rtc.stop()
        sent = [hold for hold in due if not hold.refused]
        for hold in sent:
            self.group_pubs[hold.group][1].publish(hold_message(self.params.groups[hold.group].joints, hold.mode,
                                                                hold.positions, self.params.time_step_s))
        if sent and (suffix := self._throttled(("hold", reason))) is not None:
            self.get_logger().info(f"holding {', '.join(self.params.groups[h.group].name for h in sent)}: {reason}"
                                   f"{suffix}")
        for hold in due:
            if hold.refused and (suffix := self._throttled(("hold refused", hold.group))) is not None:
                self.get_logger().error(f"no hold sent to {self.params.groups[hold.group].name} ({reason}): "
                                        f"{hold.refused} ({self.path.holds_refused} refused so far){suffix}")

    def _act(self, frame: InputFrame, narrate: bool, age_s: float):
        """The chunk (the camera frame_id travels as its context, for the narration) and the robot's absolute
        command [H, joints (x2 with velocities)] the robot's session makes of it (`robots.session`)."""
        if self.remote is not None:  # the reply: openpi's actions, made the robot's command as the session makes one
            chunk = self.remote.act(frame.images, frame.state, self.instruction.text)
            embodiment = self.params.embodiment
            return chunk, embodiment.actions_to_robot(embodiment.openpi_to_model(chunk.actions, frame.state),
                                                      frame.state).stacked()
        start = time.perf_counter()  # the chunk's latency includes preprocessing
        # the frame's state in the model's space, for real-time chunking only (the session makes its own)
        model_state = self.params.embodiment.state_to_model(frame.state) if self.rtc is not None else None
        queued, fitted = self.session.frame(frame.images, frame.state, narrate, stamp_ns=frame.stamp_ns,
                                            age_s=age_s, context=frame.frame_id, arrival=start,
                                            committed=self._rtc_request(frame.stamp_ns, model_state))
        # the prompt must fit max_token_len with this instruction and state: shortened before acting if need be
        if fitted == "cut":
            self.get_logger().warning(f"instruction too long for the model's prompt; using {self.instruction.text!r}")
        elif fitted == "previous":
            self.get_logger().warning(f"no part of the instruction fits the model's prompt; keeping the previous task "
                                      f"{self.instruction.text!r}")
        chunk = self.runtime.act(queued)
        if self.rtc is not None:  # the delay this chunk had: control steps from its frame's stamp to now
            self.rtc.arrived(frame.stamp_ns, self.get_clock().now().nanoseconds)
            self._rtc_state = model_state
        return chunk, self.session.command(chunk, frame.state)

    def _rtc_request(self, stamp_ns: int, state: np.ndarray):
        """With rtc_guided: the chunk being executed and the estimated delay for this frame, or None (sampled
        plainly; a bad request is logged, every plain frame counted by reason in `rtc_plain_*`)."""
        if self.rtc is None:
            return None
        request = self.rtc.request(stamp_ns, state)
        if not isinstance(request, Plain):
            return request
        if request.kind in REFUSED and (suffix := self._throttled(("rtc", request.kind))) is not None:
            self.get_logger().warning(f"real-time chunking: frame sampled without guidance ({request.kind}): "
                                      f"{request.detail} ({self.rtc.plain[request.kind]} so far){suffix}")
        return None

    def _throttled(self, key) -> str | None:
        """None if a line of this kind went out less than LOG_THROTTLE_S ago, else the line's suffix.

        (Each severity needs its own logging call site: rclpy refuses one site logging at two severities.)"""
        held = self._log.allow(key)
        return None if held is None else LogThrottle.suffix(held)

    def _should_narrate(self) -> bool:
        policy = self.params.language_policy
        if self.remote is not None:  # narration is not carried through a remote engine
            return False
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
        if update.final:
            self._narration_ended(update)
        if self.lifecycle != "active":  # a narration still decoding when the node was deactivated
            return
        self.narration_pub.publish(msg)
        self.narrations_published += 1
        if update.final:
            self.markers.narration(update.text, update.stamp_ns)

    def _narration_ended(self, update: TextUpdate) -> None:
        """A narration the text head ended with non-finite logits is a model error of the language path (ERROR on
        /diagnostics until a narration ends well); its text so far still goes out, final."""
        if update.finish_reason != "nonfinite":
            self.language_error = None
            return
        self.language_errors += 1
        self.language_error = (f"narration {update.request_id} ended after {update.num_tokens} tokens: the text head "
                               f"gave non-finite logits ({self.language_errors} such narrations so far)")
        if (suffix := self._throttled("language")) is not None:
            self.get_logger().error(f"{self.language_error}{suffix}")

    # ---- monitoring ---------------------------------------------------------------------------------------------

    def health(self) -> Health:
        safety = {"lifecycle": self.lifecycle, "configure_error": self.failure or "none", **self.path.counts()}
        if self.runtime is None and self.remote is None:  # not configured: no engine to report on
            return Health(state=self.state, detail=self.detail, stats=NO_STATS, target_rate_hz=self.params.rate_hz,
                          actions_published=self.actions_published, dropped_frames=0, values=safety)
        worker_error = self.runtime.worker_error if self.runtime is not None else None
        overhead = [t - a for t, a in zip(self._tick_times, self._act_times, strict=True)]
        drops = self.inputs.drop_counts()
        image_age, state_age = self.inputs.image_age_ns, self.inputs.state_age_ns
        return Health(
            state=self.state, detail=self.detail, stats=self.runtime.stats() if self.runtime is not None else NO_STATS,
            target_rate_hz=self.params.rate_hz,
            actions_published=self.actions_published, dropped_frames=sum(drops.values()),
            worker_error=f"{type(worker_error).__name__}: {worker_error}" if worker_error else None,
            language_error=self.language_error,
            values={
                **safety,
                "language_errors": self.language_errors,
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
                "nonfinite_chunks": self.path.nonfinite_chunks + self.path.overflows,
                "handover": self.params.handover,
                "resets": self.resets,
                **(self.rtc.counts() if self.rtc is not None else {}),
                **(self.remote.counts() if self.remote is not None else {}),
                "chunks_unused": self.path.chunks_unused,
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


def _shown(text: str, limit: int = 200) -> str:
    """A task for a log line: its first `limit` characters (an instruction may be a megabyte long)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def main(argv: Sequence[str] | None = None) -> int:
    return run_managed(VlaNode, NODE_NAME, sys.argv[1:] if argv is None else argv)
