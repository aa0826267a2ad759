"""Scripted transfer_cube demonstrations: an end-effector rollout in gym-aloha's mocap task, replayed as joint targets
in the joint-space task, reaches the top reward stage; `sim-record` writes them as a LeRobot v3 dataset that the
package's own reader and converter take."""

import json

import numpy as np
import pytest
from gym_aloha.utils import sample_box_pose

from oxygen_ros.commands.sim_record import main as record_main
from oxygen_ros.data.bag import bag_topics
from oxygen_ros.data.convert import main as convert_main
from oxygen_ros.data.lerobot import dataset_checksums, lerobot_info, read_lerobot
from oxygen_ros.sim.aloha_env import REWARD_STAGES, AlohaSimEnv
from oxygen_ros.sim.demonstrations import (
    EPISODE_STEPS,
    REPLAN_STEP,
    RIGHT_SHOULDER,
    demonstration,
    end_effector_rollout,
    held_in_replay,
    pick_rotation,
    right_arm_offsets,
)

TRANSFERRED = REWARD_STAGES["transfer_cube"].index("cube transferred")
LIFTED = REWARD_STAGES["transfer_cube"].index("cube lifted")

pytestmark = pytest.mark.system  # MuJoCo physics


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    sim = AlohaSimEnv("transfer_cube", cameras=("top",), height=16, width=16, max_steps=EPISODE_STEPS)
    yield sim
    sim.close()


def planned(env, seed: int) -> np.ndarray:
    """The targets `demonstration` replays: the rollout, its left grasp aimed where the replay holds the cube."""
    return end_effector_rollout(seed, held=held_in_replay(env, seed, end_effector_rollout(seed)))


# 15: the cube in the table's near corner (x 0.17, y 0.44); picked pointing along -x, the arm never touched it
@pytest.mark.parametrize("seed", [0, 3, 15])
def test_a_seeded_demonstration_transfers_the_cube_in_the_joint_space_task(env, seed):
    demo = demonstration(env, seed)
    reward = demo.episode.reward
    assert TRANSFERRED == 4 and demo.success and demo.max_reward == TRANSFERRED == reward.max()
    # in order: the right gripper lifts the cube before the left one takes it, nothing happens on the way down
    assert (reward[:80] == 0).all()
    assert np.argmax(reward >= LIFTED) < np.argmax(reward >= TRANSFERRED)
    # the left gripper holds the cube off the table to the episode's end, the right one open by then (a finger's
    # contact may flicker for a step: gym-aloha's reward is 0 while nothing touches the cube)
    assert reward[-1] == TRANSFERRED and (reward[-20:] == TRANSFERRED).mean() >= 0.9
    assert demo.episode.actions[-1, 13] == 1.0
    assert demo.episode.length == EPISODE_STEPS and demo.episode.images["top"].shape == (EPISODE_STEPS, 16, 16, 3)
    # the recorded actions are the rollout's joint targets, and the replay reached them
    np.testing.assert_allclose(demo.episode.actions, planned(env, seed), atol=1e-6)
    tracking = np.abs(demo.episode.state[1:, :6] - demo.episode.actions[:-1, :6])
    assert np.median(tracking) < 0.01 and np.quantile(tracking, 0.95) < 0.05


def test_the_right_gripper_picks_facing_away_from_its_shoulder(env):
    """Over the cube, the gripper points along the line from the right arm's waist to the cube, tilted down."""
    shoulder = env.physics.named.data.xpos["vx300s_right/shoulder_link"]
    np.testing.assert_allclose(RIGHT_SHOULDER, shoulder[:2], atol=1e-9)
    for seed in (15, 8, 100001):
        cube = sample_box_pose(seed)[:3]
        pointing = pick_rotation(cube)[:, 0]  # the gripper link's x axis: along the fingers
        away = (cube[:2] - RIGHT_SHOULDER) / np.linalg.norm(cube[:2] - RIGHT_SHOULDER)
        np.testing.assert_allclose(pointing[:2] / np.linalg.norm(pointing[:2]), away, atol=1e-9)
        assert pointing[2] == pytest.approx(-np.sin(np.radians(50.0)))


def test_the_left_grasp_is_aimed_where_the_joint_space_replay_holds_the_cube(env):
    """Seed 2 (x 0.09, y 0.41): the welded gripper of the end-effector task drops the cube that joint control
    carries; aimed at the table, the left arm would reach far below the held cube."""
    first = end_effector_rollout(2)
    held = held_in_replay(env, 2, first)
    assert held[2] > 0.2  # in the air in the joint-space task
    again = end_effector_rollout(2, held=held)
    np.testing.assert_array_equal(again[:REPLAN_STEP], first[:REPLAN_STEP])  # changed only from the replanning on
    assert np.abs(again[REPLAN_STEP:, :6] - first[REPLAN_STEP:, :6]).max() > 0.1  # the left arm goes elsewhere


def test_right_arm_offsets_are_seeded_smooth_and_held_after_the_last_knot():
    offsets = right_arm_offsets(7, EPISODE_STEPS, 0.03)
    assert offsets.shape == (EPISODE_STEPS, 14)
    np.testing.assert_array_equal(offsets, right_arm_offsets(7, EPISODE_STEPS, 0.03))
    assert np.abs(offsets - right_arm_offsets(8, EPISODE_STEPS, 0.03)).max() > 0.01
    assert not offsets[:, :7].any() and not offsets[:, 13].any()  # the left arm and both grippers as planned
    assert not offsets[0].any() and (offsets[150:] == offsets[150]).all() and np.abs(offsets[150]).max() > 0
    assert np.abs(np.diff(offsets, axis=0)).max() < 0.01  # no jump: at most a few scales per 50 steps
    assert not right_arm_offsets(7, EPISODE_STEPS, 0.0).any()


def test_a_perturbed_demonstration_records_the_plan_it_did_not_quite_execute(env):
    """DART: the right arm is driven off its targets, the recorded actions are the targets, so every frame shows
    the way back; the left grasp is aimed where this replay, perturbed, holds the cube."""
    seed, scale = 0, 0.03
    demo = demonstration(env, seed, perturb=scale)
    offsets = right_arm_offsets(seed, EPISODE_STEPS, scale)
    first = end_effector_rollout(seed)
    targets = end_effector_rollout(seed, held=held_in_replay(env, seed, first, offsets))
    np.testing.assert_allclose(demo.episode.actions, targets, atol=1e-6)
    executed = targets + offsets
    right = slice(7, 13)
    # the right arm follows what was executed, not the recorded actions
    assert np.median(np.abs(demo.episode.state[1:, right] - executed[:-1, right])) < 0.01
    assert np.median(np.abs(demo.episode.state[160:, right] - targets[159:-1, right])) > 0.01
    assert not np.allclose(held_in_replay(env, seed, first, offsets), held_in_replay(env, seed, first), atol=0.01)


def test_demonstration_i_is_reproducible_and_seeds_differ():
    first, again, other = end_effector_rollout(1), end_effector_rollout(1), end_effector_rollout(2)
    np.testing.assert_array_equal(first, again)
    assert np.abs(first - other).max() > 0.05  # another cube pose, another reach


def test_sim_record_writes_a_dataset_the_reader_and_convert_take(env, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    out = tmp_path / "demos"
    assert record_main([str(out), "--episodes", "2", "--seed", "3", "--height", "24", "--width", "32"]) == 0
    printed = capsys.readouterr().out
    sim = json.loads((out / "meta" / "sim.json").read_text())
    tried = len(sim["attempts"])
    assert f"scripted success 2/{tried} " in printed and sim["seeds"][0] == 3 and len(sim["seeds"]) == 2
    assert sim["perturb"] == 0.0
    assert all(a["max_reward"] == 4 for a in sim["attempts"] if a["seed"] in sim["seeds"])
    sums = dataset_checksums(out)
    for name in ("data/chunk-000/file-000.parquet", "meta/info.json", "*"):
        assert f"sha256 {sums[name]}  {name}" in printed
    assert lerobot_info(out)["total_episodes"] == 2 and lerobot_info(out)["robot_type"] == "aloha"
    for index, seed in enumerate(sim["seeds"]):
        episode = read_lerobot(out, index)
        assert episode.length == EPISODE_STEPS and episode.cameras == ("top",)
        assert episode.images["top"].shape == (EPISODE_STEPS, 24, 32, 3)
        assert episode.task == "Pick up the cube with the right arm and transfer it to the left arm."
        np.testing.assert_allclose(episode.actions, planned(env, seed), atol=1e-6)
        # the cube's pose every step (observation.environment_state): where gym-aloha put it, then in the air
        cube = episode.environment_state
        assert cube.shape == (EPISODE_STEPS, 7)
        np.testing.assert_allclose(cube[0], sample_box_pose(seed), atol=1e-6)
        assert cube[:, 2].max() > 0.15  # lifted off the table (2 cm to its centre there)
    bag = tmp_path / "episode_1"
    assert convert_main(["lerobot", str(out), str(bag), "--episode", "1"]) == 0
    assert "camera/top/image_raw" in {topic.name.lstrip("/") for topic in bag_topics(bag)}


def test_sim_record_refuses_a_bad_request_in_one_line(tmp_path, capsys):
    from oxygen_ros.commands.cli import main as cli_main

    assert cli_main(["sim-record", str(tmp_path / "d"), "--episodes", "3", "--max-attempts", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-attempts 2 is fewer than --episodes 3" in err[0]
    assert not (tmp_path / "d").exists()
    assert cli_main(["sim-record", str(tmp_path / "d"), "--perturb", "nan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--perturb must be at least 0" in err[0] and not (tmp_path / "d").exists()


def test_sim_record_perturb_records_the_targets_of_a_perturbed_replay(env, tmp_path, monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    out = tmp_path / "perturbed"
    assert record_main([str(out), "--episodes", "1", "--seed", "0", "--height", "16", "--width", "16",
                        "--perturb", "0.03"]) == 0
    sim = json.loads((out / "meta" / "sim.json").read_text())
    assert sim["perturb"] == 0.03 and sim["seeds"] == [0]
    expected = demonstration(env, 0, perturb=0.03).episode
    episode = read_lerobot(out, 0)
    np.testing.assert_allclose(episode.actions, expected.actions, atol=1e-6)
    np.testing.assert_allclose(episode.state, expected.state, atol=1e-5)
