"""The RViz config and rqt perspective shipped in config/ (RViz and rqt are not installable here): they parse as
the tools read them, and name only topics and types the nodes publish or read, relative where a namespace must
apply. That chunk_markers carries the plan and the narration is proven over DDS in test_vla_node_ros.py."""

import ast
import json
from pathlib import Path

import yaml

from oxygen_ros.launch_helpers import namespaced_perspective
from oxygen_ros.msg import EngineStatus
from oxygen_ros.nodes.markers import TOPIC as MARKERS_TOPIC
from oxygen_ros.nodes.parameters import SPECS

CONFIG = Path(__file__).resolve().parents[2] / "config"
NUMERIC = {"float", "double", "int32", "uint32", "int64", "uint64"}


def test_rviz_config_shows_the_robot_its_cameras_and_the_node_s_markers():
    manager = yaml.safe_load((CONFIG / "oxygen.rviz").read_text())["Visualization Manager"]
    defaults = {spec.name: spec.default for spec in SPECS}
    assert manager["Global Options"]["Fixed Frame"] == defaults["visualization.frame_id"]
    cameras = yaml.safe_load((CONFIG / "aloha.yaml").read_text())["/**"]["ros__parameters"]["cameras"]["topics"]
    shown = {}
    for display in manager["Displays"]:
        topic = display.get("Topic") or display.get("Description Topic")
        if topic:
            shown[topic["Value"]] = display["Class"]
    # relative names: RViz runs in the robot's namespace (launch viewer:=true)
    assert shown == {"robot_description": "rviz_default_plugins/RobotModel",
                     MARKERS_TOPIC: "rviz_default_plugins/MarkerArray",
                     **{camera: "rviz_default_plugins/Image" for camera in cameras}}
    (robot,) = [d for d in manager["Displays"] if d["Class"] == "rviz_default_plugins/RobotModel"]
    assert robot["Description Source"] == "Topic"  # robot_state_publisher's latched robot_description


def test_rqt_perspective_plots_engine_status_fields_and_runs_the_robot_monitor():
    text = (CONFIG / "oxygen.perspective").read_text()
    manager = json.loads(text)["groups"]["pluginmanager"]
    plugins = ast.literal_eval(manager["keys"]["running-plugins"]["repr"])
    assert plugins == {"rqt_plot/Plot": [1, 2], "rqt_robot_monitor/RobotMonitor": [1]}
    fields = {name for name, kind in EngineStatus.get_fields_and_field_types().items() if kind in NUMERIC}
    plotted = []
    for serial in plugins["rqt_plot/Plot"]:
        keys = manager["groups"][f"plugin__rqt_plot__Plot__{serial}"]["groups"]["plugin"]["keys"]
        values = {key: ast.literal_eval(value["repr"]) for key, value in keys.items()}  # as rqt reads them
        plotted += values["topics"]
    assert plotted and all(t.startswith("/engine_status/") and t.split("/")[2] in fields for t in plotted), plotted
    assert "plugin__rqt_robot_monitor__RobotMonitor__1" in manager["groups"]
    moved = json.loads(namespaced_perspective(text, "robot3/"))["groups"]["pluginmanager"]["groups"]
    topics = ast.literal_eval(moved["plugin__rqt_plot__Plot__1"]["groups"]["plugin"]["keys"]["topics"]["repr"])
    assert topics == ["/robot3" + t for t in plotted[:len(topics)]]
    assert json.loads(namespaced_perspective(text, "")) == json.loads(text)


def test_rviz_follows_the_robots_parameter_files_or_the_launch_arguments():
    from oxygen_ros.launch_helpers import rviz_config, viewed_parameters
    from oxygen_ros.serving.params import read_file

    droid = yaml.safe_load((CONFIG / "droid.yaml").read_text())["/**"]["ros__parameters"]
    viewed = viewed_parameters([read_file(CONFIG / "aloha.yaml"), read_file(CONFIG / "droid.yaml")])  # droid wins
    assert viewed == ("base_link", droid["cameras"]["topics"])  # not ALOHA's cameras
    shipped = (CONFIG / "oxygen.rviz").read_text()
    for frame, cameras in (viewed, ("panda_link0", ["wrist/image", "front"])):
        manager = yaml.safe_load(rviz_config(shipped, frame, cameras))["Visualization Manager"]
        assert manager["Global Options"]["Fixed Frame"] == frame
        images = [d for d in manager["Displays"] if d["Class"] == "rviz_default_plugins/Image"]
        assert [d["Topic"]["Value"] for d in images] == cameras
        assert [d["Class"] for d in manager["Displays"] if d["Class"] != "rviz_default_plugins/Image"] == [
            d["Class"] for d in yaml.safe_load(shipped)["Visualization Manager"]["Displays"]
            if d["Class"] != "rviz_default_plugins/Image"]  # the robot, TF, markers and grid kept
    assert [d["Name"] for d in images] == ["wrist", "front"]
