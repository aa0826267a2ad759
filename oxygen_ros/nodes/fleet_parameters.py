"""The fleet node's parameters: one table of `Spec`s, checked as the VLA node's are (`robots.engine_params`).

The engine parameters the fleet node shares with the VLA node and `serve` are the same specs under the fleet node's
flat names (`ENGINE_NAMES`: default, description and check from `ENGINE_SPECS`); the rest are the fleet's own
(models and robots, placement, designs). `read_fleet` checks every value by its spec and
`fleet_engine` gives the engine parameters (`EngineParams`, the engine's defaults for what the fleet node does not
set) that `robots.engine.build_fleet` builds the server from. The hand-over's parameters (`output.handover`,
`output.temporal_ensemble_m`, `output.rtc_*`) are the VLA node's, one setting for the node; so are a robot's
(`robot_description`, `robot_description_wait_s`, `limits.policy`, `joints.state_rename`, `joints.state_convert`,
`output.groups`, `output.<group>.*`: `parameters.declare_output_parameters`), the default of every robot the node
serves, which `per_robot.<robot>.<parameter>` overrides for one robot (`declare_robot_parameters`; `joint_names`
too). A per-robot value is a parameter of its own, not a YAML map under `robots`, because `robots` is the list of
robot namespaces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oxygen_ros.engine.queues import QUEUE_POLICIES
from oxygen_ros.fleet.co_run import DEFAULT_GUARD
from oxygen_ros.fleet.designs import DEFAULT_DESIGN, DESIGNS
from oxygen_ros.robots.engine_params import (
    ENGINE,
    ENGINE_SPECS,
    EngineParams,
    ParameterError,
    Reader,
    Spec,
    read_engine,
    renamed,
)
from oxygen_ros.robots.output_params import GROUP_FIELDS, GROUP_SPECS, group_names

from .parameters import REQUIRED, ROBOT_PARAMETERS, SPECS, declare
from .robot_description import description_from_topic

ENGINE_NAMES = {  # the fleet node's name -> the engine parameter it is
    "cpu_threads": "model.cpu_threads", "cpu_kernel": "model.cpu_kernel", "tokenizer": "model.tokenizer",
    "max_pixels": "cameras.max_pixels", "max_new_tokens": "language.max_new_tokens",
    "tokens_per_frame": "language.tokens_per_frame", "min_steps_per_frame": "language.min_steps_per_frame",
    "overlap_threads": "language.overlap_threads", "embodiment_override": "embodiment_override",
    "rate_hz": "control.rate_hz", "instruction": "instruction.default",
}
OWN_DEFAULTS = {"instruction": "do the task"}  # where the fleet node's default differs from the engine's


def _engine(name: str) -> Spec:
    return renamed(ENGINE[ENGINE_NAMES[name]], name, OWN_DEFAULTS.get(name))


FLEET_SPECS = (
    Spec("models", ["a=tiny:0"], "served models, id=source[:seed] (a preset, a model config JSON or a checkpoint "
                                 "folder)", read=("names",)),
    Spec("robots", ["robot1"], "robot namespaces served without an assignment", read=("names",)),
    Spec("robot_models", ["a"], "each robot's model id, parallel to robots", read=("strings",)),
    Spec("slo_ms", 200.0, "a robot's deadline after its camera stamp (without an assignment, or where it names no "
                          "SLO)", "> 0", ("positive",)),
    Spec("assignment_file", "", "the traffic controller's assignment (oxygen-ros fleet-assign); empty: robots",
         read=("text",)),
    Spec("gpu_index", 0, "this node's GPU in the assignment (and cuda:<gpu_index> with device cuda)", ">= 0",
         ("integer", 0)),
    Spec("device", "cpu", "cpu, cuda (the assignment's GPU, cuda:<gpu_index>) or cuda:N", read=("text",)),
    _engine("cpu_threads"),
    Spec("max_batch", 8, "frames of one model batched together (a power of two)", ">= 1", ("integer", 1)),
    Spec("publish_late", False, "publish a chunk ready after its deadline (with its stamp) instead of dropping it",
         read=("flag",)),
    _engine("tokenizer"),
    _engine("instruction"),
    Spec("joint_names", [""], "each robot's joints; empty: those of its first joint state", read=("strings",)),
    Spec("compressed", False, "subscribe .../image_raw/compressed", read=("flag",)),
    Spec("max_image_age_s", 0.0, "stale-frame threshold, as the VLA node's control.max_image_age_s (0: off)", ">= 0",
         ("number", 0.0)),
    Spec("max_state_age_s", 0.0, "stale joint-state threshold, as the VLA node's control.max_state_age_s (0: off)",
         ">= 0", ("number", 0.0)),
    Spec("future_tolerance_s", 0.1, "frames stamped further ahead of the node clock are not acted on (0: off)",
         ">= 0", ("number", 0.0)),
    _engine("max_pixels"),
    Spec("narrate_every", 10, "every n-th frame of a robot starts a narration; 0: never", ">= 0", ("integer", 0)),
    _engine("max_new_tokens"),
    _engine("tokens_per_frame"),
    _engine("min_steps_per_frame"),
    Spec("pool_slots", 0, "KV slots per model; 0: the frame slots + one narration per robot of the busiest model "
                          "(at least 2)", ">= 0", ("integer", 0)),
    Spec("queue", "esf", "which model's frames run first", " | ".join(QUEUE_POLICIES),
         ("choice", tuple(QUEUE_POLICIES))),
    Spec("design", DEFAULT_DESIGN, "how a batch uses the device: monolithic, robion (lockstep stage split) or "
                                   "disaggregated (static stage split)", " | ".join(DESIGNS), ("choice", DESIGNS)),
    _engine("overlap_threads"),
    Spec("profile_file", "", "a stage split's profile table (fleet-profile); empty: profiled at start-up",
         read=("text",)),
    Spec("profile_repeats", 3, "measurements per profile entry at start-up", ">= 1", ("integer", 1)),
    Spec("guard", DEFAULT_GUARD, "robion: co-running stages predicted at table latency x guard (raised to the "
                                 "co-run slowdown measured with the table)", ">= 0", ("number", 0.0)),
    Spec("cuda_graphs", False, "a CUDA device only: CUDA graphs per model, stage, bucket and SM partition",
         read=("flag",)),
    _engine("cpu_kernel"),
    Spec("action_dt", 0.02, "seconds between chunk points, for robots whose embodiment names no rate", "> 0",
         ("positive",)),
    Spec("embodiments", ["absolute"], "one embodiment profile for every robot, or one per entry of robots",
         read=("strings",)),
    _engine("embodiment_override"),
    _engine("rate_hz"),
    Spec("status_rate_hz", 1.0, "engine_status and /diagnostics publications per second", "> 0", ("positive",)),
)
DEFAULTS = {spec.name: spec.default for spec in FLEET_SPECS}


def read_fleet(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every fleet parameter checked by its spec; ParameterError naming the first bad one."""
    reader = Reader(values)
    return {spec.name: reader.value(spec) for spec in FLEET_SPECS}


def fleet_engine(values: Mapping[str, Any]) -> EngineParams:
    """The engine parameters of the fleet node's checked values (the engine's defaults for the rest)."""
    engine = {spec.name: spec.default for spec in ENGINE_SPECS}
    engine.update({ENGINE_NAMES[name]: value for name, value in values.items() if name in ENGINE_NAMES})
    return read_engine(engine)


PER_ROBOT = "per_robot"  # per_robot.<robot>.<parameter>: one robot's own value of a robot parameter
PER_ROBOT_PARAMETERS = ("joint_names", *ROBOT_PARAMETERS)  # the parameters a robot may have its own value of
_SPEC = {spec.name: spec for spec in (*SPECS, *FLEET_SPECS)}


def declare_robot_parameters(node, robot_id: str, shared: Mapping[str, Any]) -> dict[str, Any]:
    """One robot's parameters, name -> value: `per_robot.<robot_id>.<name>` where it is given, else the node's own
    `<name>` (`shared`: the hand-over's and the robot parameters, `joint_names` among them); a group's field falls
    back on the node's value of that group, then on its default. Declared on `node` at the robot's first call,
    unset by default (ParameterError for a value of the wrong type or a bad group name)."""
    prefix = f"{PER_ROBOT}.{robot_id}."

    def own(name: str, description: str):
        full = prefix + name
        if node.has_parameter(full):  # a robot served again (a second configure)
            return node.get_parameter(full).value
        return declare(node, Spec(full, None, f"robot {robot_id}'s own {name}: {description}"))

    values = dict(shared)
    for name in PER_ROBOT_PARAMETERS:
        value = own(name, _SPEC[name].description)
        if value is not None:
            values[name] = value
    for group in group_names(values["output.groups"]):
        for field in GROUP_FIELDS:
            name = f"output.{group}.{field}"
            default, description = GROUP_SPECS[field]
            value = own(name, description)
            if value is not None:
                values[name] = value
            elif name not in values:
                values[name] = None if default is REQUIRED else default
    return values


def robot_parameters(node, robot_id: str, shared: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A robot's parameters (`declare_robot_parameters`), its URDF from the latched `/<robot_id>/robot_description`
    when `robot_description_wait_s` > 0 and it has no `robot_description`, and its joints (empty: those of its
    first joint state); ParameterError."""
    values = declare_robot_parameters(node, robot_id, shared)
    reader = Reader(values)
    joint_names = tuple(n for n in reader.strings("joint_names") if n)
    if not joint_names and (values["joints.state_rename"] or values["joints.state_convert"]):
        raise ParameterError("joints.state_rename and joints.state_convert name joints of joint_names: give them")
    wait_s = reader.number("robot_description_wait_s")
    if wait_s > 0 and not reader.text("robot_description"):
        values["robot_description"] = description_from_topic(node, wait_s, f"/{robot_id}/robot_description")
    return values, joint_names
