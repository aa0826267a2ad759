"""The VLA node's ROS parameters: one table of names, defaults and descriptions, declared read-only, validated.

Parameters are read once at start-up (the model, the KV pool and the subscriptions depend on them), so each is
declared `read_only`: `ros2 param set` then fails loudly instead of changing nothing. Floating-point parameters
accept integers too (`rate_hz: 50` in YAML, `-p control.rate_hz:=20` on the command line). Validation happens in
two steps: `read_parameters` checks each value on its own, `check_against_model` checks what depends on the
model (camera keys, state/action widths, horizon). Every error names the parameter and what would be accepted.

Output groups are named by `output.groups`; each group's own parameters (`output.<group>.joints`, `.topic`,
`.scale`, `.offset`, its hold and its joints' limits) are declared once those names are known
(`declare_parameters`). Limits not given for a group's joints come from `robot_description` when it is set (the
URDF text, as robot_state_publisher takes it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import (
    InvalidParameterTypeException,
    InvalidParameterValueException,
    ParameterUninitializedException,
)
from rclpy.parameter import Parameter

from oxygen_ros.control.embodiment import Embodiment, EmbodimentError, load_embodiment
from oxygen_ros.control.handover import HANDOVERS
from oxygen_ros.control.joint_groups import JointGroup
from oxygen_ros.control.limits import POLICIES as LIMIT_POLICIES
from oxygen_ros.control.limits import JointLimits
from oxygen_ros.model.normalization import ACTION_KEY, STATE_KEY, as_normalization
from oxygen_ros.robots.engine_params import (
    ENGINE,
    OPTIONAL,
    REQUIRED,
    EngineParams,
    ParameterError,
    Reader,
    Spec,
    read_engine,
)
from oxygen_ros.robots.output_params import (
    GROUP_FIELDS,
    GROUP_SPECS,
    OUTPUT,
    check_velocity_groups,
    group_names,
    read_groups,
    read_limits,
    read_rtc,
)
from oxygen_ros.robots.rtc_guide import RtcSettings
from oxygen_ros.robots.state_units import StateUnits, StateUnitsError, read_state_units

LANGUAGE_POLICIES = ("every_n_frames", "on_instruction_change", "off")

AUTOSTART = Spec("autostart", True, "walk the managed node through configure and activate at start; false: wait for "
                                     "the lifecycle services (a real robot: an operator or a lifecycle manager "
                                     "activates it)", read=("flag",))
DESCRIPTION_WAIT = Spec("robot_description_wait_s", 0.0, "> 0 with robot_description empty: wait this long at "
                                                        "start for the latched robot_description topic "
                                                        "(robot_state_publisher's) and take its URDF; 0: not read",
                        ">= 0")
# The joint state in the robot's own names and units (robots/state_units.py, docs/safety.md).
STATE_RENAME = Spec("joints.state_rename", OPTIONAL, "topic_name=state_name entries: the name a joint of "
                                                     "joints.state_names has on joint_states (a "
                                                     "joint_state_broadcaster's URDF name); unset: the same names")
STATE_CONVERT = Spec("joints.state_convert", OPTIONAL, "state_name=conversion entries: the measured value -> the "
                                                       "command's units, invertible: aloha_gripper (an ALOHA gripper "
                                                       "joint in rad), range:LOW:HIGH, linear:OFFSET:SCALE; unset: "
                                                       "as measured")
SPECS = (
    AUTOSTART,
    OUTPUT["robot_description"],
    DESCRIPTION_WAIT,
    OUTPUT["limits.policy"],
    ENGINE["model.preset"],
    ENGINE["model.checkpoint"],
    ENGINE["model.text_head"],
    ENGINE["model.tokenizer"],
    ENGINE["model.norm_stats"],
    ENGINE["model.norm_mode"],
    ENGINE["model.device"],
    ENGINE["model.dtype"],
    ENGINE["model.cpu_kernel"],
    ENGINE["model.seed"],
    ENGINE["model.cpu_threads"],
    Spec("engine.remote", "", "ws:// or wss:// URL of a remote engine (a pool's ingress, .../robots/<id>?model=<id>&"
                              "rate_hz=<hz>&slo_ms=<ms>, or oxygen-ros serve), its API key from $OXYGEN_ROS_API_KEY;"
                              " the model.* parameters are then unused. Empty: the model runs in this node"),
    Spec("engine.timeout_s", 1.0, "with engine.remote: a reply later than this is lost (the groups are held and "
                                  "the connection opened again)", "> 0"),
    Spec("cameras.topics", REQUIRED, "camera image topics (relative names), one per model image key"),
    Spec("cameras.keys", REQUIRED, "model image key for each topic of cameras.topics (same order)"),
    Spec("cameras.compressed", False, "subscribe to <topic>/compressed (sensor_msgs/CompressedImage, jpeg or "
                                      "png) instead of sensor_msgs/Image: one bool for all cameras or one "
                                      "per camera"),
    ENGINE["cameras.max_pixels"],
    Spec("joints.state_names", REQUIRED, "joint names, in the order of the model's state vector"),
    Spec("joints.action_names", REQUIRED, "joint names of the action dimensions (the trajectory's joint_names)"),
    STATE_RENAME,
    STATE_CONVERT,
    ENGINE["embodiment"],
    ENGINE["embodiment_override"],
    ENGINE["control.rate_hz"],
    Spec("control.horizon", 0, "trajectory points to publish per chunk; 0: the model's whole horizon",
         "0 .. model horizon"),
    Spec("control.time_step", 0.0, "seconds between trajectory points; 0: 1 / control.rate_hz", ">= 0"),
    Spec("control.deadline_margin_s", 0.0, "language decode steps must end this long before the next tick",
         ">= 0, < control period"),
    Spec("control.max_image_age_s", 0.5, "skip a tick whose newest camera image is older than this (node "
                                         "clock vs header stamp); 0 disables the check", ">= 0"),
    Spec("control.max_state_age_s", 0.5, "skip a tick whose newest good joint state is older than this (node "
                                         "clock vs header stamp); 0 disables the check", ">= 0"),
    Spec("control.future_tolerance_s", 0.1, "skip a tick whose image or joint state is stamped more than this "
                                            "ahead of the node clock; 0 disables the check", ">= 0"),
    ENGINE["control.denoise_steps"],
    Spec("language.policy", "every_n_frames", "which frames start a narration",
         " | ".join(LANGUAGE_POLICIES)),
    Spec("language.every_n_frames", 10, "with every_n_frames: narrate one acted frame in this many", ">= 1"),
    ENGINE["language.max_new_tokens"],
    ENGINE["language.temperature"],
    Spec("language.stream_every", 8, "publish partial narration every this many tokens; 0: final text only",
         ">= 0"),
    ENGINE["language.tokens_per_frame"],
    ENGINE["language.min_steps_per_frame"],
    ENGINE["language.overlap_threads"],
    ENGINE["language.pool_slots"],
    ENGINE["language.admission"],
    ENGINE["language.max_preempted"],
    ENGINE["instruction.default"],
    Spec("instruction.max_chars", 200, "longer instructions are cut to this many characters", ">= 1"),
    Spec("status.rate_hz", 2.0, "engine_status and /diagnostics publications per second", "> 0"),
    OUTPUT["output.handover"],
    OUTPUT["output.temporal_ensemble_m"],
    OUTPUT["output.rtc_overlap"],
    OUTPUT["output.rtc_execution_horizon"],
    OUTPUT["output.rtc_schedule"],
    OUTPUT["output.rtc_max_guidance_weight"],
    OUTPUT["output.rtc_method"],
    OUTPUT["output.groups"],
    Spec("visualization.markers", False, "also publish chunk_markers (visualization_msgs/MarkerArray) for RViz: the "
                                         "published plan as a chart (a lane per action joint over its time) and "
                                         "each final narration as text"),
    Spec("visualization.frame_id", "base_link", "frame the chunk_markers chart stands in"),
)



@dataclass(frozen=True, kw_only=True)
class VlaParams(EngineParams):
    """The engine's parameters (`EngineParams`, the one table) and the VLA node's own, checked."""

    camera_topics: tuple[str, ...]
    camera_keys: tuple[str, ...]
    camera_compressed: tuple[bool, ...]
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    embodiment: Embodiment  # the profile `embodiment_name` names, checked against the joints
    horizon: int  # 0: the model's
    time_step_s: float  # resolved: never 0 (unset: the embodiment's, else 1 / rate_hz)
    deadline_margin_s: float
    max_image_age_s: float
    max_state_age_s: float
    future_tolerance_s: float
    language_policy: str
    every_n_frames: int
    stream_every: int
    max_chars: int
    status_rate_hz: float
    handover: str
    ensemble_m: float
    rtc_overlap: int
    groups: tuple[JointGroup, ...]  # empty: action_chunk only
    markers: bool
    marker_frame: str
    autostart: bool = True
    holds: tuple[str, ...] = ()  # per group: one of HOLD_MODES[its interface]
    limits: JointLimits | None = None  # the groups' joints, in group order; None: no limit at all
    limit_policy: str = "clamp"
    rtc: RtcSettings = RtcSettings()  # with handover rtc_guided
    state_units: StateUnits | None = None  # the joint state's names on the topic and its conversion; None: as is
    remote: str = ""  # a remote engine's URL (`serving.client`); "": the model runs in the node
    remote_timeout_s: float = 1.0


# Choices that include the words off / on, which YAML and `-p` read as the booleans false / true when bare (the
# engine's are known by their specs' `read`).
WORD_CHOICES = ("language.policy",)


def _descriptor(spec: Spec) -> ParameterDescriptor:
    # Floats are dynamically typed so that integer values are accepted (checked in read_parameters); so are the
    # choices with the words off / on (a bare off arrives as a boolean), and a group's scale and offset (unset, a
    # number or a list).
    words = spec.read[:1] == ("choice",) and bool({"off", "on"} & set(spec.read[1]))
    dynamic = isinstance(spec.default, float) or spec.default is None or words \
        or spec.name in ("cameras.compressed", *WORD_CHOICES)
    return ParameterDescriptor(name=spec.name, description=spec.description, additional_constraints=spec.constraints,
                               read_only=True, dynamic_typing=dynamic)


def declare_parameters(node) -> dict[str, Any]:
    """Declare every parameter of SPECS on `node`, then those of each output group; returns name -> value (None
    for unset required or optional ones)."""
    values = {spec.name: declare(node, spec) for spec in SPECS}
    values.update(declare_group_parameters(node, values["output.groups"]))
    return values


# What the fleet node takes of the VLA node's parameters: the hand-over, one setting for the node (rtc_guided shapes
# the engine every robot shares), and what describes one robot (`ROBOT_PARAMETERS`: its URDF, limits, state units
# and output groups, `output.<group>.*` besides), the fleet's default for each robot it serves.
HANDOVER_PARAMETERS = ("output.handover", "output.temporal_ensemble_m", "output.rtc_overlap",
                       "output.rtc_execution_horizon", "output.rtc_schedule", "output.rtc_max_guidance_weight",
                       "output.rtc_method")
ROBOT_PARAMETERS = ("robot_description", "robot_description_wait_s", "limits.policy", "joints.state_rename",
                    "joints.state_convert", "output.groups")


def declare_output_parameters(node) -> dict[str, Any]:
    """Declare the hand-over's and a robot's parameters on `node` (and each named group's); name -> value."""
    values = {spec.name: declare(node, spec) for spec in SPECS
              if spec.name in (*HANDOVER_PARAMETERS, *ROBOT_PARAMETERS)}
    values.update(declare_group_parameters(node, values["output.groups"]))
    return values


def declare_group_parameters(node, groups) -> dict[str, Any]:
    """Declare `output.<group>.<field>` for each group `output.groups` names; name -> value."""
    values = {}
    for group in group_names(groups):
        for field in GROUP_FIELDS:
            default, description = GROUP_SPECS[field]
            spec = Spec(f"output.{group}.{field}", default, description)
            values[spec.name] = declare(node, spec)
    return values


def declare(node, spec: Spec):
    """Declare `spec` on `node`, read-only; its value (None for an unset required or optional one)."""
    default = Parameter.Type.STRING_ARRAY if spec.default in (REQUIRED, OPTIONAL) else spec.default
    try:
        node.declare_parameter(spec.name, default, _descriptor(spec))
    except (InvalidParameterTypeException, InvalidParameterValueException) as err:
        raise ParameterError(f"parameter {spec.name}: {err}") from None
    try:
        return node.get_parameter(spec.name).value
    except ParameterUninitializedException:
        return None


def read_parameters(values: dict[str, Any]) -> VlaParams:
    """Check each value on its own and build VlaParams; raises ParameterError naming the parameter."""
    p = Reader(values)
    topics = p.names("cameras.topics")
    keys = p.names("cameras.keys")
    if len(topics) != len(keys):
        raise ParameterError(f"cameras.topics has {len(topics)} entries but cameras.keys {len(keys)}: "
                             "give one model image key per camera topic")
    compressed = values["cameras.compressed"]
    if isinstance(compressed, bool):
        compressed = (compressed,) * len(topics)
    elif isinstance(compressed, list | tuple) and all(isinstance(c, bool) for c in compressed):
        if len(compressed) != len(topics):
            raise ParameterError(f"cameras.compressed has {len(compressed)} entries for {len(topics)} cameras")
        compressed = tuple(compressed)
    else:
        raise ParameterError(f"cameras.compressed must be a bool or a list of bools, got {compressed!r}")
    engine = read_engine(values)
    rate_hz = engine.rate_hz
    time_step = p.number("control.time_step")
    deadline_margin = p.number("control.deadline_margin_s")
    if deadline_margin >= 1.0 / rate_hz:
        raise ParameterError(f"control.deadline_margin_s ({deadline_margin}) must be shorter than the control "
                             f"period ({1.0 / rate_hz:.4f} s)")
    action_names = p.names("joints.action_names")
    state_names = p.names("joints.state_names")
    embodiment = read_embodiment(engine.embodiment_name, state_names, action_names)
    time_step = time_step or embodiment.time_step or 1.0 / rate_hz
    if embodiment.has_velocity and not math.isclose(time_step, embodiment.time_step, rel_tol=1e-5):
        raise ParameterError(f"control.time_step {time_step:g} s differs from the {embodiment.time_step:g} s step "
                             f"embodiment {embodiment.name} integrates its velocities over; leave it 0 or set that")
    groups = read_groups(values, action_names)
    check_velocity_groups(groups, embodiment)
    holds, limits = read_limits(values, groups, state_names)
    handover = p.choice("output.handover", HANDOVERS)
    remote = _remote(p, embodiment, keys, handover)
    return VlaParams(
        **{f.name: getattr(engine, f.name) for f in fields(EngineParams)},
        camera_topics=topics,
        camera_keys=keys,
        camera_compressed=compressed,
        state_names=state_names,
        action_names=action_names,
        embodiment=embodiment,
        horizon=p.integer("control.horizon"),
        time_step_s=time_step,
        deadline_margin_s=deadline_margin,
        max_image_age_s=p.number("control.max_image_age_s"),
        max_state_age_s=p.number("control.max_state_age_s"),
        future_tolerance_s=p.number("control.future_tolerance_s"),
        language_policy=p.choice("language.policy", LANGUAGE_POLICIES),
        every_n_frames=p.integer("language.every_n_frames", minimum=1),
        stream_every=p.integer("language.stream_every"),
        max_chars=p.integer("instruction.max_chars", minimum=1),
        status_rate_hz=p.number("status.rate_hz", positive=True),
        handover=handover,
        ensemble_m=p.number("output.temporal_ensemble_m"),
        rtc_overlap=p.integer("output.rtc_overlap"),
        groups=groups,
        markers=p.flag("visualization.markers"),
        marker_frame=p.text("visualization.frame_id") or "base_link",
        autostart=p.flag("autostart"),
        holds=holds,
        limits=limits,
        limit_policy=p.choice("limits.policy", LIMIT_POLICIES),
        rtc=read_rtc(p),
        state_units=read_units(values, state_names),
        remote=remote,
        remote_timeout_s=p.number("engine.timeout_s", positive=True),
    )


def _remote(p: Reader, embodiment: Embodiment, camera_keys: tuple[str, ...], handover: str) -> str:
    """engine.remote, checked: a websocket URL, a profile that names openpi's keys, a camera for each image the
    policy requires, and no hand-over that needs the engine in the node."""
    url = p.text("engine.remote")
    if not url:
        return ""
    if not url.startswith(("ws://", "wss://")):
        raise ParameterError(f"engine.remote must be a ws:// or wss:// URL, got {url[:80]!r}")
    if embodiment.openpi_keys is None:
        raise ParameterError(f"engine.remote: embodiment {embodiment.name} has no openpi_keys section, so it does not "
                             "say what the remote engine reads (docs/embodiments.md)")
    keys = embodiment.openpi_keys
    missing = [key for key, model_key in keys.images if key not in keys.optional_images and model_key not in camera_keys]
    if missing:
        raise ParameterError(f"engine.remote: embodiment {embodiment.name}'s policy requires the images {missing}; "
                             f"map a camera to each of {[dict(keys.images)[key] for key in missing]} in cameras.keys")
    if handover == "rtc_guided":
        raise ParameterError("output.handover rtc_guided guides the model's sampling in this node: with engine.remote "
                             "take another hand-over")
    return url


def read_description_wait(values: dict[str, Any]) -> float:
    """robot_description_wait_s, checked (read before the other parameters: the URDF it waits for is one)."""
    return Reader(values).number("robot_description_wait_s")


def read_units(values: dict[str, Any], state_names: tuple[str, ...]) -> StateUnits:
    """The joint state's names on the topic and its conversion (`joints.state_rename`, `joints.state_convert`)."""
    try:
        return read_state_units(state_names, values.get("joints.state_rename"), values.get("joints.state_convert"))
    except StateUnitsError as err:
        raise ParameterError(str(err)) from None


def read_embodiment(spec: str, state_names: tuple[str, ...], action_names: tuple[str, ...]) -> Embodiment:
    """The profile `spec` names, checked against the robot's joints; ParameterError naming the parameter."""
    try:
        embodiment = load_embodiment(spec)
        embodiment.check_joints(state_names, action_names)
    except EmbodimentError as err:
        raise ParameterError(f"embodiment: {err}") from None
    return embodiment


def check_against_model(params: VlaParams, config, norm_stats=None) -> None:
    """What depends on the model's shape (a `Pi05Config`) and a checkpoint's norm stats; raises ParameterError."""
    unknown = [k for k in params.camera_keys if k not in config.camera_names]
    if unknown:
        raise ParameterError(f"cameras.keys {unknown} are not image keys of this model; it takes "
                             f"{list(config.camera_names)} (map each camera topic to one of them)")
    state_dims = params.embodiment.model_state_dims(len(params.state_names))
    if state_dims > config.state_dim:
        raise ParameterError(f"joints.state_names gives {state_dims} model state dims, the model's state takes "
                             f"at most {config.state_dim}")
    if len(params.action_names) > config.action_dim:
        raise ParameterError(f"joints.action_names has {len(params.action_names)} joints, the model acts on at "
                             f"most {config.action_dim}")
    if params.horizon > config.action_horizon:
        raise ParameterError(f"control.horizon ({params.horizon}) exceeds the model's action horizon "
                             f"({config.action_horizon})")
    norm = as_normalization(norm_stats)
    for feature, dims, name in ((STATE_KEY, state_dims, "joints.state_names"),
                                (ACTION_KEY, len(params.action_names), "joints.action_names")):
        width = (norm.width(feature) if norm is not None else None) or dims  # a preset, IDENTITY: any width
        if width < dims:
            raise ParameterError(f"{name} gives {dims} model dims, the checkpoint's normalization stats of "
                                 f"{feature} only {width}")
