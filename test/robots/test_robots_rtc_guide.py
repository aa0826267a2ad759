"""One robot's real-time chunking guide (`robots/rtc_guide.py`): the chunk being executed, from a new frame's step on,
in the model's space (deltas re-based onto the new frame's state), with the measured delay; and every reason a
frame goes without guidance, counted."""

import numpy as np
import pytest
import torch

from oxygen_ros.control.embodiment import load_embodiment
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.preprocess import ACTION_KEY, STATE_KEY, robot_actions
from oxygen_ros.model.rtc import Committed, RtcConfig
from oxygen_ros.robots.rtc_guide import RtcGuide, RtcSettings, rtc_guide

TINY = get_preset("tiny")
STEP = 20_000_000
T0 = 5_000_000_000


def guide(executed=6, execution_horizon=6, **kwargs) -> RtcGuide:
    return RtcGuide(RtcConfig(execution_horizon), STEP, executed, TINY.action_horizon, TINY.action_dim, **kwargs)


def chunk(seed=0) -> torch.Tensor:
    return torch.randn(TINY.action_horizon, TINY.action_dim, generator=torch.Generator().manual_seed(seed))


def measured(g: RtcGuide, *delays_steps: float) -> None:
    for steps in delays_steps:
        g.arrived(T0, T0 + round(steps * STEP))


def test_a_frame_gets_the_executed_chunk_from_its_own_step_and_the_estimated_delay():
    g = guide()
    actions = chunk()
    measured(g, 9.0, 9.0, 1.4, 2.2, 1.9)  # the first two are warm-up: set aside
    g.executing(actions, T0, np.zeros(3))
    request = g.request(T0 + 2 * STEP + 3_000_000, np.zeros(3))  # 2 steps (and a bit) after the chunk's frame
    assert isinstance(request, Committed)
    assert request.delay == 3  # the 0.9 quantile of 1.4, 2.2, 1.9, rounded up
    torch.testing.assert_close(request.left_over, actions[2:6])  # the executed points only
    assert g.guided == 1 and g.counts()["rtc_delay_steps"] == 3


def test_frames_without_a_chunk_an_estimate_or_a_usable_request_are_plain_and_counted():
    g = guide(execution_horizon=4)
    assert g.request(T0, np.zeros(3)).kind == "no_chunk"
    g.executing(chunk(), T0, np.zeros(3))
    measured(g, 1.0, 1.0)
    assert g.request(T0 + STEP, np.zeros(3)).kind == "no_estimate"  # only warm-up so far
    measured(g, 1.0)
    assert g.request(T0 + 6 * STEP, np.zeros(3)).kind == "past"  # the executed chunk ended there
    assert g.request(T0 - 2 * STEP, np.zeros(3)).kind == "past"  # a frame before the chunk's own
    measured(g, 4.0, 4.0, 4.0)
    late = g.request(T0 + STEP, np.zeros(3))
    assert late.kind == "delay" and "execution horizon 4" in late.detail
    bad = chunk()
    bad[1, 0] = float("nan")
    g.executing(bad, T0, np.zeros(3))
    measured(g, *[1.0] * 32)
    assert g.request(T0, np.zeros(3)).kind == "nonfinite"
    g.stop()
    assert g.request(T0, np.zeros(3)).kind == "no_chunk"
    counts = g.counts()
    assert {k: counts[f"rtc_plain_{k}"] for k in ("no_chunk", "no_estimate", "past", "delay", "width",
                                                   "nonfinite")} == \
        {"no_chunk": 2, "no_estimate": 1, "past": 2, "delay": 1, "width": 0, "nonfinite": 1}
    assert g.guided == 0
    g.arrived(T0, T0 - STEP)  # a negative delay: dropped, counted
    assert g.counts()["rtc_delays_dropped"] == 1


def test_delta_dims_are_rebased_onto_the_new_frames_state_so_the_targets_stay_where_they_were():
    """ALOHA's actions are deltas from the frame's state: the left-over handed to the new frame, made absolute from
    the new frame's state, is the executed chunk made absolute from its own frame's state."""
    aloha = load_embodiment("aloha")
    rng = np.random.default_rng(0)
    dims = 14
    stats = {ACTION_KEY: {"q01": -rng.uniform(0.5, 2, dims), "q99": rng.uniform(0.5, 2, dims)},
             STATE_KEY: {"q01": -np.ones(dims), "q99": np.ones(dims)}}
    g = guide(embodiment=aloha, norm_stats=stats)
    measured(g, 1.0, 1.0, 2.0)
    actions = chunk(3)
    before, now = rng.uniform(-1, 1, dims), rng.uniform(-1, 1, dims)
    g.executing(actions, T0, aloha.state_to_model(before))
    request = g.request(T0 + STEP, aloha.state_to_model(now))
    assert isinstance(request, Committed)
    old = aloha.actions_to_robot(robot_actions(actions[None, 1:6], dims, stats)[0], before).positions
    new = aloha.actions_to_robot(robot_actions(request.left_over[None], dims, stats)[0], now).positions
    np.testing.assert_allclose(new, old, atol=1e-5)
    assert not np.allclose(request.left_over[:, :dims].numpy(), actions[1:6, :dims].numpy(), atol=1e-2)
    torch.testing.assert_close(request.left_over[:, dims:], actions[1:6, dims:])  # the padding as the model made it


def test_only_the_rtc_guided_hand_over_makes_a_guide_and_its_horizon_is_the_executed_part():
    assert rtc_guide("newest_wins", RtcSettings(), STEP, 6, TINY) is None
    made = rtc_guide("rtc_guided", RtcSettings(), STEP, 50, TINY)  # a published horizon beyond the model's
    assert made.executed == TINY.action_horizon and made.config.execution_horizon == TINY.action_horizon
    assert rtc_guide("rtc_guided", RtcSettings(execution_horizon=3), STEP, 6, TINY).config.execution_horizon == 3
    with pytest.raises(ValueError):
        RtcSettings(max_guidance_weight=0.0).config(6)


def test_the_nodes_parameters_choose_the_method_and_refuse_an_unknown_one():
    from oxygen_ros.robots.engine_params import ParameterError, Reader
    from oxygen_ros.robots.output_params import read_rtc

    values = {"output.rtc_execution_horizon": 3, "output.rtc_schedule": "linear",
              "output.rtc_max_guidance_weight": 10.0, "output.rtc_method": "prefix"}
    settings = read_rtc(Reader(values))
    config = settings.config(6)
    assert (config.execution_horizon, config.schedule, config.max_guidance_weight, config.method) == \
        (3, "linear", 10.0, "prefix")
    assert settings.engine_config().method == "prefix"
    with pytest.raises(ParameterError, match="output.rtc_method must be one of guidance | prefix"):
        read_rtc(Reader({**values, "output.rtc_method": "blend"}))
