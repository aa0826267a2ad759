"""sim-eval's ros path: the policy node it starts under an injected delay."""

import yaml

from oxygen_ros.commands.sim_eval_ros import policy_node_command


def overrides(tmp_path, delay_steps: int, extra: list[str]) -> dict:
    policy_node_command("oxygen_ros.nodes.vla_node", str(tmp_path), ["top"], 12.5, extra, tmp_path, delay_steps)
    return yaml.safe_load((tmp_path / "policy_overrides.yaml").read_text())["/**"]["ros__parameters"]


def test_an_injected_delay_raises_the_nodes_age_limits_by_as_much(tmp_path):
    """Frames come D steps late by design: the image and state age limits grow by D steps (50 Hz); without a
    delay the node keeps its own; a limit the user passes still wins."""
    control = overrides(tmp_path, 10, [])["control"]
    assert control["max_image_age_s"] == 0.4 and control["max_state_age_s"] == 0.7, control
    assert "max_image_age_s" not in overrides(tmp_path, 0, [])["control"]
    assert overrides(tmp_path, 10, ["control.max_image_age_s:=1.5"])["control"]["max_image_age_s"] == 1.5
