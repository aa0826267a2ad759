"""Training the tiny pi0.5 on an episode: the training forward computes what inference computes, the losses fall,
and the checkpoint folder loads the way the node loads one."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from oxygen_ros.command_line import UsageError
from oxygen_ros.commands.train_tiny import (
    TOKENIZER_FILE,
    TrainConfig,
    action_chunks,
    dataset_content_hash,
    episode_content_hash,
    fit,
    norm_stats_from_episodes,
    read_episodes,
    resume_folder,
    snapshot_folder,
    train,
    training_set,
)
from oxygen_ros.commands.train_tiny import main as train_main
from oxygen_ros.control.embodiment import load_embodiment
from oxygen_ros.data.aloha import write_aloha
from oxygen_ros.data.captions import STILL, frame_captions
from oxygen_ros.data.lerobot import write_lerobot
from oxygen_ros.data.synthetic import synthetic_episode
from oxygen_ros.model.checkpoint import load_checkpoint
from oxygen_ros.model.config import get_preset, resized_shape
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.preprocess import ACTION_KEY, STATE_KEY
from oxygen_ros.model.tokenizer import load_tokenizer
from oxygen_ros.model.train import order_number_embeddings, prefix_with_caption, sample_times

TINY = get_preset("tiny")
ALOHA = load_embodiment("aloha")
TASK = "pick up the red cube and place it in the bowl"


@pytest.fixture(scope="module")
def episode():
    return synthetic_episode(seconds=3.0, fps=50, cameras=("cam_high", "cam_left_wrist"), task=TASK,
                             motion="handover")


@pytest.fixture(scope="module")
def data(episode, tokenizer):
    return training_set([episode], TINY, tokenizer, norm_stats_from_episodes([episode], ALOHA, TINY.action_horizon),
                        ALOHA)


def test_captions_name_the_moving_arm_and_phase(episode):
    captions = frame_captions(episode.actions)
    assert captions[-1] == STILL
    phases = [c for i, c in enumerate(captions) if i == 0 or c != captions[i - 1]]
    for phrase in ("left arm moves", "left gripper closes", "left arm carries", "right arm moves",
                   "right gripper closes", "left gripper opens", "right arm carries", "right gripper opens"):
        assert any(phrase in caption for caption in phases), phrase
    assert phases.index("left gripper closes") < phases.index("left arm carries") < phases.index(
        "right gripper closes") < phases.index("left gripper opens")


def test_chunks_start_at_their_frame_and_repeat_the_last_action():
    actions = np.arange(10, dtype=np.float64)[:, None] * [1.0, -1.0]
    chunks = action_chunks(actions, 4)
    np.testing.assert_array_equal(chunks[2, :, 0], [2, 3, 4, 5])
    np.testing.assert_array_equal(chunks[8, :, 1], [-8, -9, -9, -9])


def test_flow_matching_times_follow_beta_1_5_1():
    t = sample_times(200_000, torch.Generator().manual_seed(0))
    assert float(t.min()) >= 0.001 and float(t.max()) <= 1.0
    # Beta(1.5, 1) has mean 0.6 and P(x < 0.5) = 0.5 ** 1.5
    assert float(t.mean()) == pytest.approx(0.001 + 0.999 * 0.6, abs=3e-3)
    assert float((t < 0.001 + 0.999 * 0.5).float().mean()) == pytest.approx(0.5**1.5, abs=3e-3)


def test_training_forward_matches_prefill_and_decode(data):
    """The text logits and prefix K/V of the training forward equal prefill + decode_step's, token by token."""
    model = build_model(TINY, seed=3)
    frames = torch.tensor([5, 70, 140])
    inputs, _, caption, mask = data.batch(frames)
    prefix_k, _, valid, logits = prefix_with_caption(model, inputs, caption, mask)
    cache = KVCache(TINY, 3, TINY.prefix_len + caption.shape[1])
    slots = torch.arange(3)
    prefill = model.prefill(inputs, cache, slots, want_logits=True)
    torch.testing.assert_close(prefix_k, cache.k[:, :, :, : TINY.prefix_len], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[:, 0], prefill.logits, atol=1e-4, rtol=1e-4)
    for n in range(caption.shape[1]):
        step = model.decode_step(cache, slots, caption[:, n], torch.full((3,), TINY.prefix_len + n),
                                 prefill.num_valid + n)
        real = mask[:, n]  # past a caption's end the decode would have stopped
        torch.testing.assert_close(logits[real, n + 1], step[real], atol=1e-4, rtol=1e-4)


def test_a_few_steps_make_both_losses_fall(data):
    model = build_model(TINY, seed=0)
    history = fit(model, data, TrainConfig(steps=40, batch_size=8, warmup_steps=5), log=lambda line: None)
    first, last = history[:8], history[-8:]
    for name in ("action", "text"):
        assert np.mean([h[name] for h in last]) < 0.7 * np.mean([h[name] for h in first]), name


def test_train_tiny_writes_a_checkpoint_folder_that_loads_like_a_real_one(tmp_path, episode, capsys):
    hdf5 = write_aloha(tmp_path / "episode_0.hdf5", episode)
    threads = torch.get_num_threads()
    assert train_main([str(hdf5), str(tmp_path / "ckpt"), "--task", TASK, "--steps", "3", "--batch-size", "4",
                       "--threads", str(threads + 1)]) == 0
    assert f"wrote {tmp_path / 'ckpt'}: 3 steps" in capsys.readouterr().out
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded.model.config == TINY and loaded.trained_on.embodiment == "aloha"
    stats = norm_stats_from_episodes([episode], ALOHA, TINY.action_horizon)
    for key in (STATE_KEY, ACTION_KEY):
        for stat in ("q01", "q99", "mean", "std"):
            np.testing.assert_allclose(loaded.norm_stats[key][stat], stats[key][stat], rtol=1e-6, atol=1e-6)
    assert load_tokenizer(tmp_path / "ckpt" / TOKENIZER_FILE).vocab_size <= TINY.vocab_size
    written = json.loads((tmp_path / "ckpt" / "training.json").read_text())
    assert written["episode_sha256"] == episode_content_hash(episode) and len(written["loss"]) == 3
    assert torch.get_num_threads() == threads  # training's own thread count does not leak into its caller


def test_train_tiny_names_a_bad_episode_and_writes_nothing(tmp_path, capsys):
    assert train_main([str(tmp_path / "missing.hdf5"), str(tmp_path / "ckpt")]) == 1
    assert "missing.hdf5" in capsys.readouterr().err and not (tmp_path / "ckpt").exists()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A LeRobot v3 dataset of three short episodes (each its own motion), with the sim's camera name."""
    episodes = []
    for seconds, motion in ((1.0, "handover"), (1.2, "handover"), (0.8, "sinusoids")):
        episode = synthetic_episode(seconds=seconds, fps=50, cameras=("cam_high",), task=TASK, motion=motion)
        episode.images = {"top": episode.images["cam_high"]}
        episodes.append(episode)
    return write_lerobot(tmp_path_factory.mktemp("data") / "demos", episodes, robot_type="aloha"), episodes


def test_train_tiny_trains_on_every_episode_of_a_dataset_into_a_cached_checkpoint(tmp_path, dataset, capsys):
    root, episodes = dataset
    out = tmp_path / "ckpt"
    assert train_main([str(root), str(out), "--steps", "4", "--batch-size", "4"]) == 0
    assert f"wrote {out}: 4 steps on 3 episodes (150 frames)" in capsys.readouterr().out
    written = json.loads((out / "training.json").read_text())
    assert written["episodes"] == 3 and written["cameras"] == {"top": list(episodes[0].images["top"].shape[1:3])}
    assert len(written["loss"]) == 4 and (out / "loss.png").stat().st_size > 0
    # the stats cover every episode's frames: the third episode's motion widens the action range
    episodes = read_episodes(str(root))
    loaded = load_checkpoint(out)
    only_two = norm_stats_from_episodes(episodes[:2], ALOHA, TINY.action_horizon)
    all_three = norm_stats_from_episodes(episodes, ALOHA, TINY.action_horizon)
    np.testing.assert_allclose(loaded.norm_stats[ACTION_KEY]["q99"], all_three[ACTION_KEY]["q99"], rtol=1e-6)
    assert not np.allclose(all_three[ACTION_KEY]["q99"], only_two[ACTION_KEY]["q99"])
    # the same data and settings again: the checkpoint is reused, not retrained
    weights = (out / "model.safetensors").stat().st_mtime_ns
    assert train_main([str(root), str(out), "--steps", "4", "--batch-size", "4"]) == 0
    assert "already holds this training" in capsys.readouterr().out
    assert (out / "model.safetensors").stat().st_mtime_ns == weights
    assert written["episode_sha256"] == dataset_content_hash(read_episodes(str(root)))  # as read: videos are lossy
    # other settings into the same folder: refused, the folder kept
    assert train_main([str(root), str(out), "--steps", "5", "--batch-size", "4"]) == 1
    assert "already exists" in capsys.readouterr().err and (out / "model.safetensors").stat().st_mtime_ns == weights


def test_the_sim_preset_trains_on_the_top_camera_into_a_policy_of_one_second_chunks(tmp_path, dataset, capsys):
    """`--preset sim`: the 96x128 top view fills 12 x 9 of its 8-px patches (tiny's 56 px in 14-px patches: 4 x 3), and
    the checkpoint turns a sim frame into 50 absolute joint targets, 1 s at 50 Hz."""
    from oxygen_ros.commands.sim_eval import CheckpointPolicy

    sim = get_preset("sim")
    assert sim.camera_names == ("base_0_rgb",) and sim.action_horizon == 50
    patches = [side // sim.vision.patch_size for side in resized_shape(96, 128, sim.vision.image_size)]
    tiny = [side // TINY.vision.patch_size for side in resized_shape(96, 128, TINY.vision.image_size)]
    assert patches == [9, 12] and tiny == [3, 4]
    root, episodes = dataset
    out = tmp_path / "ckpt"
    assert train_main([str(root), str(out), "--preset", "sim", "--steps", "2", "--batch-size", "4"]) == 0
    assert f"wrote {out}: 2 steps on 3 episodes" in capsys.readouterr().out
    policy = CheckpointPolicy(out)
    assert policy.model.config == sim and policy.cameras == {"top": (96, 128)}
    qpos = episodes[0].state[10].astype(np.float64)
    chunk = policy.chunk({"top": episodes[0].images["top"][10]}, qpos, TASK)
    assert chunk.shape == (50, 14) and np.isfinite(chunk).all()


def test_a_crop_goes_into_the_checkpoint_and_is_what_the_policy_sees(tmp_path, dataset, capsys):
    """`--crop top=T,L,B,R`: the model's image key gets the part of the top view, in the checkpoint's config, so
    every path that loads it (the node, serve, in process) crops the same way; a crop of a camera the model does not
    take is refused in one line and a malformed one is a usage error."""
    from oxygen_ros.commands.sim_eval import CheckpointPolicy

    root, episodes = dataset
    out = tmp_path / "crop"
    box = (0.3, 0.35, 0.7, 0.75)
    assert train_main([str(root), str(out), "--preset", "sim", "--steps", "2", "--batch-size", "4",
                       "--crop", "top=" + ",".join(map(str, box))]) == 0
    policy = CheckpointPolicy(out)
    assert policy.model.config == get_preset("sim").replace(image_crops=(("base_0_rgb", box),))
    frame = episodes[0].images["top"][10]
    qpos = episodes[0].state[10].astype(np.float64)
    policy.calls, chunk = 0, policy.chunk({"top": frame}, qpos, TASK)
    assert chunk.shape == (50, 14) and np.isfinite(chunk).all()
    shifted = frame.copy()
    shifted[: frame.shape[0] // 8] = 0  # above the crop: the policy does not see it
    policy.calls = 0  # the same flow-matching noise as the first call's
    np.testing.assert_array_equal(policy.chunk({"top": shifted}, qpos, TASK), chunk)
    policy.calls, shifted[frame.shape[0] // 2:, frame.shape[1] // 2:] = 0, 0  # inside the crop: it does
    assert not np.array_equal(policy.chunk({"top": shifted}, qpos, TASK), chunk)
    capsys.readouterr()
    assert train_main([str(root), str(tmp_path / "wrist"), "--preset", "sim", "--steps", "2",
                       "--crop", "cam_left_wrist=0.1,0.1,0.9,0.9"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--crop cam_left_wrist" in err and not (tmp_path / "wrist").exists()
    with pytest.raises(SystemExit) as usage:
        train_main([str(root), str(tmp_path / "bad"), "--crop", "top=0.1,0.2"])
    assert usage.value.code == 2 and "CAMERA=TOP,LEFT,BOTTOM,RIGHT" in capsys.readouterr().err


def test_object_captions_teach_the_text_side_where_the_object_is(tmp_path, episode, tokenizer, capsys):
    """`--object-captions`: each frame's caption adds the object's position from the episode's environment state,
    so the captions of a moved object differ and its position is part of the data's identity; episodes without
    one are refused in one line."""
    import dataclasses

    path = np.linspace([0.10, 0.50, 0.02], [0.0, 0.5, 0.25], episode.length)  # the object rises as it crosses
    placed = dataclasses.replace(episode, environment_state=path.astype(np.float32))
    stats = norm_stats_from_episodes([placed], ALOHA, TINY.action_horizon)
    located = training_set([placed], TINY, tokenizer, stats, ALOHA, locate=True)
    plain = training_set([placed], TINY, tokenizer, stats, ALOHA)
    assert located.captions[0] == f"{plain.captions[0]}, object at x 10 y 50 z 2"
    assert located.captions[-1] == f"{plain.captions[-1]}, object at x 0 y 50 z 25"
    assert tokenizer.decode(located.caption[0][located.caption_mask[0]].tolist()) == located.captions[0]
    assert episode_content_hash(placed) != episode_content_hash(episode)
    root = write_lerobot(tmp_path / "placed", [placed])
    out = tmp_path / "ckpt"
    assert train_main([str(root), str(out), "--steps", "2", "--batch-size", "4", "--object-captions"]) == 0
    assert json.loads((out / "training.json").read_text())["train_config"]["object_captions"] is True
    without = write_lerobot(tmp_path / "plain", [episode])
    assert train_main([str(without), str(tmp_path / "no"), "--steps", "2", "--object-captions"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "environment_state" in err and not (tmp_path / "no").exists()


def test_a_pretrained_frozen_vision_tower_tells_where_the_object_is_and_stays_as_it_was(tmp_path, episode, capsys):
    """`--vision-pretrain N --freeze-vision`: the tower first learns alone to tell where the object is (its held-out
    loss falls well below 1, what knowing nothing scores), then keeps those weights while the rest trains; without
    the objects' poses it is refused in one line."""
    import dataclasses

    from safetensors.torch import load_file

    rng = np.random.default_rng(0)
    frames = np.full_like(episode.images["cam_high"], 80)  # a grey table, as in the sim
    path = np.zeros((episode.length, 7), np.float32)
    for t in range(episode.length):  # a white square wherever the object is: its pose is in the pixels
        row, col = rng.integers(0, frames.shape[1] - 16), rng.integers(0, frames.shape[2] - 16)
        frames[t, row: row + 16, col: col + 16] = (255, 0, 0)
        path[t, :3] = (col / frames.shape[2], row / frames.shape[1], 0.02)
    placed = dataclasses.replace(episode, images={"cam_high": frames}, environment_state=path)
    root = write_lerobot(tmp_path / "placed", [placed], codec="av1")
    first, frozen = tmp_path / "first", tmp_path / "frozen"
    assert train_main([str(root), str(first), "--preset", "sim", "--steps", "1", "--batch-size", "16",
                       "--vision-pretrain", "200"]) == 0
    pretrain = json.loads((first / "training.json").read_text())["vision_pretrain"]
    assert pretrain["held_out_loss_after"] < 0.5 * pretrain["held_out_loss_before"]
    capsys.readouterr()
    assert train_main([str(root), str(frozen), "--preset", "sim", "--steps", "3", "--batch-size", "4",
                       "--init", str(first), "--freeze-vision"]) == 0
    start, end = load_file(first / "model.safetensors"), load_file(frozen / "model.safetensors")
    vision = [name for name in start if "vision" in name or "img" in name]
    assert vision and all(torch.equal(start[name], end[name]) for name in vision)
    assert any(not torch.equal(start[name], end[name]) for name in start if name not in vision)
    plain = write_lerobot(tmp_path / "plain", [episode])
    assert train_main([str(plain), str(tmp_path / "no"), "--steps", "2", "--vision-pretrain", "5"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "environment_state" in err and not (tmp_path / "no").exists()


def test_a_stopped_training_resumes_where_it_saved_and_ends_as_an_unbroken_one(tmp_path, dataset, monkeypatch):
    from oxygen_ros.commands import train_tiny

    _, episodes = dataset
    config = TrainConfig(steps=6, batch_size=4, warmup_steps=2, save_every=3)
    straight = train(episodes, tmp_path / "straight", config, log=lambda line: None)
    real_evaluate, calls = train_tiny.evaluate, []

    def evaluate_then_stop(*args, **kwargs):  # the run dies after its last step, before the checkpoint is written
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(train_tiny, "evaluate", evaluate_then_stop)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        train(episodes, out, config, log=lambda line: None)
    assert not out.exists() and (resume_folder(out) / "state.pt").is_file()
    # what the save left is also a checkpoint of the weights after step 3, loadable before the run ends
    snapshot = snapshot_folder(out, 3)
    assert sorted(p.name for p in resume_folder(out).glob("checkpoint-*")) == [snapshot.name]
    partial = json.loads((snapshot / "training.json").read_text())
    assert partial["partial"] is True and partial["step"] == 3 and partial["cameras"] == straight["cameras"]
    saved = torch.load(resume_folder(out) / "state.pt", weights_only=False)["model"]
    for name, weights in load_checkpoint(snapshot).model.state_dict().items():
        torch.testing.assert_close(weights, saved[name], rtol=0, atol=0, msg=name)
    monkeypatch.setattr(train_tiny, "evaluate", real_evaluate)
    lines = []
    resumed = train(episodes, out, config, log=lines.append)
    assert resumed["resumed_from_step"] == 3 and any("resuming from step 3" in line for line in lines)
    assert not resume_folder(out).exists()
    assert resumed["loss"] == straight["loss"]  # the same batches, noise and optimizer state from step 3 on
    a, b = load_checkpoint(tmp_path / "straight").model, load_checkpoint(out).model
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_a_run_with_other_settings_replaces_what_a_stopped_one_left(tmp_path, dataset, monkeypatch):
    """A stopped run's state and snapshot do not resume a run of other settings into the same folder: it starts
    afresh and its own saves replace them (the stale snapshot of the same step once stopped it at its first save)."""
    from oxygen_ros.commands import train_tiny

    _, episodes = dataset
    out, real_evaluate, calls = tmp_path / "out", train_tiny.evaluate, []

    def evaluate_then_stop(*args, **kwargs):  # the first run dies after its last step, its state saved at step 3
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(train_tiny, "evaluate", evaluate_then_stop)
    with pytest.raises(KeyboardInterrupt):
        train(episodes, out, TrainConfig(steps=6, batch_size=4, warmup_steps=2, save_every=3), log=lambda line: None)
    assert snapshot_folder(out, 3).is_dir()
    monkeypatch.setattr(train_tiny, "evaluate", real_evaluate)
    lines = []
    other = train(episodes, out, TrainConfig(steps=6, batch_size=4, warmup_steps=2, save_every=3, seed=1),
                  log=lines.append)
    assert other["resumed_from_step"] == 0 and any("starting afresh" in line for line in lines)
    assert other["train_config"]["seed"] == 1 and not resume_folder(out).exists()
    assert load_checkpoint(out).norm_stats


def test_train_tiny_names_episodes_that_do_not_fit_together(tmp_path, dataset):
    _, episodes = dataset
    odd = synthetic_episode(seconds=0.5, fps=50, cameras=("cam_high",), task=TASK, motion="handover")
    with pytest.raises(Exception, match="episode 1 has cameras"):
        train([episodes[0], odd], tmp_path / "ckpt", TrainConfig(steps=1), log=lambda line: None)
    assert not Path(tmp_path / "ckpt").exists()


def test_a_warm_start_begins_from_the_other_checkpoints_weights_with_this_datas_stats(tmp_path, dataset, capsys):
    """`--init CKPT`: the weights (and tokenizer) of another run of the same preset, the new data's norm stats; the
    starting weights are part of the run's identity; another preset's checkpoint is refused in one line."""
    root, episodes = dataset
    first, warm = tmp_path / "first", tmp_path / "warm"
    assert train_main([str(root), str(first), "--steps", "3", "--batch-size", "4", "--episodes", "2"]) == 0
    capsys.readouterr()
    assert train_main([str(root), str(warm), "--steps", "2", "--batch-size", "4", "--init", str(first)]) == 0
    assert f"starting from {first}'s weights" in capsys.readouterr().out
    written = json.loads((warm / "training.json").read_text())
    assert written["init_checkpoint"] == str(first) and len(written["init_sha256"]) == 64
    assert (warm / TOKENIZER_FILE).read_bytes() == (first / TOKENIZER_FILE).read_bytes()
    stats = norm_stats_from_episodes(read_episodes(str(root)), ALOHA, TINY.action_horizon)
    np.testing.assert_allclose(load_checkpoint(warm).norm_stats[ACTION_KEY]["q99"], stats[ACTION_KEY]["q99"],
                               rtol=1e-6)
    # the run began from the first one's weights: its first loss is what those weights give, not random ones'
    config = TrainConfig(steps=1, batch_size=4, warmup_steps=30)
    fresh = train(episodes, tmp_path / "fresh", config, log=lambda line: None)
    again = train(episodes, tmp_path / "again", config, log=lambda line: None, init=first)
    same_init = train(episodes, tmp_path / "same", config, log=lambda line: None, init=first)
    assert again["loss"] == same_init["loss"] and again["loss"] != fresh["loss"]
    assert again["before"]["action_error"] != fresh["before"]["action_error"]
    first_model = load_checkpoint(first).model.state_dict()
    moved = max(float((load_checkpoint(tmp_path / "again").model.state_dict()[name] - w).abs().max())
                for name, w in first_model.items())
    assert 0 < moved < 0.01
    # a checkpoint of other shapes is refused in one line, nothing written
    assert train_main([str(root), str(tmp_path / "sim"), "--preset", "sim", "--steps", "1", "--init", str(first)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not the sim preset's" in err and not (tmp_path / "sim").exists()


def test_ordered_number_embeddings_place_each_state_bin_by_its_size(tokenizer):
    """Every state bin number that is one token gets a row in which neighbours are alike and far numbers are not,
    and from which a linear map reads the number; the rest of the table is left as it was."""
    model = build_model(get_preset("sim"), seed=0)
    table = model.backbone.embed_tokens.weight
    before = table.detach().clone()
    numbers = [n for n in range(256) if len(tokenizer.encode(str(n))) == 1]
    rows = [tokenizer.encode(str(n))[0] for n in numbers]
    assert order_number_embeddings(model, tokenizer) == len(numbers) and len(numbers) > 128
    after = table.detach()
    others = torch.ones(len(after), dtype=torch.bool)
    others[rows] = False
    assert torch.equal(after[others], before[others]) and not torch.equal(after[rows], before[rows])
    codes = torch.nn.functional.normalize(after[rows], dim=1)
    similarity = codes @ codes.T
    index = {n: i for i, n in enumerate(numbers)}

    def alike(distance: int) -> float:  # the mean similarity of numbers `distance` apart
        return float(np.mean([float(similarity[index[n], index[n + distance]]) for n in numbers
                              if n + distance in index]))

    profile = [alike(distance) for distance in (1, 2, 4, 8, 16, 32, 64)]
    assert profile == sorted(profile, reverse=True) and profile[0] > 0.6 and abs(profile[-1]) < 0.1
    features = np.c_[after[rows].double().numpy(), np.ones(len(rows))]
    weights, *_ = np.linalg.lstsq(features, np.array(numbers, dtype=np.float64), rcond=None)
    assert np.abs(features @ weights - numbers).max() < 1  # a linear map reads the bin exactly
    # the same size as the random rows, so the layers see them at the scale they see words
    assert 0.8 < float(after[rows].norm(dim=1).mean() / before[others].norm(dim=1).mean()) < 1.25


def test_train_tiny_orders_the_number_embeddings_when_asked_and_not_over_a_warm_start(tmp_path, dataset, capsys):
    """`--ordered-numbers`: the run says how many bin numbers it ordered and is a run of its own (not the cached
    plain one); with `--init` it is refused in one line, nothing written."""
    root, _ = dataset
    plain, ordered = tmp_path / "plain", tmp_path / "ordered"
    assert train_main([str(root), str(plain), "--steps", "1", "--batch-size", "4"]) == 0
    capsys.readouterr()
    assert train_main([str(root), str(ordered), "--steps", "1", "--batch-size", "4", "--ordered-numbers"]) == 0
    out = capsys.readouterr().out
    assert "ordered embeddings for" in out and "already holds" not in out
    written = json.loads((ordered / "training.json").read_text())
    assert written["train_config"]["ordered_numbers"] is True
    assert written["loss"][0] != json.loads((plain / "training.json").read_text())["loss"][0]
    with pytest.raises(UsageError, match="--ordered-numbers"):
        train_main([str(root), str(tmp_path / "no"), "--steps", "1", "--init", str(plain), "--ordered-numbers"])
    assert not (tmp_path / "no").exists()
