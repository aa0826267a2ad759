"""`sim-probe` on a checkpoint trained here for two steps: the figures are those of the policy's first chunks and
of the scripted plan on held-out seeds (the sim's frames, the end-effector rollout), or of the recorded episodes of a
dataset, each against where gym-aloha put the cube."""

import json

import numpy as np
import pytest
from gym_aloha.utils import sample_box_pose

from oxygen_ros.command_line import UsageError
from oxygen_ros.commands.sim_eval import CheckpointPolicy, checkpoint_env
from oxygen_ros.commands.sim_probe import main as probe_main
from oxygen_ros.commands.train_tiny import main as train_main
from oxygen_ros.data.lerobot import read_lerobot, write_lerobot
from oxygen_ros.data.synthetic import synthetic_episode
from oxygen_ros.sim.demonstrations import end_effector_rollout
from oxygen_ros.sim.probe import RIGHT_ARM, explained_variance

pytestmark = pytest.mark.system  # MuJoCo physics and rendering

SEEDS = [3, 5, 8, 13]  # the dataset's episodes, as sim-record lists them


def test_held_out_and_training_episodes_are_probed_with_their_own_frames_and_plans(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    episodes = []
    for motion in ("handover", "sinusoids", "handover", "sinusoids"):
        episode = synthetic_episode(seconds=0.4, fps=50, cameras=("cam_high",), task="transfer", motion=motion)
        episode.images = {"top": episode.images["cam_high"]}
        episodes.append(episode)
    data = write_lerobot(tmp_path / "demos", episodes, robot_type="aloha")
    (data / "meta" / "sim.json").write_text(json.dumps(
        {"seeds": SEEDS, "attempts": [{"seed": s} for s in [*SEEDS, 100_001]]}))
    ckpt = tmp_path / "ckpt"
    assert train_main([str(data), str(ckpt), "--steps", "2", "--batch-size", "2"]) == 0
    capsys.readouterr()

    assert probe_main([str(ckpt), "--episodes", "4", "--out", str(tmp_path / "held")]) == 0
    printed = capsys.readouterr().out
    held = json.loads((tmp_path / "held" / "sim_probe.json").read_text())
    assert held["seeds"] == [100_000, 100_002, 100_003, 100_004]  # the training seeds avoided
    policy = CheckpointPolicy(ckpt)  # the same noise draws, in the same order
    env = checkpoint_env(policy, 1)
    horizon = policy.model.config.action_horizon
    chunks = []
    for seed in held["seeds"]:
        observation = env.reset(seed)
        chunks.append(policy.chunk(observation.images, observation.qpos, env.instruction))
    cubes = np.array([sample_box_pose(s)[:2] for s in held["seeds"]])
    plans = np.array([end_effector_rollout(s)[horizon - 1, RIGHT_ARM] for s in held["seeds"]])
    assert np.allclose(held["cube_xy"], cubes) and np.allclose(held["scripted_last"], plans)
    assert np.allclose(held["policy_last"], [c[-1, RIGHT_ARM] for c in chunks], atol=1e-6)
    assert np.allclose(held["scripted_r2"], explained_variance(cubes, plans))
    assert np.allclose(held["policy_r2"], explained_variance(cubes, np.array(held["policy_last"])))
    assert f"({horizon} steps) at the start pose on 4 seeds" in printed and "held-out seeds" in printed

    assert probe_main([str(ckpt), "--episodes", "4", "--dataset", str(data), "--out", str(tmp_path / "own")]) == 0
    own = json.loads((tmp_path / "own" / "sim_probe.json").read_text())
    recorded = np.array([read_lerobot(data, i).actions[horizon - 1, RIGHT_ARM] for i in range(4)])
    assert own["seeds"] == SEEDS and np.allclose(own["scripted_last"], recorded, atol=1e-6)
    assert np.allclose(own["cube_xy"], [sample_box_pose(s)[:2] for s in SEEDS])
    assert probe_main([str(ckpt), "--episodes", "5", "--dataset", str(data), "--out", str(tmp_path / "x")]) == 1
    assert capsys.readouterr().err.strip().endswith("4 episodes, 5 asked")
    with pytest.raises(UsageError, match="at least 4"):
        probe_main([str(ckpt), "--episodes", "3"])
