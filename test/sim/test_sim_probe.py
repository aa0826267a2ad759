"""The cube probe's figures on known answers: a fit that explains all, none or part of the targets' spread, and a
policy equal to the scripted plan or blind to the cube."""

import numpy as np
import pytest

from oxygen_ros.sim.probe import RIGHT_ARM, explained_variance, probe_first_chunks, probe_lines

CUBES = {seed: np.array([0.02 * seed, 0.5 - 0.03 * seed * seed]) for seed in range(6)}


def scripted(seed: int) -> np.ndarray:
    """[20, 14] targets that move with the cube: each right-arm joint a different linear function of (x, y)."""
    x, y = CUBES[seed]
    plan = np.zeros((20, 14))
    ramp = np.linspace(0.0, 1.0, 20)[:, None]
    plan[:, RIGHT_ARM] = ramp * (np.arange(1, 7) * x - np.arange(6, 0, -1) * y)
    return plan


def test_explained_variance_on_known_answers():
    rng = np.random.default_rng(0)
    xy = rng.normal(size=(30, 2))
    exact = xy @ np.array([[1.0, -2.0], [0.5, 3.0]]) + 4.0
    assert np.allclose(explained_variance(xy, exact), 1.0)
    assert np.allclose(explained_variance(xy, np.full((30, 3), 0.7)), 0.0)  # nothing varies: nothing to explain
    # x plus a term orthogonal to 1, x and y, as large as x: half the spread explained
    corners = np.array([[-1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [1.0, 1.0]])
    partial = explained_variance(corners, corners[:, :1] + np.array([[1.0], [-1.0], [-1.0], [1.0]]))
    assert partial == pytest.approx([0.5])


def test_a_policy_that_follows_the_cube_matches_the_script_and_a_blind_one_explains_nothing():
    seeds = list(range(6))
    same = probe_first_chunks(lambda s: scripted(s)[:8], scripted, CUBES.get, seeds)
    assert np.allclose(same.policy_r2, 1.0) and np.allclose(same.scripted_r2, 1.0) and same.gap_rad == 0.0
    blind_chunk = scripted(3)[:8]
    blind = probe_first_chunks(lambda s: blind_chunk, scripted, CUBES.get, seeds)
    assert np.allclose(blind.policy_r2, 0.0) and np.allclose(blind.scripted_r2, 1.0)
    expected_gap = np.mean([np.abs(blind_chunk[:, RIGHT_ARM] - scripted(s)[:8, RIGHT_ARM]).mean() for s in seeds])
    assert blind.gap_rad == pytest.approx(expected_gap) and blind.gap_rad > 0
    # the chunk's last step is compared with the plan's at the same step
    assert np.allclose(blind.scripted, [scripted(s)[7, RIGHT_ARM] for s in seeds])
    lines = probe_lines(blind, 8)
    assert lines[-2].split() == ["mean", "0.00", "1.00"] and "8 steps" in lines[0] and "6 seeds" in lines[0]


def test_too_few_episodes_or_a_plan_shorter_than_the_chunk_is_an_error():
    with pytest.raises(ValueError, match="at least 4 episodes"):
        probe_first_chunks(lambda s: scripted(s)[:8], scripted, CUBES.get, [0, 1, 2])
    with pytest.raises(ValueError, match="seed 0: the chunk is"):
        probe_first_chunks(lambda s: np.zeros((30, 14)), scripted, CUBES.get, [0, 1, 2, 3])
