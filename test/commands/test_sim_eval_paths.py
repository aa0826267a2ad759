"""sim-eval through ROS (sim_node + a policy node over real DDS, sim time) and through `oxygen-ros serve` (openpi's
protocol, the real openpi-client), on a checkpoint trained here: the seeds are held out from the training seeds,
sim_node resets each episode with the seed it was given, and success is counted from gym-aloha's reward."""

import json
from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.command_line import UsageError
from oxygen_ros.commands.sim_eval import main as eval_main
from oxygen_ros.commands.sim_record import main as record_main
from oxygen_ros.commands.train_tiny import main as train_main
from oxygen_ros.sim.aloha_env import AlohaSimEnv
from oxygen_ros.sim.demonstrations import demonstration
from oxygen_ros.sim.evaluation import evaluation_seeds

pytestmark = pytest.mark.system  # MuJoCo physics, DDS, child processes

RESPONDER = str(Path(__file__).resolve().parents[1] / "sim_chunk_responder.py")
SIZE = 32  # px: the cameras of the reduced checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint trained two steps on one scripted demonstration (seed 0), and the seeds its data tried."""
    folder = tmp_path_factory.mktemp("sim_eval_paths")
    data, ckpt = folder / "demos", folder / "ckpt"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MUJOCO_GL", "egl")
        assert record_main([str(data), "--episodes", "1", "--seed", "0", "--height", str(SIZE), "--width",
                            str(SIZE)]) == 0
    assert train_main([str(data), str(ckpt), "--steps", "2", "--batch-size", "2"]) == 0
    tried = {a["seed"] for a in json.loads((data / "meta" / "sim.json").read_text())["attempts"]}
    return ckpt, tried


def run_eval(args, capsys) -> tuple[dict, str]:
    capsys.readouterr()
    out = Path(args[args.index("--out") + 1])
    assert eval_main(args) == 0, capsys.readouterr().err
    return json.loads((out / "sim_eval.json").read_text()), capsys.readouterr().out


def test_the_vla_node_over_dds_on_held_out_seeds(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    ckpt, tried = checkpoint
    result, printed = run_eval([str(ckpt), "--path", "ros", "--episodes", "2", "--seed", "0", "--steps", "40",
                                "--out", str(tmp_path / "eval")], capsys)
    expected = evaluation_seeds(0, 2, tried)
    assert result["seeds"] == expected and not set(expected) & tried  # the seeds sim_node reset with, held out
    assert result["trials"] == 2 and all(e["steps"] == 40 or e["success"] for e in result["episodes"])
    assert result["successes"] == sum(e["max_reward"] == 4 for e in result["episodes"])
    assert result["chunks_accepted"] > 0 and result["control_rate_hz"] > 0  # the node's chunks drove the sim
    assert result["policy_rate_hz"] == pytest.approx(50 / 8)  # by default one chunk per 8-step chunk span: each runs whole
    assert result["chunk_latency_steps"]["count"] == result["chunks_accepted"]
    assert "sim-eval [ros]: " in printed and "chunk latency in sim steps" in printed
    assert all(Path(p).is_file() for p in result["contact_sheets"])


def test_success_is_gym_alohas_reward_counted_over_dds(checkpoint, tmp_path, monkeypatch, capsys):
    """A policy node replaying over DDS a demonstration of the second held-out seed after holding still through the
    first episode: one failure (reward 0, the whole episode), one success (reward 4, ended there)."""
    monkeypatch.setenv("MUJOCO_GL", "egl")
    ckpt, tried = checkpoint
    first, second = evaluation_seeds(3, 2, tried)  # 3 and 4: the scripted plan transfers the cube on both
    env = AlohaSimEnv("transfer_cube", cameras=("top",), height=SIZE, width=SIZE)
    try:
        demo = demonstration(env, second)
    finally:
        env.close()
    assert demo.success
    plan = np.concatenate([np.repeat(demo.episode.actions[:1], 300, axis=0), demo.episode.actions])
    np.save(tmp_path / "plan.npy", plan)
    result, printed = run_eval([str(ckpt), "--path", "ros", "--episodes", "2", "--seed", "3", "--policy", RESPONDER,
                                "--policy-param", f"plan:={tmp_path / 'plan.npy'}", "delay_steps:=2",
                                "horizon:=20", "--out", str(tmp_path / "eval")], capsys)
    held, replayed = result["episodes"]
    assert (held["seed"], held["success"], held["max_reward"], held["steps"]) == (first, False, 0.0, 300)
    assert (replayed["seed"], replayed["success"], replayed["max_reward"]) == (second, True, 4.0)
    assert replayed["steps"] < 300 and replayed["success_step"] == replayed["steps"]
    assert result["successes"] == 1 and result["reached_stage"]["cube transferred"] == 1
    assert "sim-eval [ros]: 1/2 transferred (50%" in printed
    assert sorted(Path(p).name.split("_")[1] for p in result["contact_sheets"]) == ["failure", "success"]


def test_serve_path_speaks_openpis_aloha_request(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    ckpt, tried = checkpoint
    result, printed = run_eval([str(ckpt), "--path", "serve", "--episodes", "2", "--seed", "0", "--steps", "24",
                                "--out", str(tmp_path / "eval")], capsys)
    assert result["seeds"] == evaluation_seeds(0, 2, tried)
    assert [e["steps"] for e in result["episodes"]] == [24, 24]
    assert result["chunk_ms"]["count"] == 6  # one request per chunk of 8 actions, as openpi's ActionChunkBroker
    assert result["successes"] == sum(e["max_reward"] == 4 for e in result["episodes"])
    assert "sim-eval [serve]: " in printed and "openpi-client round trip" in printed


def test_serve_path_hands_chunks_over_on_the_client_side(checkpoint, tmp_path, monkeypatch, capsys):
    """With --handover, the client asks openpi-client for a chunk every --execute steps and blends the chunks
    itself (here ACT's temporal ensemble); rtc_guided, which samples with the model, is refused for serve."""
    monkeypatch.setenv("MUJOCO_GL", "egl")
    ckpt, tried = checkpoint
    result, printed = run_eval([str(ckpt), "--path", "serve", "--episodes", "1", "--seed", "0", "--steps", "24",
                                "--execute", "4", "--handover", "temporal_ensemble", "--out", str(tmp_path / "eval")],
                               capsys)
    assert result["seeds"] == evaluation_seeds(0, 1, tried) and result["episodes"][0]["steps"] == 24
    assert result["chunk_ms"]["count"] == 6  # a request every 4 steps, each chunk 8 long: they overlap
    assert result["handover"] == "temporal_ensemble" and result["held_steps"] == 0
    assert result["chunks_rejected"] == 0 and result["discontinuity_mean"] is not None
    assert "temporal_ensemble, delay 0: switch discontinuity" in printed
    with pytest.raises(UsageError, match="rtc_guided samples with the model"):
        eval_main([str(ckpt), "--path", "serve", "--handover", "rtc_guided"])


def test_a_checkpoint_of_absolute_joints_runs_in_its_own_profile_on_every_path(checkpoint, tmp_path, monkeypatch,
                                                                                capsys):
    """Trained in `aloha_sim` (openpi's pi0_aloha_sim: absolute joints), the checkpoint is run in that profile by
    the node (which refuses a profile its checkpoint was not trained in) and by `serve`, not in `aloha`'s deltas."""
    monkeypatch.setenv("MUJOCO_GL", "egl")
    ckpt, tried = checkpoint
    data = ckpt.parent / "demos"
    absolute = tmp_path / "absolute"
    assert train_main([str(data), str(absolute), "--steps", "2", "--batch-size", "2", "--embodiment", "aloha_sim"]) == 0
    for path in ("ros", "serve"):
        result, printed = run_eval([str(absolute), "--path", path, "--episodes", "1", "--seed", "0", "--steps", "24",
                                    "--out", str(tmp_path / path)], capsys)
        assert result["episodes"][0]["steps"] == 24 and result["chunk_ms"]["count"] >= 2, path
    policy_log = (tmp_path / "ros" / "policy.log").read_text()
    assert "embodiment aloha_sim," in policy_log and "cannot start" not in policy_log
    assert "embodiment aloha_sim," in (tmp_path / "serve" / "serve.log").read_text()
