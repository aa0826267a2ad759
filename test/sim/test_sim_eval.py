"""sim-eval's bookkeeping in process: success is gym-aloha's reward, evaluation seeds avoid the training seeds, and
the reduced pipeline (sim-record -> train-tiny -> sim-eval) runs end to end on real files, model and physics."""

import json
import shutil

import numpy as np
import pytest

from oxygen_ros.command_line import UsageError
from oxygen_ros.commands.sim_eval import main as eval_main
from oxygen_ros.commands.sim_eval import run_episode
from oxygen_ros.commands.sim_record import main as record_main
from oxygen_ros.commands.train_tiny import main as train_main
from oxygen_ros.sim.aloha_env import AlohaSimEnv
from oxygen_ros.sim.delayed_loop import run_delayed
from oxygen_ros.sim.demonstrations import EPISODE_STEPS, demonstration
from oxygen_ros.sim.evaluation import evaluation_seeds, wilson_interval

pytestmark = pytest.mark.system  # MuJoCo physics


def test_evaluation_seeds_skip_the_training_seeds_and_the_interval_is_wilsons():
    assert evaluation_seeds(3, 4, {0, 1, 2, 4, 6}) == [3, 5, 7, 8]
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-3) and high == pytest.approx(0.9433, abs=1e-3)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0


class ReplayPolicy:
    """Chunks cut from a demonstration's joint targets at the sim's current step (a policy that knows the plan)."""

    def __init__(self, env, targets):
        self.env, self.targets = env, targets

    def chunk(self, images, qpos, task):
        return self.targets[self.env.steps: self.env.steps + 8]


def test_an_episode_counts_success_at_gym_alohas_top_reward(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    env = AlohaSimEnv("transfer_cube", cameras=("top",), height=16, width=16, max_steps=EPISODE_STEPS)
    try:
        demo = demonstration(env, 0)
        first = int(np.argmax(demo.episode.reward >= 4)) + 1  # steps taken when the reward first reached 4
        done = run_episode(env, ReplayPolicy(env, demo.episode.actions), 0, execute=8)
        held_still = run_episode(env, ReplayPolicy(env, np.repeat(demo.episode.actions[:1], 400, axis=0)), 0, 8)
    finally:
        env.close()
    assert done == {"seed": 0, "max_reward": 4.0, "success": True, "success_step": first, "steps": first,
                    "diverged": False}  # the episode ends at success, as sim_node ends it
    assert held_still["success"] is False and held_still["max_reward"] == 0.0
    assert held_still["steps"] == EPISODE_STEPS


def test_record_train_and_evaluate_end_to_end_on_held_out_seeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    data, ckpt = tmp_path / "demos", tmp_path / "ckpt"
    assert record_main([str(data), "--episodes", "2", "--seed", "0", "--height", "32", "--width", "32"]) == 0
    tried = [a["seed"] for a in json.loads((data / "meta" / "sim.json").read_text())["attempts"]]
    assert train_main([str(data), str(ckpt), "--steps", "2", "--batch-size", "2"]) == 0
    assert json.loads((ckpt / "training.json").read_text())["sim_seeds"] == tried
    capsys.readouterr()
    assert eval_main([str(ckpt), "--episodes", "2", "--seed", "0", "--steps", "12", "--execute", "5",
                      "--out", str(tmp_path / "eval")]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "eval" / "sim_eval.json").read_text())
    assert result["seeds"] == [max(tried) + 1, max(tried) + 2] and not set(result["seeds"]) & set(tried)
    assert [e["steps"] for e in result["episodes"]] == [12, 12] and result["trials"] == 2
    assert result["control_rate_hz"] > 0 and result["chunk_ms"]["p99"] >= result["chunk_ms"]["p50"] > 0
    assert result["successes"] == sum(e["max_reward"] == 4 for e in result["episodes"])
    assert f"sim-eval [inproc]: {result['successes']}/2 transferred" in printed
    assert f"{len(tried)} training seeds avoided" in printed
    # a checkpoint that says it acts in another embodiment: one line, nothing evaluated
    other = tmp_path / "other"
    shutil.copytree(ckpt, other)
    config = json.loads((other / "config.json").read_text())
    config["oxygen_ros_embodiment"] = "droid"
    (other / "config.json").write_text(json.dumps(config))
    assert eval_main([str(other), "--episodes", "1", "--out", str(tmp_path / "eval2")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trained in embodiment 'droid'" in err[0]
    assert not (tmp_path / "eval2").exists()


class DelayedReplay(ReplayPolicy):
    """ReplayPolicy asked at a frame: its chunk starts at the frame's step; it keeps what it was asked with."""

    def __init__(self, env, targets):
        super().__init__(env, targets)
        self.asked = []

    def chunk(self, images, qpos, task, previous=None):
        self.asked.append((self.env.steps, previous))
        return super().chunk(images, qpos, task)


@pytest.mark.parametrize("handover", ["newest_wins", "rtc_guided"])
def test_a_delayed_chunk_takes_over_at_its_own_steps_while_the_robot_goes_on(monkeypatch, handover):
    """With chunks arriving 3 steps after their frame, a policy that knows the plan still succeeds: each chunk's
    actions are executed at the steps they were meant for (the first 3 skipped), so every command after the first
    chunk is the demonstration's own target; the robot holds until the first chunk arrives; rtc_guided asks each
    frame with its place in the chunk being executed and the delay."""
    monkeypatch.setenv("MUJOCO_GL", "egl")
    env = AlohaSimEnv("transfer_cube", cameras=("top",), height=16, width=16, max_steps=EPISODE_STEPS)
    try:
        demo = demonstration(env, 0)
        targets = demo.episode.actions
        policy = DelayedReplay(env, targets)
        observation = env.reset(0)
        commands = []
        step = env.step
        monkeypatch.setattr(env, "step", lambda action: commands.append(np.array(action)) or step(action))
        done = run_delayed(env, observation, policy, delay=3, execute=3, handover=handover, dt=0.02)
    finally:
        env.close()
    assert done.success_step is not None and done.stats["held_steps"] == 3
    assert done.steps == done.success_step == len(commands)  # the episode ends at gym-aloha's top stage
    np.testing.assert_allclose(np.array(commands[3:]), targets[3:len(commands)], atol=1e-12)
    assert [step for step, _ in policy.asked[:4]] == [0, 3, 6, 9]
    expected = [None] + [(3, 3)] * 3 if handover == "rtc_guided" else [None] * 4
    assert [previous for _, previous in policy.asked[:4]] == expected
    with pytest.raises(ValueError, match="hand-over must be one of"):
        run_delayed(env, observation, policy, delay=3, execute=3, handover="blend", dt=0.02)


def test_a_delay_without_a_hand_over_is_refused_in_one_line():
    with pytest.raises(UsageError, match="--delay needs --handover"):
        eval_main(["no-such-checkpoint", "--delay", "3"])
