"""Fleet server node: one process serving many robots, by namespace, from co-located models on one device.

A thin layer over `fleet.server.FleetServer` (the engine's runtime with many robots and models). For each robot
namespace ``ns`` in ``robots`` (its model in the parallel ``robot_models``) the node subscribes
``/<ns>/camera/<cam>/image_raw`` (or ``.../image_raw/compressed`` with ``compressed``) for every camera of the
robot's model, ``/<ns>/joint_states`` and ``/<ns>/instruction`` (latched), and publishes ``/<ns>/action_chunk``
(header stamp = the source frame's stamp), ``/<ns>/narration`` and ``/<ns>/engine_status``, plus one status per
robot on ``/diagnostics``. The inputs go through the same checks as the VLA node's (`FrameInputs`: encodings,
stale frames, joints picked by name, bad messages counted), the prompt is fitted before the frame is queued,
chunks and diagnostics are built by the same helpers.

Each robot has an embodiment profile (``embodiments``: one for all, or one per entry of ``robots``;
`control.embodiment`, as the VLA node's ``embodiment``): its state goes to the model through it, and each chunk
leaves as the robot's absolute command made from the state of the frame the model saw (deltas added, velocities
integrated and filled in, signs and units), with the profile's time step between points (``action_dt`` for a
profile that names no rate). A profile that does not fit what a robot's checkpoint says it was trained on stops
start-up unless ``embodiment_override``; one whose widths do not fit the robot's joints is checked at start-up when
``joint_names`` is given, else at the robot's first joint state (its frames are then refused, counted, logged).

Each chunk then goes through the robot's command path (`oxygen_ros.robots.command_path`, as the VLA node's): the
hand-over, one JointTrajectory per output group on ``/<ns>/<group topic>`` in the controller's units, the joint
limits (clamped or refused); a robot no longer commanded (a refused plan, a model error, stale inputs found by the
input check every 1 / ``rate_hz``, deactivation, exit) gets one hold per group. A robot's parameters are the VLA
node's (``robot_description``, ``robot_description_wait_s`` from ``/<ns>/robot_description``, ``limits.policy``,
``joints.state_rename``, ``joints.state_convert``, ``output.groups``, ``output.<group>.*``) and ``joint_names``:
the node's value, or the robot's own ``per_robot.<robot>.<parameter>`` (`fleet_parameters`); its joint states go
through its rename and conversion before the model, the holds and ``max_jump`` see them. The hand-over's are one
setting for the node (`docs/safety.md`).
With ``output.handover: rtc_guided`` each robot's frames are guided toward the chunk it is executing with its own
measured delay (`robots.rtc_guide`: control steps from a frame's stamp to its chunk's arrival), guided and plain
robots of one model in the same batches; a request that cannot be guided is sampled plainly, counted and logged.
``/<ns>/reset`` (std_srvs/Trigger) starts an episode of that robot as the VLA node's ``~/reset`` does (held, the
hand-over and its guide forget the executed chunk, its inputs stamped up to the call dropped); a chunk of a frame
stamped before the call that is still being computed is not published (``chunks_before_reset``).

Every image on the first camera of a robot's model makes one frame, due at its header stamp + the robot's SLO;
frames of robots on the same model are batched, and every ``narrate_every``-th frame of a robot also starts a
narration. ``design`` says how a batch uses the device (`fleet.server`): ``monolithic`` (default: prefill and
denoise in one call on the whole device, models by the ``queue`` policy), ``robion`` (lockstep stage split on
shares chosen per lockstep from a profile table with ``guard``, raised to the slowdown of the two stages side by
side measured with the table) or ``disaggregated`` (static stage split): planners of the engine's one scheduler,
each with the ``queue`` policy. A stage split reads its table from ``profile_file`` or profiles the served models
at start-up (``profile_repeats`` per entry); ``monolithic`` predicts its batches from ``profile_file`` when given,
else from what it measures as it serves. Narration works in every design. Chunks are published from the runtime's control thread, narration
from its language worker. A frame already past its deadline on arrival is not served, a queued frame whose
deadline passes before it is computed is dropped unserved, and a chunk ready after its deadline is not published
(``publish_late``: published all the same, with its stamp); all are counted in the robot's ``engine_status``
(``deadline_misses``, ``dropped_frames``) and, with its SLO attainment, on ``/diagnostics``.

Several GPUs: one node per GPU with the same ``assignment_file`` (``oxygen-ros fleet-assign``) and its own
``gpu_index``; each node serves exactly the robots assigned to its GPU, each with its model and SLO from the file,
loads only those robots' models, and with ``device: cuda`` runs on ``cuda:<gpu_index>``, so the ROS graph is the
only link.

A fleet placed live across machines runs on Ray Serve instead (`oxygen-ros fleet-ray`, docs/ray.md): its robots
run the VLA node with ``engine.remote``.

Parameters: the tables in docs/fleet.md (`fleet_parameters.FLEET_SPECS`; the engine's under the fleet node's names,
`robots.engine_params`; the robot parameters, per robot).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m`: catch the stop signals before the imports below (seconds)
    from oxygen_ros.nodes.entry import run

    sys.exit(run("fleet_node"))

import threading
from collections.abc import Sequence
from dataclasses import replace

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.control.embodiment import Embodiment, EmbodimentError, load_embodiment
from oxygen_ros.control.handover import HANDOVERS, RTC_GUIDED
from oxygen_ros.control.joint_groups import TRAJECTORY
from oxygen_ros.engine.runtime import ActionChunk, Runtime, TextUpdate
from oxygen_ros.fleet.device import serving_device
from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.profile_table import ProfileTable
from oxygen_ros.fleet.server import FleetServer, ServedRobot, served_robots
from oxygen_ros.fleet.traffic import load_assignment
from oxygen_ros.msg import EngineStatus, Narration
from oxygen_ros.robots.command_path import LIMIT_REJECTED, LIMITS, PAST, UNUSED, CommandPath, Refusal
from oxygen_ros.robots.engine import build_fleet, embodiment_fit
from oxygen_ros.robots.engine_params import Reader
from oxygen_ros.robots.instruction import Instruction
from oxygen_ros.robots.output_params import command_path, read_rtc
from oxygen_ros.robots.rtc_guide import REFUSED, Plain, RtcGuide, rtc_guide
from oxygen_ros.robots.session import RobotSession
from oxygen_ros.robots.state_check import StateCheck

from .command_messages import plan_messages
from .conversions import ConversionError, ImageLimits, ns_to_stamp
from .diagnostics import CONFIGURE_FAILED, NO_STATS, Health, diagnostic_array, engine_status
from .fleet_parameters import FLEET_SPECS, fleet_engine, read_fleet, robot_parameters
from .frame_inputs import (
    MODEL_ERROR,
    RUNNING,
    SKIPPED_TICK_STATES,
    STALE_FRAME,
    WAITING_FOR_CAMERA,
    FrameInputs,
    InputLimits,
)
from .holds import hold_message
from .managed_node import ManagedNode
from .managed_node import main as run_managed
from .parameters import (
    AUTOSTART,
    ParameterError,
    declare,
    declare_output_parameters,
    read_units,
)
from .qos import LATCHED_QOS, SENSOR_QOS

NODE_NAME = "fleet_server"
# a robot's states after a chunk of its was refused, as the VLA node's after such a tick: reported until a chunk of
# the robot is published (a frame taken meanwhile does not make it `running`)
CHUNK_REFUSED = (MODEL_ERROR, LIMIT_REJECTED)
LOG_THROTTLE_S = 5.0
MAX_INSTRUCTION_CHARS = 2000
def robot_command_path(values: dict, joint_names: tuple[str, ...], embodiment: Embodiment, time_step_s: float
                       ) -> CommandPath:
    """One robot's command path (`output_params.command_path`: its joints are its state and action alike, the
    fleet node's robots command the joints they report), its group topics in its namespace."""
    path = command_path(values, joint_names, embodiment, time_step_s)
    absolute = [g.name for g in path.groups if g.topic.startswith("/")]
    if absolute:
        raise ParameterError(f"output.{absolute[0]}.topic must be relative: each robot's goes in its namespace")
    return path


class RobotPort:
    """One robot as the node sees it: its inputs, counters and publishers, all in its namespace."""

    def __init__(self, node: Node, runtime: Runtime, namespace: str, robot: ServedRobot, cameras: Sequence[str],
                 compressed: bool, joint_names: tuple[str, ...], limits: InputLimits, instruction: str,
                 embodiment: Embodiment, output: dict, time_step_s: float):
        self.node, self.runtime = node, runtime
        self.session: RobotSession | None = None  # made with the inputs, once the robot's joints are known
        self.output, self.time_step_s = output, time_step_s
        self.path: CommandPath | None = None  # made with the inputs, once the robot's joints are known
        self.rtc: RtcGuide | None = None  # with handover rtc_guided: its real-time chunking (`robots.rtc_guide`)
        self.group_pubs: list = []
        self.namespace = namespace
        self.robot = robot
        self.embodiment = embodiment
        self.cameras = tuple(cameras)
        self.compressed = compressed
        self.limits = limits
        self.joint_names = joint_names
        self.instruction = Instruction(instruction, MAX_INSTRUCTION_CHARS)
        self.inputs = self.frame_inputs(joint_names) if joint_names else None
        self.state = WAITING_FOR_CAMERA
        self.detail = ""
        self.frames = 0
        self.actions_published = 0
        self.narrations_published = 0
        self.model_errors = 0
        self.resets = 0  # episodes started by /<ns>/reset
        self.chunks_before_reset = 0  # chunks of frames stamped before the last reset, not published
        self.closed = False  # its publishers are gone (the node's cleanup)
        self.subscriptions: list = []
        self.lock = threading.Lock()  # the executor thread and the runtime's threads both touch the counters
        self.chunk_pub = node.create_publisher(JointTrajectory, f"{namespace}/action_chunk", 10)
        self.narration_pub = node.create_publisher(Narration, f"{namespace}/narration", 50)
        self.status_pub = node.create_publisher(EngineStatus, f"{namespace}/engine_status", 10)

    @property
    def publishers(self) -> list:
        return [self.chunk_pub, self.narration_pub, self.status_pub, *self.group_pubs]

    def camera_topic(self, camera: str) -> str:
        return f"{self.namespace}/camera/{camera}/image_raw"

    def frame_inputs(self, joint_names: tuple[str, ...]) -> FrameInputs:
        """The VLA node's input rules for this robot, its state picked by `joint_names` (checked against its
        embodiment: EmbodimentError; against the output groups: ParameterError), and its command path with one
        publisher per output group, in its namespace."""
        self.embodiment.check_joints(joint_names, joint_names)
        path = robot_command_path(self.output, joint_names, self.embodiment, self.time_step_s)
        self.group_pubs = [self.node.create_publisher(JointTrajectory if g.interface == TRAJECTORY
                                                      else Float64MultiArray, f"{self.namespace}/{g.topic}", 10)
                           for g in path.groups]
        self.path = path
        self.session = RobotSession(self.runtime, self.embodiment, self.instruction, len(joint_names),
                                    self.robot.model_id)
        return FrameInputs(tuple(self.camera_topic(c) for c in self.cameras), self.cameras,
                           (self.compressed,) * len(self.cameras), joint_names, self.limits,
                           StateCheck(path.groups, path.limits, joint_names), read_units(self.output, joint_names))


class FleetNode(ManagedNode):
    """The lifecycle of `managed_node`, as the VLA node's: `configure` loads the models, starts the server and
    subscribes; `activate` starts serving (frames taken, chunks published); `deactivate` stops it and holds every
    robot; `cleanup` and `shutdown` release the server."""

    def __init__(self, context=None):
        super().__init__(NODE_NAME, context=context)
        try:
            self.params = read_fleet({spec.name: declare(self, spec) for spec in FLEET_SPECS})
            self.engine = fleet_engine(self.params)
            self.autostart_param = declare(self, AUTOSTART)
            self.output = declare_output_parameters(self)
        except BaseException:
            self.destroy_node()
            raise
        self._check_timer = None
        self.server: FleetServer | None = None
        self.ports: dict[str, RobotPort] = {}
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(1.0 / self.params["status_rate_hz"], self._publish_status)
        self.reset_services = [self.create_service(Trigger, f"/{robot}/reset",
                                                   lambda request, response, r=robot: self._on_reset(r, response))
                               for robot in self.params["robots"]]

    # ---- lifecycle (`managed_node`) ------------------------------------------------------------------------------

    def _start_acting(self) -> None:
        for port in self.ports.values():
            with port.lock:
                if port.path is not None:  # nothing planned before this activation is blended into what follows
                    port.path.start()

    def _stop_acting(self, reason: str) -> None:
        self._hold_all(reason)

    def _on_reset(self, robot_id: str, response):
        """`/<robot>/reset` (std_srvs/Trigger): an episode of that robot starts, as the VLA node's `~/reset`."""
        port = self.ports.get(robot_id)
        if port is None or self.lifecycle not in ("inactive", "active"):
            response.success, response.message = False, f"robot {robot_id} is not served here now ({self.lifecycle})"
            return response
        since_ns = self.get_clock().now().nanoseconds
        self._hold(port, "reset")  # (its guide, if any, stops there: the next chunk is sampled plainly)
        with port.lock:
            if port.path is not None:
                port.path.start()
            if port.inputs is not None:
                port.inputs.forget(since_ns)
            port.resets += 1
            port.state, port.detail = WAITING_FOR_CAMERA, "reset: waiting for the new episode's first frame"
        self.get_logger().info(f"{port.namespace}: reset ({port.resets} so far): frames stamped up to "
                               f"{since_ns / 1e9:.3f} s are the previous episode's",
                               throttle_duration_sec=LOG_THROTTLE_S)
        response.success, response.message = True, f"reset at {since_ns} ns (node clock)"
        return response

    def _release_engine(self) -> None:
        if self._check_timer is not None:
            self.destroy_timer(self._check_timer)
            self._check_timer = None
        if self.server is not None:
            self.worker_error = self.server.runtime.worker_error  # kept for the exit status
            self.server.close()
            if self.lifecycle != "unconfigured":  # not a configure that failed: its reason is the one line
                published = sum(p.actions_published for p in self.ports.values())
                self.get_logger().info(f"published {published} action chunks")
            self.server = None
        for port in self.ports.values():
            if not port.closed:
                self._entities += [*port.subscriptions, *port.publishers]
                port.closed = True
        self.ports = {}

    def _configure(self) -> None:
        p = self.params
        specs = [ModelSpec.parse(text) for text in p["models"]]
        assignment = load_assignment(p["assignment_file"]) if p["assignment_file"] else None
        served = served_robots(p["robots"], p["robot_models"], p["slo_ms"] / 1e3, assignment, p["gpu_index"])
        device = serving_device(p["device"], p["gpu_index"])
        per_model = max([sum(r.model_id == s.model_id for r in served) for s in specs] + [1])
        staged = p["design"] != "monolithic"
        # a stage split holds frames between their stages: room for a few batches, or two frames per robot
        frame_slots = max(4 * p["max_batch"], p["max_batch"] + 2 * per_model) if staged else p["max_batch"]
        output = Reader(self.output)  # real-time chunking's settings, for every robot (handover rtc_guided)
        self.handover, self.rtc = output.choice("output.handover", HANDOVERS), read_rtc(output)
        self.server = build_fleet(
            self.engine, specs, served, device=device, max_batch=p["max_batch"], queue=p["queue"],
            pool_slots=p["pool_slots"] or frame_slots + max(2, per_model), frame_slots=frame_slots,
            on_chunk=self._publish_chunk, on_text=self._publish_text, publish_late=p["publish_late"],
            design=p["design"], profile=ProfileTable.load(p["profile_file"]) if p["profile_file"] else None,
            cuda_graphs=p["cuda_graphs"], guard=p["guard"], cpu_threads=p["cpu_threads"] or None,
            profile_repeats=p["profile_repeats"],
            rtc=self.rtc.engine_config() if self.handover == RTC_GUIDED else None)
        self.device = device
        # how a batch uses the device, for /diagnostics
        if staged:
            source = p["profile_file"] or "profiled at start-up"
            self.batching = (f"{p['design']}: stage batches on device shares ({self.server.partition_mode}), "
                             f"table {source}, guard {self.server.guard:.2f} (parameter {p['guard']}, raised to the "
                             f"measured co-run slowdown), queue {p['queue']}, buckets up to "
                             f"{p['max_batch']}")
        else:
            self.batching = (f"monolithic: whole device per batch (prefill + denoise in one call), queue "
                             f"{p['queue']}, buckets up to {p['max_batch']}")
        embodiments = robot_embodiments(p["robots"], p["embodiments"], served)
        for robot in served:
            self._add_robot(robot, embodiments[robot.robot_id])
        self._check_timer = self.create_timer(1.0 / p["rate_hz"], self._check_inputs)
        self.server.start()
        slos = {r.robot_id: r.slo_s * 1e3 for r in served}
        self.get_logger().info(f"serving {sorted(self.ports)} with models {self.server.model_ids} on {device} "
                               f"(gpu_index {p['gpu_index']}, design {p['design']}, queue {p['queue']}, "
                               f"max_batch {p['max_batch']}, cpu kernel {self.server.cpu_kernel}, "
                               f"SLO ms {slos})")

    def _add_robot(self, robot: ServedRobot, embodiment: Embodiment) -> RobotPort:
        """A robot served here: its parameters, its profile checked against its model, its port, subscriptions and
        publishers; ValueError naming the robot."""
        p = self.params
        namespace = "/" + robot.robot_id
        model = self.server.model_config(robot.robot_id)
        cameras = model.camera_names
        limits = InputLimits(max_image_age_s=p["max_image_age_s"], max_state_age_s=p["max_state_age_s"],
                             future_tolerance_s=p["future_tolerance_s"],
                             images=ImageLimits(p["max_pixels"], model.vision.image_size, model.image_crops))
        try:
            values, joint_names = robot_parameters(self, robot.robot_id,
                                                   {**self.output, "joint_names": self.params["joint_names"]})
        except ParameterError as err:
            raise ValueError(f"robot {robot.robot_id}: {err}") from None
        warning = embodiment_fit(embodiment, self.server.trained_on[robot.model_id], joint_names,
                                 p["embodiment_override"], f"model {robot.model_id}", robot.robot_id)
        if warning:
            self.get_logger().warning(f"{warning} (starting: embodiment_override is true)")
        try:
            port = RobotPort(self, self.server.runtime, namespace, robot, cameras, p["compressed"], joint_names,
                             limits, p["instruction"], embodiment, values, embodiment.time_step or p["action_dt"])
        except (EmbodimentError, ParameterError) as err:
            raise ValueError(f"robot {robot.robot_id}: {err}") from None
        model = self.server.model_config(robot.robot_id)
        port.rtc = rtc_guide(self.handover, self.rtc, round(port.time_step_s * 1e9), model.action_horizon, model,
                             embodiment, self.server.runtime.served[robot.model_id].norm_stats)
        self.ports[robot.robot_id] = port
        for index, camera in enumerate(cameras):
            topic = port.camera_topic(camera)
            port.subscriptions.append(self.create_subscription(
                CompressedImage if port.compressed else Image, f"{topic}/compressed" if port.compressed else topic,
                lambda msg, port=port, i=index: self._on_image(port, i, msg), SENSOR_QOS))
        port.subscriptions.append(self.create_subscription(
            JointState, f"{namespace}/joint_states", lambda m, p=port: self._on_joints(p, m), SENSOR_QOS))
        port.subscriptions.append(self.create_subscription(
            String, f"{namespace}/instruction", lambda m, p=port: p.instruction.set(m.data), LATCHED_QOS))
        return port

    # ---- inputs (executor thread) -------------------------------------------------------------------------

    def _warn_drop(self, port: RobotPort, message: str) -> None:
        self.get_logger().warning(f"{port.namespace}: dropped input: {message}", throttle_duration_sec=LOG_THROTTLE_S)

    def _on_joints(self, port: RobotPort, msg: JointState) -> None:
        if port.inputs is None:  # no joint_names given: this robot's joints are those of its first message
            try:
                port.inputs = port.frame_inputs(tuple(msg.name))
            except (EmbodimentError, ParameterError) as err:
                with port.lock:
                    port.model_errors += 1
                    port.state, port.detail = MODEL_ERROR, f"its joints do not fit: {err}"
                self._warn_drop(port, f"joint_states: {port.detail}")
                return
            port.joint_names = tuple(msg.name)
        try:
            port.inputs.on_joint_state(msg, self.get_clock().now().nanoseconds)
        except ConversionError as err:
            self._warn_drop(port, f"joint_states: {err}")

    def _on_image(self, port: RobotPort, index: int, msg) -> None:
        if self.lifecycle != "active":
            return  # configured, not serving: no frame is queued
        if port.inputs is None:
            return  # no joint names known yet: nothing to pick the state by
        now_ns = self.get_clock().now().nanoseconds
        try:
            port.inputs.on_image(index, msg, now_ns)
        except ConversionError as err:
            self._warn_drop(port, f"{port.cameras[index]}: {err}")
            return
        if index != 0:
            return
        port.inputs.decode_pending()  # here, not on a thread: a frame is queued with its deadline, not acted on
        decision = port.inputs.next_frame(now_ns)
        frame = decision.frame
        for dropped in decision.dropped:
            self._warn_drop(port, f"{dropped.source}: {dropped.reason}: {dropped.message}")
        with port.lock:
            if frame is None:
                port.state, port.detail = decision.state, decision.detail
            elif port.state not in CHUNK_REFUSED:  # a refused chunk's state stands until a chunk is published
                port.state, port.detail = decision.state, ""
        if frame is None:
            self._hold(port, decision.state)
            return
        observation, fitted = port.session.observation(frame.images, frame.state)
        if fitted is not None:
            self.get_logger().warning(f"{port.namespace}: instruction does not fit the prompt; using "
                                      f"{port.instruction.text!r}")
        every = self.params["narrate_every"]
        narrate = every > 0 and port.frames % every == 0
        age_s = (now_ns - frame.stamp_ns) / 1e9
        committed = self._rtc_request(port, frame.stamp_ns, frame.state)
        try:
            queued = self.server.submit(port.robot.robot_id, observation, narrate, frame.stamp_ns, age_s,
                                        context=(frame.frame_id, frame.state),
                                        committed=committed)
        except ValueError as err:
            with port.lock:
                port.model_errors += 1
                port.state, port.detail = MODEL_ERROR, str(err)
            self._warn_drop(port, str(err))
            return
        if not queued:
            self._warn_drop(port, f"frame {1e3 * age_s:.0f} ms old on arrival, past its {1e3 * port.robot.slo_s:g} "
                                  "ms deadline (counted as a deadline miss)")
            return
        port.frames += 1

    def _rtc_request(self, port: RobotPort, stamp_ns: int, state):
        """With rtc_guided: the chunk the robot is executing and its estimated delay for this frame (`state`: the
        frame's, robot units), or None (sampled plainly; a bad request is logged, every plain frame counted by
        reason in `rtc_plain_*`)."""
        if port.rtc is None:
            return None
        model_state = port.embodiment.state_to_model(state)
        with port.lock:
            request = port.rtc.request(stamp_ns, model_state)
        if not isinstance(request, Plain):
            return request
        if request.kind in REFUSED:
            self._warn_drop(port, f"real-time chunking: frame sampled without guidance ({request.kind}): "
                                  f"{request.detail} (counted)")
        return None

    # ---- outputs (the runtime's threads) ----------------------------------------------------------------------

    def _port_of(self, robot_id: str) -> RobotPort | None:
        """The port whose publishers a robot's output leaves by."""
        return self.ports.get(robot_id)

    def _publish_chunk(self, chunk: ActionChunk) -> None:
        """The robot's absolute command through its command path (`robots.command_path`), as the VLA node's: a
        chunk refused there is not published, and the robot is held (except for one the hand-over cannot use)."""
        port = self._port_of(chunk.robot_id)
        if port is None or self.lifecycle != "active":
            return  # a chunk still computing when the node was deactivated, or of a robot gone
        if chunk.error is not None:
            with port.lock:
                port.model_errors += 1
                port.state, port.detail = MODEL_ERROR, f"{type(chunk.error).__name__}: {chunk.error}"
            self.get_logger().error(f"{port.namespace}: {port.detail}", throttle_duration_sec=LOG_THROTTLE_S)
            self._hold(port, MODEL_ERROR)
            return
        _, state = chunk.context
        command = port.session.command(chunk, state)
        with port.lock:
            if port.closed or self.lifecycle != "active" or port.state in SKIPPED_TICK_STATES:
                return  # deactivated meanwhile, or the robot's inputs went stale since its frame (it is held)
            if port.inputs.since_ns is not None and chunk.stamp_ns <= port.inputs.since_ns:
                port.chunks_before_reset += 1  # the previous episode's, computed across the reset
                return
            path = port.path
            now_ns = self.get_clock().now().nanoseconds
            if port.rtc is not None:  # the delay this chunk had: control steps from its frame's stamp to now
                port.rtc.arrived(chunk.stamp_ns, now_ns)
            result = path.command(command, chunk.stamp_ns + path.step_ns, now_ns, port.inputs.state)
            if not isinstance(result, Refusal):
                if port.rtc is not None:  # the robot executes this chunk now
                    port.rtc.executing(chunk.actions, chunk.stamp_ns, port.embodiment.state_to_model(state))
                trajectory, outputs = plan_messages(result, path.action_names, path.groups, path.time_step_s)
                port.state, port.detail = RUNNING, ""
                port.chunk_pub.publish(trajectory)
                for publisher, msg in zip(port.group_pubs, outputs, strict=True):
                    publisher.publish(msg)
                port.actions_published += 1
                return
            if result.kind == UNUSED:  # the plan already published still stands
                self.get_logger().warning(f"{port.namespace}: acted chunk not published: {result.detail}",
                                          throttle_duration_sec=LOG_THROTTLE_S)
                return
            if result.kind not in (LIMITS, PAST):
                port.model_errors += 1
            port.state = {LIMITS: LIMIT_REJECTED, PAST: STALE_FRAME}.get(result.kind, MODEL_ERROR)
            port.detail = result.detail
        self.get_logger().error(f"{port.namespace}: {port.detail}", throttle_duration_sec=LOG_THROTTLE_S)
        self._hold(port, port.state)

    def _hold(self, port: RobotPort, reason: str) -> None:
        """One hold to each of the robot's groups being commanded (`holds`); nothing if none is."""
        with port.lock:
            if port.path is None or port.closed:
                return
            due = port.path.stop(reason, port.inputs.state)
            if port.rtc is not None:  # holding: the next chunk is sampled plainly
                port.rtc.stop()
            groups = port.path.groups
            for hold in due:
                if not hold.refused:
                    port.group_pubs[hold.group].publish(hold_message(groups[hold.group].joints, hold.mode,
                                                                     hold.positions, port.path.time_step_s))
        sent = [groups[hold.group].name for hold in due if not hold.refused]
        if sent:
            self.get_logger().info(f"{port.namespace}: holding {', '.join(sent)}: {reason}",
                                   throttle_duration_sec=LOG_THROTTLE_S)
        for hold in due:
            if hold.refused:
                self.get_logger().error(f"{port.namespace}: no hold sent to {groups[hold.group].name} ({reason}): "
                                        f"{hold.refused}", throttle_duration_sec=LOG_THROTTLE_S)

    def _hold_all(self, reason: str) -> None:
        for port in self.ports.values():
            self._hold(port, reason)

    def _check_inputs(self) -> None:
        """Every control period (1 / rate_hz) while active: a robot whose inputs went stale is held, as the VLA
        node's control tick holds its robot (frames come with images; a camera gone silent makes none)."""
        if self.lifecycle != "active":
            return
        now_ns = self.get_clock().now().nanoseconds
        for port in list(self.ports.values()):
            if port.inputs is None:
                continue
            decision = port.inputs.next_frame(now_ns)
            for dropped in decision.dropped:
                self._warn_drop(port, f"{dropped.source}: {dropped.reason}: {dropped.message}")
            if decision.state in SKIPPED_TICK_STATES:
                with port.lock:
                    port.state, port.detail = decision.state, decision.detail
                self._warn_drop(port, f"not acting ({decision.state}): {decision.detail}")
                self._hold(port, decision.state)

    def _publish_text(self, update: TextUpdate) -> None:
        port = self._port_of(update.robot_id)
        if port is None:
            return  # the narration of a robot whose node was cleaned up
        msg = Narration(request_id=update.request_id, text=update.text, num_tokens=update.num_tokens,
                        final=update.final)
        msg.header.stamp = ns_to_stamp(update.stamp_ns)
        msg.header.frame_id = update.context[0]
        with port.lock:
            if port.closed:
                return
            port.narration_pub.publish(msg)
            port.narrations_published += 1

    def health(self) -> Health:
        """The node's own status while it serves no robot (not configured), as the VLA node's then."""
        return Health(state=CONFIGURE_FAILED if self.failure else self.lifecycle,
                      detail=self.failure or "configure to serve", stats=NO_STATS,
                      target_rate_hz=self.params["rate_hz"], actions_published=0, dropped_frames=0,
                      values={"lifecycle": self.lifecycle, "configure_error": self.failure or "none"})

    def _publish_status(self) -> None:
        stamp = self.get_clock().now().to_msg()
        if self.server is None:  # not configured: one status for the node, saying so
            self.diagnostics_pub.publish(diagnostic_array(self.health(), stamp, f"{self.get_fully_qualified_name()}"
                                                          ": fleet engine", self.params["device"]))
            return
        worker_error = self.server.runtime.worker_error
        for robot_id, port in self.ports.items():
            counts = self.server.robot_counts(robot_id)
            late = counts.late_on_arrival + counts.late_done + counts.expired_in_queue
            dropped = counts.late_on_arrival + counts.expired_in_queue + \
                (0 if self.params["publish_late"] else counts.late_done)
            with port.lock:
                health = Health(
                    state=port.state, detail=port.detail,
                    stats=replace(self.server.stats(robot_id), deadline_misses=late),
                    target_rate_hz=self.params["rate_hz"], actions_published=port.actions_published,
                    dropped_frames=(port.inputs.dropped_frames if port.inputs else 0) + dropped,
                    worker_error=f"{type(worker_error).__name__}: {worker_error}" if worker_error else None,
                    values={"narrations_published": port.narrations_published, "model_errors": port.model_errors,
                            "model": port.robot.model_id, "slo_ms": f"{1e3 * port.robot.slo_s:g}",
                            "slo_attainment": f"{counts.attainment:.4f}", "chunks_on_time": counts.on_time,
                            "late_on_arrival": counts.late_on_arrival, "late_chunks": counts.late_done,
                            "expired_in_queue": counts.expired_in_queue,
                            "late_chunks_published": self.params["publish_late"],
                            "batching": self.batching, "lifecycle": self.lifecycle, "resets": port.resets,
                            "chunks_before_reset": port.chunks_before_reset,
                            **(port.path.counts() if port.path else {}),
                            **(port.rtc.counts() if port.rtc else {}),
                            "nonfinite_chunks": port.path.nonfinite_chunks + port.path.overflows if port.path
                            else 0})
            port.status_pub.publish(engine_status(health, stamp))
            self.diagnostics_pub.publish(diagnostic_array(health, stamp, f"{port.namespace}: fleet engine",
                                                          self.device))


def robot_embodiments(robots: Sequence[str], names: Sequence[str], served: Sequence[ServedRobot]
                      ) -> dict[str, Embodiment]:
    """Each served robot's profile: `names` has one for all, or one per entry of `robots`; ValueError otherwise."""
    try:
        profiles = [load_embodiment(name) for name in names]
    except EmbodimentError as err:
        raise ValueError(f"embodiments: {err}") from None
    if len(profiles) == 1:
        return {r.robot_id: profiles[0] for r in served}
    if len(profiles) != len(robots):
        raise ValueError(f"embodiments has {len(profiles)} entries for {len(robots)} robots: give one for all or "
                         "one per robot")
    by_name = {r.strip("/"): p for r, p in zip(robots, profiles, strict=True)}
    missing = [r.robot_id for r in served if r.robot_id not in by_name]
    if missing:
        raise ValueError(f"no embodiment for robots {missing} (embodiments follows robots)")
    return {r.robot_id: by_name[r.robot_id] for r in served}


def main(argv: Sequence[str] | None = None) -> int:
    return run_managed(FleetNode, NODE_NAME, sys.argv[1:] if argv is None else argv)
