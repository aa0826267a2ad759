"""What the VLA node runs, from its parameters: `robots.engine.load_policy` with the node's model checks.

Loading itself is `robots.engine` (shared with the fleet node and `serve`); this module adds what depends on the
node's parameters (camera keys, state and action widths, horizon: `parameters.check_against_model`).
"""

from __future__ import annotations

from oxygen_ros.robots.engine import Policy
from oxygen_ros.robots.engine import load_policy as load_engine_policy

from .parameters import VlaParams, check_against_model


def load_policy(params: VlaParams) -> Policy:
    """The model, tokenizer and norm stats the parameters name; raises ParameterError with the reason."""
    return load_engine_policy(params, params.embodiment, params.action_names,
                              lambda config, norm_stats: check_against_model(params, config, norm_stats))
