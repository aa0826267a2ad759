"""What the launch files work out from their arguments and from a bag, kept here so plain pytest can check it (the
`launch` packages exist only on a ROS 2 install)."""

from __future__ import annotations

import ast
import copy
import json
import os
from collections.abc import Sequence

# Topics that are global by nature and never moved into a robot's namespace.
GLOBAL_TOPICS = ("/clock", "/tf", "/tf_static", "/rosout", "/parameter_events", "/diagnostics")
JOINT_STATE_TYPE = "sensor_msgs/msg/JointState"


def parameter_files(text: str) -> list[str]:
    """`params_file:=a.yaml,b.yaml`: the files in order (later ones override earlier ones); each must exist."""
    files = [part.strip() for part in text.split(",") if part.strip()]
    if not files:
        raise ValueError("params_file is empty: give at least one parameter file")
    missing = [path for path in files if not os.path.isfile(path)]
    if missing:
        raise ValueError(f"params_file: no such file {', '.join(missing)}")
    return files


def robot_description(path: str) -> str:
    """`urdf:=robot.urdf`: the file's text, for the node's `robot_description` parameter (the joint limits'
    source, as `robot_state_publisher` takes it); "" when no file is given. A file that does not exist or is empty
    raises ValueError naming it (whether it parses is the node's start-up check)."""
    path = path.strip()
    if not path:
        return ""
    if not os.path.isfile(path):
        raise ValueError(f"urdf: no such file {path}")
    with open(path, encoding="utf-8") as file:
        text = file.read()
    if not text.strip():
        raise ValueError(f"urdf: {path} is empty")
    return text


def user_remappings(text: str) -> list[tuple[str, str]]:
    """`remappings:="FROM:=TO FROM:=TO"` as pairs."""
    pairs = []
    for rule in text.split():
        source, separator, target = rule.partition(":=")
        if not separator or not source or not target:
            raise ValueError(f"remappings: expected FROM:=TO, got {rule!r}")
        pairs.append((source, target))
    return pairs


def _namespace(topic: str) -> str:
    return topic.rsplit("/", 1)[0] or "/"


def _common_namespace(topics: Sequence[str]) -> str:
    parts = [_namespace(t).strip("/").split("/") if _namespace(t) != "/" else [] for t in topics]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return "/" + "/".join(common)


def bag_remappings(topics: Sequence[str]) -> list[tuple[str, str]]:
    """Remappings that move a bag's absolute robot topics into the replay's namespace.

    The namespace the absolute topics share (e.g. `/robot1` for `/robot1/joint_states`, `/` for `/joint_states`) is
    dropped, leaving a relative name that the replay process expands with its own namespace, the node's. Relative
    topics need nothing; global ones (/clock, /tf ...) stay global.
    """
    absolute = [t for t in topics if t.startswith("/") and t not in GLOBAL_TOPICS]
    if not absolute:
        return []
    prefix = _common_namespace(absolute).rstrip("/")
    return [(topic, topic[len(prefix) + 1:]) for topic in absolute]


def joint_state_topic(topics: Sequence[tuple[str, str]]) -> str:
    """The bag's joint-state topic (the one the replay waits for the node to subscribe to), as the bag names it."""
    candidates = [name for name, msgtype in topics if msgtype == JOINT_STATE_TYPE]
    named = [name for name in candidates if name.rsplit("/", 1)[-1] == "joint_states"]
    if not named:
        raise ValueError(f"the bag has no sensor_msgs/JointState topic named joint_states (it has {candidates})")
    return named[0]


def replay_ros_arguments(topics: Sequence[tuple[str, str]], namespace: str, remappings: str) -> list[str]:
    """`--ros-args` of `oxygen-ros replay` in the node's namespace: the user's remappings first (rcl applies the
    first rule that matches), then those that bring the bag's absolute topics into the namespace."""
    rules = user_remappings(remappings)
    taken = {source for source, _ in rules}
    rules += [(source, target) for source, target in bag_remappings([name for name, _ in topics])
              if source not in taken]
    args = ["--ros-args", "-r", f"__ns:=/{namespace.strip('/')}"]
    for source, target in rules:
        args += ["-r", f"{source}:={target}"]
    return args


def namespaced_perspective(text: str, namespace: str) -> str:
    """The shipped rqt perspective (JSON, values as Python reprs, as rqt exports it) with every rqt_plot topic moved
    into `namespace`: rqt_plot takes absolute topic names, and a namespaced robot's engine_status is under it."""
    prefix = "/" + namespace.strip("/") if namespace.strip("/") else ""
    data = json.loads(text)
    for name, group in data["groups"]["pluginmanager"]["groups"].items():
        keys = group["groups"]["plugin"]["keys"]
        if name.startswith("plugin__rqt_plot__") and "topics" in keys:
            topics = ast.literal_eval(keys["topics"]["repr"])
            keys["topics"]["repr"] = repr([prefix + topic for topic in topics])
    return json.dumps(data, indent=2)


def viewed_parameters(files: Sequence[dict]) -> tuple[str, list[str]]:
    """The fixed frame (`visualization.frame_id`, default base_link) and camera topics (`cameras.topics`) the
    node's parameter files set (each read as dotted names: `serving.params.read_file`), later ones winning, for
    RViz."""
    frame, cameras = "base_link", []
    for values in files:
        frame = values.get("visualization.frame_id") or frame
        cameras = list(values.get("cameras.topics") or cameras)
    return frame, cameras


def rviz_config(text: str, fixed_frame: str, camera_topics: Sequence[str]) -> str:
    """The shipped RViz config (YAML `text`) with `fixed_frame` as its Fixed Frame and one Image display per
    camera topic (relative names, shown in the robot's namespace), made from its first Image display."""
    import yaml

    data = yaml.safe_load(text)
    manager = data["Visualization Manager"]
    manager["Global Options"]["Fixed Frame"] = fixed_frame
    displays = manager["Displays"]
    images = [d for d in displays if d.get("Class") == "rviz_default_plugins/Image"]
    template = images[0]
    kept = [d for d in displays if d.get("Class") != "rviz_default_plugins/Image"]
    shown = []
    for topic in camera_topics:
        display = copy.deepcopy(template)
        parts = topic.strip("/").split("/")
        display["Name"] = parts[-2] if len(parts) >= 2 else parts[-1]  # camera/<name>/image_raw -> <name>
        display["Topic"]["Value"] = topic
        shown.append(display)
    manager["Displays"] = kept + shown
    return yaml.safe_dump(data, sort_keys=False)
