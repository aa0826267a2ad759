"""`oxygen-ros train-tiny SRC OUT_CKPT`: fit the `tiny` (or `small`) pi0.5 on one ALOHA episode or on the episodes of a
LeRobot v3 dataset, and save it as a checkpoint.

The policy learns what a real one would from those episodes, through the same preprocessing the node applies:
- state and actions in an embodiment profile's space (`control.embodiment`; `--embodiment`, default `aloha`:
  openpi's ALOHA conventions, so each chunk holds the joints' deltas from its frame's state in pi's signs and the
  grippers in pi's units), exactly what the node undoes on the way out;
- actions: the flow-matching loss on the chunk of recorded actions that starts at each frame (`actions[t : t +
  horizon]`, the last action of its episode repeated past the end), in the profile's space, quantile-normalised
  with stats computed from all episodes' chunks (as openpi computes its norm stats after its transforms);
- text: the caption of each frame (`data.captions`: which arm moves, in which phase) after the prompt, tokenized
  with the same SentencePiece tokenizer the checkpoint ships with.
OUT_CKPT is a LeRobot-layout folder (`model.checkpoint.save_checkpoint`: weights, config marked with the profile,
the stats as `observation.state` / `action` q01/q99/mean/std/min/max) plus `tokenizer.model` and `training.json`
(the settings, the data's content hash, the loss curve, and the chunk error, in the robot's units through the
profile, and caption accuracy of the weights before and after training on a fixed set of frames) and `loss.png`.
The folder appears only when complete; the state saved every `--save-every` steps lets a stopped run resume, and a
folder that already holds the same training is reused. Each save also leaves the weights so far as a loadable
checkpoint folder beside that state (`snapshot_folder`: the same layout, its training.json marked `"partial": true`
with the step), so a long run can be evaluated before it ends; only the newest is kept.
`--init CKPT` starts from another checkpoint's weights and tokenizer instead of random ones (a warm start: same
model shapes and embodiment, anything else refused in one line); the norm stats are still this data's, and the
starting weights' hash is part of what makes a run the same (training.json's `init_sha256`, `init_checkpoint`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..command_line import CommandParser, UsageError
from ..command_line import progress as progress_bar
from ..control.embodiment import Embodiment, EmbodimentError, load_embodiment, shipped_names
from ..data.aloha import read_aloha
from ..data.atomic import atomic_output
from ..data.captions import frame_captions, object_captions
from ..data.episode import DataError, Episode
from ..data.lerobot import lerobot_episodes, read_lerobot
from ..model.checkpoint import CheckpointError, checkpoint_config, load_checkpoint, save_checkpoint
from ..model.config import Pi05Config, get_preset
from ..model.generate import greedy_decode
from ..model.inputs import ModelInputs
from ..model.kv_cache import KVCache
from ..model.normalization import as_normalization
from ..model.pi05 import Pi05Model, build_model
from ..model.preprocess import (
    ACTION_KEY,
    STATE_KEY,
    NormStats,
    Observation,
    prepare_inputs,
    robot_actions,
)
from ..model.prompt import NUM_STATE_BINS
from ..model.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from ..model.train import object_position_loss, order_number_embeddings, training_losses
from .sim_demo import MODEL_CAMERA_KEYS as SIM_CAMERA_KEYS

TOKENIZER_FILE = "tokenizer.model"
INFO_FILE = "training.json"
LOSS_PLOT = "loss.png"
SNAPSHOT_PREFIX = "checkpoint-step"
EVAL_FRAMES = 128
# ALOHA camera -> pi0.5 image key, as config/aloha.yaml maps the camera topics; the sim's cameras as sim-demo maps them.
ALOHA_CAMERA_KEYS = {"cam_high": "base_0_rgb", "cam_left_wrist": "left_wrist_0_rgb",
                     "cam_right_wrist": "right_wrist_0_rgb", **SIM_CAMERA_KEYS}


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "tiny"
    steps: int = 600
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    text_weight: float = 0.5
    seed: int = 0
    eval_every: int = 10  # evaluation frames: every n-th frame of the episodes (at most EVAL_FRAMES of them)
    embodiment: str = "aloha"  # the profile the model acts in (a shipped name or a YAML file)
    save_every: int = 100  # steps between saves of the training state (what a rerun resumes from)
    rtc_max_delay: int = 0  # training-time real-time chunking: the largest simulated delay (0: off; `model/train.py`)
    image_crops: tuple = ()  # (episode camera, (top, left, bottom, right)): the part the model sees (`Pi05Config`)
    object_captions: bool = False  # captions also say where the object is (`data.captions.object_captions`)
    freeze_vision: bool = False  # the vision tower keeps its starting weights (a warm start's, or pretrained)
    vision_pretrain: int = 0  # steps of `pretrain_vision` before the training (0: none)
    ordered_numbers: bool = False  # the state's bin numbers start with ordered embeddings (`order_number_embeddings`)


@dataclass
class TrainingSet:
    """Every frame of the episodes in model space, and what it is in the robot's."""

    inputs: ModelInputs  # [N, ...] all frames, CPU; images in float16 (half the memory of many episodes' frames)
    actions: torch.Tensor  # [N, horizon, action_dim] normalised chunks, zero-padded dims
    caption: torch.Tensor  # [N, C] caption token ids, PAD after the caption
    caption_mask: torch.Tensor  # [N, C] bool
    captions: list[str]
    embodiment: Embodiment
    robot_state: np.ndarray  # [N, S] each frame's state, robot units
    robot_chunks: np.ndarray  # [N, horizon, A] each frame's recorded absolute actions, robot units

    def batch(self, index: torch.Tensor) -> tuple[ModelInputs, torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs = ModelInputs(self.inputs.images[index].float(), self.inputs.image_masks[index],
                             self.inputs.tokens[index], self.inputs.token_masks[index])
        return inputs, self.actions[index], self.caption[index], self.caption_mask[index]


def episode_embodiment(episode: Episode, spec: str) -> Embodiment:
    """The profile `spec` names, checked against the episode's joints and frame rate; DataError otherwise."""
    try:
        embodiment = load_embodiment(spec)
        embodiment.check_joints(episode.joint_names, episode.joint_names[: episode.actions.shape[1]])
    except EmbodimentError as err:
        raise DataError(str(err)) from None
    if embodiment.rate_hz is not None and not math.isclose(episode.fps, embodiment.rate_hz, rel_tol=1e-3):
        raise DataError(f"the episode runs at {episode.fps:g} Hz, embodiment {embodiment.name} at "
                        f"{embodiment.rate_hz:g} Hz: its chunks would mean other times")
    return embodiment


def model_space(episode: Episode, embodiment: Embodiment, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """The episode as the model sees it in `embodiment`: each frame's state [T, S] and the chunk of recorded
    actions starting at it [T, horizon, A], unnormalized (`Embodiment.state_to_model` / `actions_to_model`)."""
    return (embodiment.state_to_model(episode.state),
            embodiment.actions_to_model(action_chunks(episode.actions.astype(np.float64), horizon), episode.state))


def norm_stats_from_episodes(episodes: Sequence[Episode], embodiment: Embodiment, horizon: int) -> NormStats:
    """LeRobot-style stats of the episodes' states and action chunks in the model's space (what `preprocess`
    normalises with); chunks never cross from one episode into the next."""
    spaces = [model_space(episode, embodiment, horizon) for episode in episodes]
    states = np.concatenate([state for state, _ in spaces])
    chunks = np.concatenate([chunk.reshape(-1, chunk.shape[-1]) for _, chunk in spaces])
    stats = {}
    for key, values in ((STATE_KEY, states), (ACTION_KEY, chunks)):
        stats[key] = {"q01": np.quantile(values, 0.01, axis=0), "q99": np.quantile(values, 0.99, axis=0),
                      "mean": values.mean(axis=0), "std": values.std(axis=0), "min": values.min(axis=0),
                      "max": values.max(axis=0)}
    return stats


def model_cameras(episode: Episode, config: Pi05Config) -> dict[str, str]:
    """Episode camera -> model image key, for the ALOHA cameras the model takes."""
    cameras = {cam: ALOHA_CAMERA_KEYS[cam] for cam in episode.cameras
               if ALOHA_CAMERA_KEYS.get(cam) in config.camera_names}
    if not cameras:
        raise DataError(f"none of the episode's cameras {list(episode.cameras)} maps to the model's image keys "
                        f"{list(config.camera_names)} ({ALOHA_CAMERA_KEYS})")
    return cameras


def model_config_for(config: TrainConfig, episode: Episode) -> Pi05Config:
    """The preset's shapes with the training's image crops, named by the model's image keys; DataError when a
    crop names a camera the episode lacks or the model does not take."""
    preset = get_preset(config.preset)
    cameras = model_cameras(episode, preset)
    crops = []
    for cam, box in config.image_crops:
        if cam not in cameras:
            raise DataError(f"--crop {cam}: the episode's cameras the {config.preset} preset takes are "
                            f"{sorted(cameras)}")
        crops.append((cameras[cam], tuple(box)))
    try:
        return preset.replace(image_crops=tuple(crops))
    except ValueError as err:
        raise DataError(f"--crop: {err}") from None


def parse_crop(text: str) -> tuple[str, tuple[float, float, float, float]]:
    """`CAMERA=TOP,LEFT,BOTTOM,RIGHT` -> (camera, box); argparse's type for --crop."""
    camera, _, numbers = text.partition("=")
    try:
        box = tuple(float(v) for v in numbers.split(","))
    except ValueError:
        box = ()
    if not camera or len(box) != 4:
        raise argparse.ArgumentTypeError(f"{text!r}: expected CAMERA=TOP,LEFT,BOTTOM,RIGHT (fractions)")
    return camera, box


def action_chunks(actions: np.ndarray, horizon: int) -> np.ndarray:
    """[T, A] -> [T, horizon, A]: chunk t is actions[t : t + horizon], the last action repeated past the end."""
    index = np.minimum(np.arange(len(actions))[:, None] + np.arange(horizon), len(actions) - 1)
    return actions[index]


def training_set(episodes: Sequence[Episode], config: Pi05Config, tokenizer: Tokenizer, stats: NormStats,
                 embodiment: Embodiment, locate: bool = False) -> TrainingSet:
    """All frames of `episodes` (one after the other) as model inputs, normalised action chunks and captions
    (with `locate`, each caption also says where the object is: `object_captions`)."""
    parts = [_episode_part(episode, config, tokenizer, stats, embodiment, locate) for episode in episodes]
    width = max(part[2].shape[1] for part in parts)
    caption = torch.full((sum(len(part[1]) for part in parts), width), config.pad_id, dtype=torch.long)
    mask = torch.zeros(caption.shape, dtype=torch.bool)
    row = 0
    for _, chunks, ids, valid, _ in parts:
        caption[row: row + len(chunks), : ids.shape[1]] = ids
        mask[row: row + len(chunks), : ids.shape[1]] = valid
        row += len(chunks)
    inputs = ModelInputs(*(torch.cat([getattr(part[0], field) for part in parts]) for field in
                           ("images", "image_masks", "tokens", "token_masks")))
    return TrainingSet(inputs, torch.cat([part[1] for part in parts]), caption, mask,
                       [text for part in parts for text in part[4]], embodiment,
                       np.concatenate([e.state.astype(np.float64) for e in episodes]),
                       np.concatenate([action_chunks(e.actions.astype(np.float64), config.action_horizon)
                                       for e in episodes]))


def _episode_part(episode: Episode, config: Pi05Config, tokenizer: Tokenizer, stats: NormStats,
                  embodiment: Embodiment, locate: bool = False) -> tuple:
    cameras = model_cameras(episode, config)
    states, model_chunks = model_space(episode, embodiment, config.action_horizon)
    observations = [Observation(images={key: episode.images[cam][t] for cam, key in cameras.items()},
                                state=states[t], task=episode.task) for t in range(episode.length)]
    inputs = prepare_inputs(observations, config, tokenizer, stats)
    inputs = ModelInputs(inputs.images.half(), inputs.image_masks, inputs.tokens, inputs.token_masks)
    dim = episode.actions.shape[1]
    if dim > config.action_dim:
        raise DataError(f"the episode has {dim} action dims, the model only {config.action_dim}")
    chunks = np.zeros((episode.length, config.action_horizon, config.action_dim), dtype=np.float32)
    chunks[..., :dim] = as_normalization(stats).normalize(ACTION_KEY, model_chunks)
    captions = frame_captions(episode.actions)
    if locate:
        if episode.environment_state is None:
            raise DataError("--object-captions needs episodes with the objects' poses "
                            "(observation.environment_state, as sim-record writes them)")
        captions = object_captions(captions, episode.environment_state)
    encoded = [tokenizer.encode(text) for text in captions]
    width = max(map(len, encoded))
    caption = torch.full((episode.length, width), config.pad_id, dtype=torch.long)
    for t, ids in enumerate(encoded):
        caption[t, : len(ids)] = torch.tensor(ids)
    mask = torch.arange(width)[None, :] < torch.tensor([len(ids) for ids in encoded])[:, None]
    return inputs, torch.from_numpy(chunks), caption, mask, captions


@torch.inference_mode()
def evaluate(model: Pi05Model, data: TrainingSet, tokenizer: Tokenizer, stats: NormStats, frames: list[int],
             robot_dim: int, seed: int = 0) -> dict:
    """Chunks and greedy captions on `frames`: mean absolute chunk error per joint against the recorded actions,
    in the robot's units (the prediction made absolute by the profile, as the node does), and the share of captions
    decoded exactly."""
    index = torch.tensor(frames)
    inputs = data.batch(index)[0]
    length = data.caption.shape[1] + 1  # the longest caption and its end
    predicted, cache, slots, prefill = predict_chunks(model, inputs, stats, data.embodiment, data.robot_state[frames],
                                                      robot_dim, seed, text_tokens=length)
    recorded = data.robot_chunks[frames]
    texts = [tokenizer.decode(ids) for ids in greedy_decode(model, cache, slots, prefill, length)]
    per_joint = np.abs(predicted - recorded).mean(axis=(0, 1))
    correct = sum(text == data.captions[t] for text, t in zip(texts, frames))
    return {"action_error": float(per_joint.mean()), "action_error_per_joint": per_joint.tolist(),
            "caption_accuracy": correct / len(frames), "sample_captions": texts[:: max(1, len(texts) // 8)]}


@torch.inference_mode()
def predict_chunks(model: Pi05Model, inputs: ModelInputs, stats: NormStats, embodiment: Embodiment,
                   robot_state: np.ndarray, robot_dim: int, seed: int = 0, text_tokens: int = 0) -> tuple:
    """Action chunks for a batch of prepared inputs, in the robot's absolute units [B, horizon, robot_dim] (the
    profile undoing its action space against each frame's `robot_state`, as the node does), with the cache, slots
    and prefill result (room for `text_tokens` more, to decode text from)."""
    cfg = model.config
    count = inputs.images.shape[0]
    cache = KVCache(cfg, count, cfg.prefix_len + text_tokens, model.dtype)
    slots = torch.arange(count)
    prefill = model.prefill(inputs, cache, slots, want_logits=text_tokens > 0)
    noise = torch.randn(count, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))
    actions = robot_actions(model.sample_actions(cache, slots, noise), robot_dim, stats)
    return embodiment.actions_to_robot(actions, robot_state).positions, cache, slots, prefill


def episode_content_hash(episode: Episode) -> str:
    """SHA-256 of what training reads from the episode (pixels, state, actions, rate, task, joint names, and the
    objects' poses when it has them)."""
    digest = hashlib.sha256()
    digest.update(json.dumps([float(episode.fps), episode.task, list(episode.joint_names), sorted(episode.cameras)]).encode())
    for array in (episode.state, episode.actions, *(episode.images[c] for c in sorted(episode.cameras))):
        digest.update(np.ascontiguousarray(array).tobytes())
    if episode.environment_state is not None:
        digest.update(np.ascontiguousarray(episode.environment_state, dtype=np.float32).tobytes())
    return digest.hexdigest()


def _learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


@dataclass
class Progress:
    """Where a training run is: the steps done, their losses, and the state to go on from (`fit` updates it)."""

    step: int = 0
    history: list[dict] = dataclasses.field(default_factory=list)
    optimizer: dict | None = None
    generator: torch.Tensor | None = None


def fit(model: Pi05Model, data: TrainingSet, config: TrainConfig, log=print, progress: Progress | None = None,
        save=None) -> list[dict]:
    """Train `model` in place from `progress` (default: the start); returns the loss of every step ({"step",
    "action", "text"}). Every `config.save_every` steps `save(progress)` is called with the state so far."""
    progress = progress or Progress()
    generator = torch.Generator().manual_seed(config.seed)
    if progress.generator is not None:
        generator.set_state(progress.generator)
    for parameter in model.vision.parameters():
        parameter.requires_grad_(not config.freeze_vision)
    trained = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=config.learning_rate, weight_decay=1e-4)
    if progress.optimizer is not None:
        optimizer.load_state_dict(progress.optimizer)
    model.train()
    started = time.monotonic()
    count = data.actions.shape[0]
    for step in progress_bar(range(progress.step, config.steps), total=config.steps - progress.step, desc="train"):
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config, step)
        index = torch.randint(count, (min(config.batch_size, count),), generator=generator)
        losses = training_losses(model, *data.batch(index), generator=generator, rtc_max_delay=config.rtc_max_delay)
        total = losses.action + config.text_weight * losses.text
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        progress.history.append({"step": step, "action": losses.action.item(), "text": losses.text.item()})
        progress.step = step + 1
        if step % 100 == 0 or step == config.steps - 1:
            log(f"step {step:4d}  action loss {losses.action.item():.4f}  text loss {losses.text.item():.3f}  "
                f"({time.monotonic() - started:.0f} s)")
        if save is not None and progress.step % config.save_every == 0 and progress.step < config.steps:
            progress.optimizer, progress.generator = optimizer.state_dict(), generator.get_state()
            save(progress)
    model.eval()
    return progress.history


def pretrain_vision(model: Pi05Model, data: TrainingSet, episodes: Sequence[Episode], config: TrainConfig,
                    log=print) -> dict:
    """`config.vision_pretrain` steps training the vision tower alone to tell where the object is: its position
    (the first three numbers of each frame's environment state, standardised) read linearly from the mean of the
    tower's tokens, every camera's image of the frame (`model.train.object_position_loss`). A stand-in for the
    pretrained SigLIP tower a real pi0.5 starts from, which already sees objects: trained from scratch on a few
    demonstrations together with the rest, a tower learns to feed the action expert's shortcut, the joint state,
    and not where the object is (`docs/sim.md`). Returns the loss before and after, on frames held out of it."""
    if any(episode.environment_state is None for episode in episodes):
        raise DataError("--vision-pretrain needs episodes with the objects' poses (observation.environment_state, "
                        "as sim-record writes them)")
    positions = torch.from_numpy(np.concatenate([e.environment_state[:, :3] for e in episodes]).astype(np.float32))
    positions = (positions - positions.mean(dim=0)) / positions.std(dim=0).clamp_min(1e-6)
    present = data.inputs.image_masks  # [N, cameras]
    rows, cameras = torch.nonzero(present, as_tuple=True)
    generator = torch.Generator().manual_seed(config.seed)
    order = torch.randperm(len(rows), generator=generator)
    held, used = order[: max(1, len(order) // 10)], order[max(1, len(order) // 10):]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        head = torch.nn.Linear(model.config.backbone.width, 3)
    parameters = [*model.vision.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=config.learning_rate, weight_decay=1e-4)

    def loss_on(index: torch.Tensor) -> torch.Tensor:
        images = data.inputs.images[rows[index], cameras[index]].float()
        return object_position_loss(model, head, images, positions[rows[index]])

    def held_out() -> float:
        with torch.no_grad():
            return float(sum(loss_on(part) * len(part) for part in held.split(256)) / len(held))

    model.vision.train()
    before = held_out()
    for step in progress_bar(range(config.vision_pretrain), desc="vision"):
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate * min(1.0, (step + 1) / config.warmup_steps)
        index = used[torch.randint(len(used), (2 * config.batch_size,), generator=generator)]
        loss = loss_on(index)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        if step % 100 == 0:
            log(f"vision step {step:4d}  object position loss {loss.item():.4f}")
    model.vision.eval()
    result = {"steps": config.vision_pretrain, "held_out_loss_before": before, "held_out_loss_after": held_out()}
    log(f"vision tower: object position loss on held-out frames {before:.3f} -> "
        f"{result['held_out_loss_after']:.3f} (standardised; 1 = knows nothing)")
    return result


def dataset_content_hash(episodes: Sequence[Episode]) -> str:
    """SHA-256 over the episodes' content hashes in order (one episode: its own hash)."""
    if len(episodes) == 1:
        return episode_content_hash(episodes[0])
    return hashlib.sha256(" ".join(episode_content_hash(e) for e in episodes).encode()).hexdigest()


def check_episodes(episodes: Sequence[Episode]) -> None:
    """Every episode has the first one's cameras, image sizes, rate and state / action widths; DataError naming the
    first that differs otherwise."""
    if not episodes:
        raise DataError("no episodes to train on")
    first = episodes[0]
    for i, episode in enumerate(episodes):
        shapes = {cam: episode.images[cam].shape[1:] for cam in episode.cameras}
        expected = {cam: first.images[cam].shape[1:] for cam in first.cameras}
        if shapes != expected:
            raise DataError(f"episode {i} has cameras {shapes}, episode 0 {expected}")
        if (episode.state.shape[1], episode.actions.shape[1], episode.fps) != (
                first.state.shape[1], first.actions.shape[1], first.fps):
            raise DataError(f"episode {i} has state / action widths and rate {episode.state.shape[1]}, "
                            f"{episode.actions.shape[1]}, {episode.fps:g} Hz; episode 0 {first.state.shape[1]}, "
                            f"{first.actions.shape[1]}, {first.fps:g} Hz")


def resume_folder(out: Path) -> Path:
    """Where a run writing `out` keeps what it resumes from: beside `out`, hidden, removed when `out` is written."""
    return out.parent / f".{out.name}.resume"


def snapshot_folder(out: Path, step: int) -> Path:
    """The checkpoint of a run writing `out` as it was after `step` steps (inside its resume folder)."""
    return resume_folder(out) / f"{SNAPSHOT_PREFIX}{step}"


def train(episodes: Episode | Sequence[Episode], out: str | Path, config: TrainConfig = TrainConfig(),
          tokenizer_path: str | None = None, log=print, threads: int = 1, about: dict | None = None,
          init: str | Path | None = None) -> dict:
    """Train on `episodes` and write the checkpoint folder `out`; returns training.json's data.

    When `out` already holds a run on the same data (content hash) with the same settings, that run's data is
    returned and nothing is trained; another `out` that exists is refused. A run stopped part-way resumes from
    its last saved state (every `config.save_every` steps) when started again with the same data and settings.
    One thread by default: the tiny model's matrices are too small for a second thread to pay for its
    synchronisation, and on a busy machine it costs several times over. `about` (what the data is, e.g. the seeds
    a simulated dataset used) goes into training.json as it is. `init`: a checkpoint folder to start from
    (`initial_weights`; its tokenizer too, so `tokenizer_path` is then not used).
    """
    episodes = [episodes] if isinstance(episodes, Episode) else list(episodes)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(episodes, Path(out), config, tokenizer_path, log, about or {}, init)
    finally:
        torch.set_num_threads(previous)


def _run_key(episodes: Sequence[Episode], config: TrainConfig, init: dict | None = None) -> dict:
    key = {"train_config": dataclasses.asdict(config), "episode_sha256": dataset_content_hash(episodes)}
    key = key if init is None else {**key, "init_sha256": init["sha256"]}
    return json.loads(json.dumps(key))  # as training.json holds it (the crops' tuples as lists)


def initial_weights(path: str | Path, preset: str, embodiment: str) -> dict:
    """A warm start's weights from the checkpoint folder `path`: {"weights": state dict, "sha256": of those
    weights, "checkpoint": the path}; DataError, one line, when its model shapes are not the `preset`'s or it was
    trained in another embodiment than `embodiment`."""
    try:
        if checkpoint_config(path).replace(image_crops=()) != get_preset(preset):  # its crops may differ
            raise DataError(f"--init {path}: its model shapes are not the {preset} preset's (a warm start needs "
                            f"the same ones)")
        loaded = load_checkpoint(path)
    except (CheckpointError, OSError) as err:
        raise DataError(f"--init {path}: {err}") from None
    if loaded.trained_on.embodiment not in (None, embodiment):
        raise DataError(f"--init {path}: trained in embodiment {loaded.trained_on.embodiment}, this run trains in "
                        f"{embodiment}")
    weights = loaded.model.state_dict()
    digest = hashlib.sha256()
    for name, tensor in weights.items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return {"weights": weights, "sha256": digest.hexdigest(), "checkpoint": str(path)}


def _cached(out: Path, key: dict) -> dict | None:
    try:
        info = json.loads((out / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None
    same = isinstance(info, dict) and all(info.get(k) == v for k, v in key.items())
    return info if same else None


def _load_resume(folder: Path, key: dict, log) -> tuple[Progress, dict] | None:
    try:
        saved = torch.load(folder / "state.pt", weights_only=False)
    except (OSError, RuntimeError, EOFError):
        return None
    if saved.get("key") != key:
        log(f"{folder}: saved state of other data or settings; starting afresh")
        return None
    return saved["progress"], saved["model"]


def _train(episodes: list[Episode], out: Path, config: TrainConfig, tokenizer_path: str | None, log,
           about: dict, init: str | Path | None) -> dict:
    check_episodes(episodes)
    embodiment = episode_embodiment(episodes[0], config.embodiment)
    start = None if init is None else initial_weights(init, config.preset, embodiment.name)
    if start is not None:
        tokenizer_path = str(Path(init) / TOKENIZER_FILE)
        if not Path(tokenizer_path).is_file():
            raise DataError(f"--init {init}: no {TOKENIZER_FILE} (the tokenizer its weights were trained with)")
    key = _run_key(episodes, config, start)
    cached = _cached(out, key)
    if cached is not None:
        log(f"{out} already holds this training (data {key['episode_sha256'][:12]}, same settings): reused")
        return cached
    model_config = model_config_for(config, episodes[0])
    torch.manual_seed(config.seed)
    resume = resume_folder(out)
    with atomic_output(out) as folder:
        folder.mkdir()
        saved = _load_resume(resume, key, log)
        if saved is not None:
            shutil.copyfile(resume / TOKENIZER_FILE, folder / TOKENIZER_FILE)
        elif tokenizer_path:
            shutil.copyfile(tokenizer_path, folder / TOKENIZER_FILE)
        else:
            train_tokenizer(folder / TOKENIZER_FILE, model_config.vocab_size)
        tokenizer = load_tokenizer(folder / TOKENIZER_FILE)
        if tokenizer.vocab_size > model_config.vocab_size:
            raise DataError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model only "
                            f"{model_config.vocab_size}")
        stats = norm_stats_from_episodes(episodes, embodiment, model_config.action_horizon)
        data = training_set(episodes, model_config, tokenizer, stats, embodiment, config.object_captions)
        shapes = {"episodes": len(episodes), "frames": data.actions.shape[0],
                  "cameras": {cam: list(episodes[0].images[cam].shape[1:3]) for cam in episodes[0].cameras}}
        # the model's view of every frame is in `data` now: the list lets go of the full-size pixels (most of a
        # large dataset's memory) wherever the caller does not hold them
        episodes[:] = [dataclasses.replace(episode, images={}) for episode in episodes]
        model = build_model(model_config, seed=config.seed)
        if start is not None:
            model.load_state_dict(start["weights"])
            log(f"starting from {init}'s weights (sha256 {start['sha256'][:12]}), this data's norm stats")
        elif config.ordered_numbers:
            log(f"ordered embeddings for {order_number_embeddings(model, tokenizer)} of the "
                f"{NUM_STATE_BINS} state bin numbers (the others take several tokens)")
        total = data.actions.shape[0]
        frames = list(range(0, total, config.eval_every))
        frames = [frames[i] for i in np.linspace(0, len(frames) - 1, min(len(frames), EVAL_FRAMES)).astype(int)]
        robot_dim = episodes[0].actions.shape[1]
        vision = pretrain_vision(model, data, episodes, config, log) if config.vision_pretrain else None
        before = evaluate(model, data, tokenizer, stats, frames, robot_dim, config.seed)
        progress = Progress()
        if saved is not None:
            progress, weights = saved
            model.load_state_dict(weights)
            log(f"resuming from step {progress.step} ({resume})")

        def save(state: Progress) -> None:
            resume.mkdir(exist_ok=True)
            shutil.copyfile(folder / TOKENIZER_FILE, resume / TOKENIZER_FILE)
            torch.save({"key": key, "progress": state, "model": model.state_dict()}, resume / "state.tmp")
            (resume / "state.tmp").replace(resume / "state.pt")
            snapshot = snapshot_folder(out, state.step)
            shutil.rmtree(snapshot, ignore_errors=True)  # a stopped run's of the same step (another training's)
            with atomic_output(snapshot) as partial:
                save_checkpoint(model, partial, stats, embodiment=embodiment.name)
                shutil.copyfile(folder / TOKENIZER_FILE, partial / TOKENIZER_FILE)
                (partial / INFO_FILE).write_text(json.dumps({**key, **shapes, "partial": True, "step": state.step,
                                                             **about}, indent=1) + "\n")
            for older in resume.glob(f"{SNAPSHOT_PREFIX}*"):
                if older != snapshot:
                    shutil.rmtree(older, ignore_errors=True)

        started, resumed_from = time.monotonic(), progress.step
        history = fit(model, data, config, log, progress, save)
        seconds = time.monotonic() - started
        after = evaluate(model, data, tokenizer, stats, frames, robot_dim, config.seed)
        save_checkpoint(model, folder, stats, embodiment=embodiment.name)
        info = {**key, **shapes, "train_seconds": seconds, "resumed_from_step": resumed_from,
                "joint_names": list(episodes[0].joint_names), "evaluation_frames": frames, "before": before,
                "after": after, "loss": [{k: round(v, 5) for k, v in h.items()} for h in history], **about,
                **({} if init is None else {"init_checkpoint": str(init)}),
                **({} if vision is None else {"vision_pretrain": vision})}
        (folder / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
        plot_loss(history, folder / LOSS_PLOT)
    shutil.rmtree(resume, ignore_errors=True)
    return info


def plot_loss(history: list[dict], path: Path) -> None:
    """The action and text losses against the step, on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    steps = [h["step"] for h in history]
    for name in ("action", "text"):
        axis.plot(steps, [h[name] for h in history], label=f"{name} loss", linewidth=0.8)
    axis.set_yscale("log")
    axis.set_xlabel("step")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def read_episodes(src: str, task: str = "", count: int | None = None) -> list[Episode]:
    """An ALOHA .hdf5 episode, or the first `count` (default all) episodes of a LeRobot v3 dataset folder; `task`,
    when given, replaces their instruction."""
    if not Path(src).is_dir():
        return [read_aloha(src, task=task)]
    available = len(lerobot_episodes(src))
    episodes = [read_lerobot(src, i) for i in progress_bar(range(min(count or available, available)),
                                                            desc="reading episodes")]
    for episode in episodes:
        episode.task = task or episode.task
    return episodes


def sim_seeds(src: str) -> dict:
    """{"sim_seeds": every seed a `sim-record` dataset tried} (what an evaluation must not reuse), or {}."""
    path = Path(src) / "meta" / "sim.json"
    if not path.is_file():
        return {}
    try:
        return {"sim_seeds": [int(a["seed"]) for a in json.loads(path.read_text())["attempts"]]}
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(f"{path}: no list of attempts with seeds ({err!r})") from err


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("train-tiny", __doc__)
    parser.add_argument("src", help="ALOHA episode (.hdf5) or LeRobot v3 dataset folder (all its episodes)")
    parser.add_argument("out", help="checkpoint folder to write (or that holds this very training already)")
    parser.add_argument("--episodes", type=int, help="train on the dataset's first N episodes only")
    parser.add_argument("--task", default="", help="the instruction the episodes show (default: their own)")
    parser.add_argument("--tokenizer", help="SentencePiece file (default: the stand-in tokenizer, trained here)")
    parser.add_argument("--init", metavar="CKPT",
                        help="start from this checkpoint's weights and tokenizer (same preset and embodiment; the "
                             "norm stats are this data's)")
    defaults = TrainConfig()
    parser.add_argument("--preset", default=defaults.preset, choices=("tiny", "sim", "small"), help="model shapes")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="frames per step")
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="weights, batches and flow-matching noise")
    parser.add_argument("--save-every", type=int, default=defaults.save_every,
                        help="steps between saves of the state a rerun resumes from")
    parser.add_argument("--embodiment", default=defaults.embodiment,
                        help=f"the action space to train in: {' | '.join(shipped_names())} or a profile YAML file")
    parser.add_argument("--rtc-max-delay", type=int, default=defaults.rtc_max_delay,
                        help="training-time real-time chunking: per frame a delay d in 0..N, its chunk's first d "
                             "actions given as known and not learned, so the checkpoint follows a committed prefix "
                             "without guidance (0: off; below the model's horizon)")
    parser.add_argument("--crop", type=parse_crop, action="append", default=[], metavar="CAMERA=T,L,B,R",
                        help="the model sees only this part of the camera's image (top, left, bottom, right as "
                             "fractions of the image padded to a square: the same part whatever size a robot "
                             "sends; stored in the checkpoint, applied wherever it runs); repeatable")
    parser.add_argument("--object-captions", action="store_true",
                        help="each frame's caption also says where the object is (the dataset's "
                             "observation.environment_state, as sim-record writes it, in whole cm): the backbone "
                             "learns to locate it in the images, and the narration says where it sees it")
    parser.add_argument("--vision-pretrain", type=int, default=defaults.vision_pretrain, metavar="STEPS",
                        help="first train the vision tower alone for STEPS steps to tell where the object is (the "
                             "dataset's observation.environment_state, as sim-record writes it): a stand-in for the "
                             "pretrained tower a real pi0.5 has (0: none)")
    parser.add_argument("--freeze-vision", action="store_true",
                        help="keep the vision tower as training starts (pretrained, or --init's): end-to-end training "
                             "on a few demonstrations would otherwise wear away what it sees")
    parser.add_argument("--ordered-numbers", action="store_true",
                        help="the state's bin numbers in the prompt start with embeddings that know their order (a "
                             "stand-in for a pretrained language model's numeracy; not with --init, whose "
                             "embeddings are kept)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (one is fastest on a busy 2-core machine)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.steps, args.batch_size, args.save_every, args.episodes or 1) <= 0:
        raise UsageError("--steps, --batch-size, --save-every and --episodes must be positive")
    if args.vision_pretrain < 0:
        raise UsageError("--vision-pretrain must be 0 or more")
    if not 0 <= args.rtc_max_delay < get_preset(args.preset).action_horizon:
        raise UsageError(f"--rtc-max-delay must be in 0..{get_preset(args.preset).action_horizon - 1} (below the "
                         f"{args.preset} preset's horizon)")
    config = TrainConfig(preset=args.preset, steps=args.steps, batch_size=args.batch_size,
                         learning_rate=args.learning_rate, seed=args.seed, embodiment=args.embodiment,
                         save_every=args.save_every, rtc_max_delay=args.rtc_max_delay,
                         image_crops=tuple(args.crop), object_captions=args.object_captions,
                         freeze_vision=args.freeze_vision, vision_pretrain=args.vision_pretrain,
                         ordered_numbers=args.ordered_numbers)
    if args.init and args.tokenizer:
        raise UsageError("--init brings its checkpoint's tokenizer; --tokenizer cannot go with it")
    if args.init and args.ordered_numbers:
        raise UsageError("--init keeps its checkpoint's embeddings; --ordered-numbers cannot go with it")
    try:
        info = train(read_episodes(args.src, args.task, args.episodes), args.out, config, args.tokenizer,
                     threads=args.threads, about=sim_seeds(args.src), init=args.init)
    except (DataError, OSError, ValueError) as err:
        print(f"train-tiny failed: {err}", file=sys.stderr)
        return 1
    before, after = info["before"], info["after"]
    print(f"wrote {args.out}: {config.steps} steps on {info.get('episodes', 1)} episodes ({info['frames']} frames) "
          f"in {info['train_seconds']:.0f} s; chunk error {before['action_error']:.3f} -> {after['action_error']:.3f} "
          f"(mean abs, robot units, embodiment {config.embodiment}), caption accuracy "
          f"{before['caption_accuracy']:.0%} -> {after['caption_accuracy']:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
