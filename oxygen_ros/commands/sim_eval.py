"""`oxygen-ros sim-eval CHECKPOINT`: a trained policy on gym-aloha's transfer_cube, in process (no ROS), M seeded
episodes whose seeds are not the training seeds.

Each episode resets the sim with its seed (the cube pose, gym-aloha's sampler), then repeatedly computes a chunk
from the current camera frame(s) and joint state and executes its first `--execute` actions open loop (as openpi's
ALOHA example executes chunks), for gym-aloha's 300 steps. Success is gym-aloha's own: the task's top reward stage
reached at some step. The evaluation seeds are the first M integers from `--seed` that the training data did not
use: a checkpoint trained on a `sim-record` dataset lists every seed that dataset tried (its `training.json`,
`sim_seeds`), and a seed among them is skipped. It prints the success rate with a 95 % (Wilson) interval, the
histogram of each episode's best reward stage, the mean episode length to success, the steps per second of wall
time (in process the sim waits for each chunk) and each chunk's time (p50 / p99), and writes `sim_eval.json`
(every episode's seed, best stage and length) under `--out`. A checkpoint trained in another embodiment than
gym-aloha's (ALOHA) is refused in one line; an episode whose physics diverges is one line, counts as a failure,
and the evaluation goes on.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..command_line import CommandParser, UsageError, progress
from ..control.embodiment import load_embodiment
from ..data.episode import DataError
from ..model.checkpoint import load_checkpoint
from ..model.preprocess import Observation, prepare_inputs
from ..model.tokenizer import load_tokenizer
from ..sim.aloha_env import MAX_EPISODE_STEPS, REWARD_STAGES, AlohaSimEnv, SimulationDiverged
from .train_tiny import ALOHA_CAMERA_KEYS, INFO_FILE, TOKENIZER_FILE, predict_chunks

EMBODIMENT = "aloha"  # gym-aloha's ViperX pair: ALOHA's joints and units


def evaluation_seeds(first: int, count: int, training_seeds: set[int]) -> list[int]:
    """The first `count` integers from `first` that are not training seeds."""
    seeds, seed = [], first
    while len(seeds) < count:
        if seed not in training_seeds:
            seeds.append(seed)
        seed += 1
    return seeds


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95 % by default)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


class CheckpointPolicy:
    """A checkpoint folder as a policy on the sim's observations: camera frames and qpos -> an absolute chunk."""

    def __init__(self, folder: str | Path, seed: int = 0):
        folder = Path(folder)
        loaded = load_checkpoint(folder)
        if loaded.trained_on.embodiment not in (None, EMBODIMENT):
            raise DataError(f"{folder}: trained in embodiment {loaded.trained_on.embodiment!r}, the sim is "
                            f"{EMBODIMENT!r}")
        self.model, self.stats, self.seed = loaded.model, loaded.norm_stats, seed
        self.tokenizer = load_tokenizer(folder / TOKENIZER_FILE)
        self.embodiment = load_embodiment(EMBODIMENT)
        info = json.loads((folder / INFO_FILE).read_text()) if (folder / INFO_FILE).is_file() else {}
        self.cameras = {cam: tuple(size) for cam, size in (info.get("cameras") or {"top": (240, 320)}).items()}
        unknown = [cam for cam in self.cameras if ALOHA_CAMERA_KEYS.get(cam) not in self.model.config.camera_names]
        if unknown:
            raise DataError(f"{folder}: cameras {unknown} do not map to the model's image keys")
        self.training_seeds = {int(s) for s in info.get("sim_seeds", [])}
        self.calls = 0
        self.seconds: list[float] = []  # each chunk's wall time (preprocessing and model)

    def chunk(self, images: dict[str, np.ndarray], qpos: np.ndarray, task: str) -> np.ndarray:
        """[horizon, 14] absolute joint targets for this frame."""
        started = time.perf_counter()
        state = self.embodiment.state_to_model(qpos[None])[0]
        observation = Observation(images={ALOHA_CAMERA_KEYS[cam]: images[cam] for cam in self.cameras},
                                  state=state, task=task)
        inputs = prepare_inputs([observation], self.model.config, self.tokenizer, self.stats)
        self.calls += 1
        positions = predict_chunks(self.model, inputs, self.stats, self.embodiment, qpos[None], len(qpos),
                                   self.seed + self.calls)[0]
        self.seconds.append(time.perf_counter() - started)
        return positions[0]


def run_episode(env: AlohaSimEnv, policy: CheckpointPolicy, seed: int, execute: int) -> dict:
    """One seeded episode; its best reward stage, whether it succeeded, and at which step."""
    observation = env.reset(seed)
    succeeded_at, diverged = None, False
    try:
        while env.steps < env.max_steps:
            for action in policy.chunk(observation.images, observation.qpos, env.instruction)[:execute]:
                result = env.step(action)
                observation = result.observation
                if result.success and succeeded_at is None:
                    succeeded_at = env.steps
                if result.truncated:
                    break
    except SimulationDiverged as err:
        print(f"sim-eval: seed {seed}: {err}; counted as a failure", file=sys.stderr)
        diverged = True
    return {"seed": seed, "max_reward": env.episode_max_reward, "success": succeeded_at is not None,
            "success_step": succeeded_at, "steps": env.steps, "diverged": diverged}


def evaluate_policy(policy: CheckpointPolicy, seeds: list[int], execute: int, max_steps: int) -> dict:
    sizes = set(policy.cameras.values())
    if len(sizes) != 1:
        raise DataError(f"the checkpoint's cameras have different image sizes {policy.cameras}")
    height, width = sizes.pop()
    env = AlohaSimEnv("transfer_cube", cameras=list(policy.cameras), height=height, width=width, max_steps=max_steps)
    started = time.monotonic()
    try:
        episodes = [run_episode(env, policy, seed, execute) for seed in progress(seeds, desc="sim-eval")]
    finally:
        env.close()
    successes = sum(e["success"] for e in episodes)
    stages = REWARD_STAGES["transfer_cube"]
    histogram = {stages[level]: sum(1 for e in episodes if int(e["max_reward"]) >= level)
                 for level in range(1, len(stages))}
    lengths = [e["success_step"] for e in episodes if e["success"]]
    wall = time.monotonic() - started
    chunk_ms = 1000 * np.asarray(policy.seconds or [0.0])
    return {"steps_per_second": sum(e["steps"] for e in episodes) / wall,
            "chunk_ms": {"p50": float(np.median(chunk_ms)), "p99": float(np.quantile(chunk_ms, 0.99))},"episodes": episodes, "successes": successes, "trials": len(episodes),
            "success_rate": successes / len(episodes), "interval_95": wilson_interval(successes, len(episodes)),
            "reached_stage": histogram, "mean_steps_to_success": float(np.mean(lengths)) if lengths else None,
            "diverged": sum(e["diverged"] for e in episodes), "seeds": seeds, "execute": execute,
            "wall_seconds": wall}


def build_parser() -> CommandParser:
    parser = CommandParser("sim-eval", __doc__)
    parser.add_argument("checkpoint", help="checkpoint folder (train-tiny's, with training.json)")
    parser.add_argument("--episodes", type=int, default=50, help="evaluation episodes")
    parser.add_argument("--seed", type=int, default=100_000, help="the first evaluation seed")
    parser.add_argument("--execute", type=int, default=0, help="actions executed per chunk (0: the whole chunk)")
    parser.add_argument("--steps", type=int, default=MAX_EPISODE_STEPS, help="steps per episode (50 Hz)")
    parser.add_argument("--out", default="out/sim_eval", help="folder for sim_eval.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.episodes <= 0 or args.steps <= 0 or args.execute < 0:
        raise UsageError("--episodes and --steps must be positive, --execute not negative")
    torch.set_num_threads(1)
    try:
        policy = CheckpointPolicy(args.checkpoint)
        horizon = policy.model.config.action_horizon
        execute = min(args.execute or horizon, horizon)
        seeds = evaluation_seeds(args.seed, args.episodes, policy.training_seeds)
        result = evaluate_policy(policy, seeds, execute, args.steps)
    except (DataError, OSError, ValueError) as err:
        print(f"sim-eval failed: {err}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_eval.json").write_text(json.dumps(result, indent=1) + "\n")
    low, high = result["interval_95"]
    print(f"sim-eval: {result['successes']}/{result['trials']} transferred ({result['success_rate']:.0%}, 95 % "
          f"interval {low:.0%}-{high:.0%}), seeds {seeds[0]}..{seeds[-1]} ({len(policy.training_seeds)} training "
          f"seeds avoided), {execute} of {horizon} actions per chunk, {result['diverged']} diverged, "
          f"{result['wall_seconds']:.0f} s")
    for stage, count in result["reached_stage"].items():
        print(f"  reached {stage:<32} {count}/{result['trials']}")
    mean = result["mean_steps_to_success"]
    print(f"  mean steps to success            {mean:.0f}" if mean is not None else "  mean steps to success            -")
    print(f"  steps per second (wall)          {result['steps_per_second']:.1f} (the sim waits for each chunk)")
    print(f"  chunk time p50 / p99             {result['chunk_ms']['p50']:.1f} / {result['chunk_ms']['p99']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
