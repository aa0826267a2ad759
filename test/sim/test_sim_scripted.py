"""The scripted transfer_cube plan reaches gym-aloha's lift stage in the sim (no ROS, no learning)."""

import numpy as np
import pytest

from oxygen_ros.sim.aloha_env import REWARD_STAGES, AlohaSimEnv
from oxygen_ros.sim.scripted import transfer_cube_lift_plan

LIFTED = REWARD_STAGES["transfer_cube"].index("cube lifted")

pytestmark = pytest.mark.system  # MuJoCo physics


@pytest.mark.parametrize("seed", [0, 5])
def test_scripted_plan_grasps_and_lifts_the_cube(seed, monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    plan = transfer_cube_lift_plan(seed)
    assert plan.shape[1] == 14 and np.isfinite(plan).all()
    env = AlohaSimEnv("transfer_cube", cameras=("top",), height=16, width=16, max_steps=len(plan))
    try:
        env.reset(seed)
        rewards = np.array([env.step(row).reward for row in plan])
    finally:
        env.close()
    assert LIFTED == 2 and env.episode_max_reward == rewards.max()
    assert rewards.max() >= LIFTED
    assert rewards[-1] >= LIFTED  # still held up when the plan ends
    assert (rewards[:40] == 0).all()  # nothing touched while the arm is still on its way
