"""The gym-aloha wrapper: fast render settings, cameras at the requested size, seeded determinism, and parity with
gym-aloha's own environment (same joint states and, at 480x640, the same top-camera pixels)."""

import os

import numpy as np
import pytest

os.environ.setdefault("MUJOCO_GL", "egl")

from oxygen_ros.sim.aloha_env import AlohaSimEnv, SimulationDiverged  # noqa: E402

pytestmark = pytest.mark.system  # MuJoCo physics and EGL rendering


def wiggle(qpos: np.ndarray, steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [qpos + rng.normal(0, 0.05, 14) for _ in range(steps)]


def test_fast_settings_and_camera_sizes():
    env = AlohaSimEnv("insertion", cameras=("top", "left_wrist", "right_wrist"), height=120, width=160)
    try:
        quality = env.physics.model.vis.quality
        assert quality.offsamples == 0 and quality.shadowsize == 0
        obs = env.reset(seed=1)
        assert set(obs.images) == {"top", "left_wrist", "right_wrist"}
        for image in obs.images.values():
            assert image.shape == (120, 160, 3) and image.dtype == np.uint8
            assert image.std() > 5  # a rendered scene, not a blank buffer
        assert not np.array_equal(obs.images["top"], obs.images["left_wrist"])
        assert obs.qpos.shape == (14,) and obs.qvel.shape == (14,)
        assert env.instruction == "Insert the peg into the socket."
    finally:
        env.close()


def test_bigger_than_default_framebuffer_is_allowed():
    env = AlohaSimEnv("transfer_cube", cameras=("top",), height=720, width=960)
    try:
        assert env.reset(seed=0).images["top"].shape == (720, 960, 3)
    finally:
        env.close()


def test_seeded_reset_and_step_are_deterministic():
    runs = []
    for seed in (5, 5, 6):
        env = AlohaSimEnv("transfer_cube", cameras=("top",), height=96, width=128, max_steps=6)
        try:
            obs = env.reset(seed=seed)
            cube = env.physics.data.qpos[16:19].copy()
            results = [env.step(a) for a in wiggle(obs.qpos, 6)]
            runs.append((cube, np.stack([r.observation.qpos for r in results]), results[-1].observation.images["top"]))
            assert [r.truncated for r in results] == [False] * 5 + [True]
            assert not any(r.success for r in results)
        finally:
            env.close()
    (cube_a, qpos_a, img_a), (cube_b, qpos_b, img_b), (cube_c, _, _) = runs
    np.testing.assert_array_equal(cube_a, cube_b)
    np.testing.assert_array_equal(qpos_a, qpos_b)
    np.testing.assert_array_equal(img_a, img_b)
    assert not np.allclose(cube_a, cube_c)  # another seed, another cube position
    assert np.abs(qpos_a[-1] - qpos_a[0]).max() > 1e-3  # the commands moved the arms


def test_a_step_without_rendering_has_the_same_physics_and_no_images():
    env = AlohaSimEnv("transfer_cube", cameras=("top",), height=24, width=32, max_steps=6)
    try:
        runs = []
        for render in (True, False):
            obs = env.reset(seed=5)
            runs.append([env.step(a, render=render).observation for a in wiggle(obs.qpos, 6)])
    finally:
        env.close()
    rendered, physics_only = runs
    assert all(o.images == {} for o in physics_only) and rendered[-1].images["top"].shape == (24, 32, 3)
    for a, b in zip(rendered, physics_only):
        np.testing.assert_array_equal(a.qpos, b.qpos)
        np.testing.assert_array_equal(a.env_state, b.env_state)


def test_matches_gym_aloha_state_and_pixels():
    import gym_aloha  # noqa: F401  (registers the environments)
    import gymnasium as gym

    reference = gym.make("gym_aloha/AlohaTransferCube-v0", obs_type="pixels_agent_pos")
    physics = reference.unwrapped._env.physics
    physics.model.vis.quality.offsamples = 0
    physics.model.vis.quality.shadowsize = 0
    ours = AlohaSimEnv("transfer_cube", cameras=("top",), height=480, width=640)
    try:
        ref_obs, _ = reference.reset(seed=3)
        obs = ours.reset(seed=3)
        np.testing.assert_array_equal(obs.qpos, ref_obs["agent_pos"])
        for action in wiggle(obs.qpos, 4, seed=1):
            ref_obs, ref_reward, *_ = reference.step(action)
            result = ours.step(action)
        np.testing.assert_array_equal(result.observation.qpos, ref_obs["agent_pos"])
        assert result.reward == ref_reward
        np.testing.assert_array_equal(result.observation.images["top"], ref_obs["pixels"]["top"])
    finally:
        ours.close()
        reference.close()


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown task"):
        AlohaSimEnv("stack_blocks")
    with pytest.raises(ValueError, match="cameras"):
        AlohaSimEnv(cameras=("cam_high",))
    env = AlohaSimEnv(cameras=("top",), height=48, width=64)
    try:
        env.reset(seed=0)
        with pytest.raises(ValueError, match="14 finite"):
            env.step(np.zeros(7))
    finally:
        env.close()


def test_violent_commands_diverge_the_physics_and_a_reset_recovers():
    """Bang-bang targets of +-5 rad (clipped to the actuators' ranges) blow up MuJoCo's accelerations in a few
    steps: a typed error, no further stepping until a reset, then a normal episode again."""
    env = AlohaSimEnv(cameras=("top",), height=32, width=32)
    try:
        start = env.reset(seed=0)
        with pytest.raises(SimulationDiverged, match="physics diverged at episode step"):
            for t in range(50):
                env.step(np.full(14, 5.0 if t % 2 else -5.0))
        assert env.diverged and t < 10
        with pytest.raises(SimulationDiverged, match="reset first"):
            env.step(start.qpos)
        again = env.reset(seed=0)
        np.testing.assert_allclose(again.qpos, start.qpos)
        result = env.step(again.qpos)
        assert not env.diverged and env.steps == 1 and np.all(np.isfinite(result.observation.qpos))
    finally:
        env.close()
