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

With `--delay D` (control steps) and `--handover` the chunks arrive D steps after their frame while the robot goes on
executing (`sim/delayed_loop.py`): a new frame once the previous chunk arrived and `--execute` steps passed (0: as
soon as it arrived), the hand-over `newest_wins`, `temporal_ensemble`, `rtc` (the post-hoc blend) or `rtc_guided`
(each chunk sampled with real-time chunking's guidance toward the chunk being executed, `model/rtc.py`); the result
adds the switch discontinuity and the jerk of the commands.
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
from ..model.kv_cache import KVCache
from ..model.preprocess import Observation, prepare_inputs, robot_actions
from ..model.rtc import Committed, GuidedSampler
from ..model.tokenizer import load_tokenizer
from ..robots.rtc_guide import RtcGuide, RtcSettings
from ..sim.aloha_env import DT, MAX_EPISODE_STEPS, REWARD_STAGES, AlohaSimEnv, SimulationDiverged
from ..sim.delayed_loop import HANDOVERS, run_delayed
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

    def __init__(self, folder: str | Path, seed: int = 0, rtc: RtcSettings | None = None):
        """`rtc`: sample chunks asked with a previous one (`chunk(..., previous=)`) with real-time chunking."""
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
        self.guide = self.sampler = None
        if rtc is not None:
            cfg = self.model.config
            config = rtc.config(cfg.action_horizon)
            self.guide = RtcGuide(config, 1, cfg.action_horizon, cfg.action_horizon, cfg.action_dim, self.embodiment,
                                  self.stats)
            self.sampler = GuidedSampler(config)

    def chunk(self, images: dict[str, np.ndarray], qpos: np.ndarray, task: str,
              previous: tuple[int, int] | None = None) -> np.ndarray:
        """[horizon, 14] absolute joint targets for this frame; `previous`: (the steps of the chunk being executed
        already past at this frame, the delay), to guide this chunk toward the rest of it (with `rtc`)."""
        started = time.perf_counter()
        state = self.embodiment.state_to_model(qpos[None])[0]
        observation = Observation(images={ALOHA_CAMERA_KEYS[cam]: images[cam] for cam in self.cameras},
                                  state=state, task=task)
        inputs = prepare_inputs([observation], self.model.config, self.tokenizer, self.stats)
        self.calls += 1
        if self.guide is None:
            positions = predict_chunks(self.model, inputs, self.stats, self.embodiment, qpos[None], len(qpos),
                                       self.seed + self.calls)[0][0]
        else:
            positions = self._guided(inputs, qpos, state, previous)
        self.seconds.append(time.perf_counter() - started)
        return positions

    def _guided(self, inputs, qpos: np.ndarray, state: np.ndarray, previous: tuple[int, int] | None) -> np.ndarray:
        """`predict_chunks` (the same noise) through the guided sampler, the chunk kept as the one executed next."""
        cfg, model = self.model.config, self.model
        cache = KVCache(cfg, 1, cfg.prefix_len, model.dtype)
        slots = torch.arange(1)
        model.prefill(inputs, cache, slots)
        noise = torch.randn(1, cfg.action_horizon, cfg.action_dim,
                            generator=torch.Generator().manual_seed(self.seed + self.calls))
        request = None if previous is None else self.guide.request_at(*previous, state)
        actions = self.sampler.sample(model, cache, slots, noise, [request if isinstance(request, Committed)
                                                                   else None])
        self.guide.executing(actions[0], 0, state)
        robot = robot_actions(actions, len(qpos), self.stats)
        return self.embodiment.actions_to_robot(robot, qpos[None]).positions[0]


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


def run_delayed_episode(env: AlohaSimEnv, policy: CheckpointPolicy, seed: int, execute: int, delay: int,
                        handover: str) -> dict:
    """`run_episode` with chunks arriving `delay` steps after their frame (`sim/delayed_loop.py`), and smoothness."""
    observation = env.reset(seed)
    try:
        done = run_delayed(env, observation, policy, delay, execute, handover, DT)
    except SimulationDiverged as err:
        print(f"sim-eval: seed {seed}: {err}; counted as a failure", file=sys.stderr)
        return {"seed": seed, "max_reward": env.episode_max_reward, "success": False, "success_step": None,
                "steps": env.steps, "diverged": True, "smoothness": None}
    return {"seed": seed, "max_reward": env.episode_max_reward, "success": done.success_step is not None,
            "success_step": done.success_step, "steps": done.steps, "diverged": False, "smoothness": done.stats}


def evaluate_policy(policy: CheckpointPolicy, seeds: list[int], execute: int, max_steps: int, delay: int | None = None,
                    handover: str | None = None) -> dict:
    sizes = set(policy.cameras.values())
    if len(sizes) != 1:
        raise DataError(f"the checkpoint's cameras have different image sizes {policy.cameras}")
    height, width = sizes.pop()
    env = AlohaSimEnv("transfer_cube", cameras=list(policy.cameras), height=height, width=width, max_steps=max_steps)
    started = time.monotonic()
    try:
        episodes = [run_episode(env, policy, seed, execute) if handover is None else
                    run_delayed_episode(env, policy, seed, execute, delay, handover)
                    for seed in progress(seeds, desc="sim-eval")]
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
            "wall_seconds": wall, **({} if handover is None else smoothness(episodes, delay, handover))}


def smoothness(episodes: list[dict], delay: int, handover: str) -> dict:
    """Over the episodes that ran: the switch discontinuity (mean and max, rad), the jerk (mean of each episode's
    RMS, rad/s^3) and the held steps (no chunk covered them)."""
    stats = [e["smoothness"] for e in episodes if e["smoothness"] is not None]
    jumps = [s["switch_discontinuity"] for s in stats if s["switch_discontinuity"]["count"]]
    return {"delay": delay, "handover": handover,
            "discontinuity_mean": float(np.mean([j["mean"] for j in jumps])) if jumps else None,
            "discontinuity_max": float(max(j["max"] for j in jumps)) if jumps else None,
            "jerk_rms": float(np.mean([s["jerk_rms"] for s in stats])) if stats else None,
            "held_steps": int(sum(s["held_steps"] for s in stats)),
            "chunks_rejected": int(sum(s["chunks_rejected"] for s in stats))}


def build_parser() -> CommandParser:
    parser = CommandParser("sim-eval", __doc__)
    parser.add_argument("checkpoint", help="checkpoint folder (train-tiny's, with training.json)")
    parser.add_argument("--episodes", type=int, default=50, help="evaluation episodes")
    parser.add_argument("--seed", type=int, default=100_000, help="the first evaluation seed")
    parser.add_argument("--execute", type=int, default=0, help="actions executed per chunk (0: the whole chunk)")
    parser.add_argument("--steps", type=int, default=MAX_EPISODE_STEPS, help="steps per episode (50 Hz)")
    parser.add_argument("--out", default="out/sim_eval", help="folder for sim_eval.json")
    parser.add_argument("--delay", type=int, default=0,
                        help="control steps between a frame and its chunk's arrival (with --handover)")
    parser.add_argument("--handover", choices=HANDOVERS,
                        help="chunks arrive --delay steps late while the robot executes, handed over so (default: "
                             "none, each chunk executed at once, open loop)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.episodes <= 0 or args.steps <= 0 or args.execute < 0 or args.delay < 0:
        raise UsageError("--episodes and --steps must be positive, --execute and --delay not negative")
    if args.delay and args.handover is None:
        raise UsageError("--delay needs --handover")
    torch.set_num_threads(1)
    try:
        policy = CheckpointPolicy(args.checkpoint, rtc=RtcSettings() if args.handover == "rtc_guided" else None)
        horizon = policy.model.config.action_horizon
        execute = min(args.execute or horizon, horizon) if args.handover is None else max(args.execute, 1)
        seeds = evaluation_seeds(args.seed, args.episodes, policy.training_seeds)
        result = evaluate_policy(policy, seeds, execute, args.steps, args.delay, args.handover)
        if policy.guide is not None:  # frames guided, and the plain ones by reason
            result["rtc"] = {k: v for k, v in policy.guide.counts().items() if k != "rtc_delay_steps"}
    except (DataError, OSError, ValueError) as err:
        print(f"sim-eval failed: {err}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_eval.json").write_text(json.dumps(result, indent=1) + "\n")
    low, high = result["interval_95"]
    cadence = f"{execute} of {horizon} actions per chunk" if args.handover is None else \
        f"a frame every {max(execute, args.delay)} steps, chunks {args.delay} steps late"
    print(f"sim-eval: {result['successes']}/{result['trials']} transferred ({result['success_rate']:.0%}, 95 % "
          f"interval {low:.0%}-{high:.0%}), seeds {seeds[0]}..{seeds[-1]} ({len(policy.training_seeds)} training "
          f"seeds avoided), {cadence}, {result['diverged']} diverged, {result['wall_seconds']:.0f} s")
    for stage, count in result["reached_stage"].items():
        print(f"  reached {stage:<32} {count}/{result['trials']}")
    mean = result["mean_steps_to_success"]
    print(f"  mean steps to success            {mean:.0f}" if mean is not None else "  mean steps to success            -")
    print(f"  steps per second (wall)          {result['steps_per_second']:.1f} (the sim waits for each chunk)")
    print(f"  chunk time p50 / p99             {result['chunk_ms']['p50']:.1f} / {result['chunk_ms']['p99']:.1f} ms")
    if args.handover is not None:
        jump, most, jerk = result["discontinuity_mean"], result["discontinuity_max"], result["jerk_rms"]
        shown = "-" if jump is None else f"{jump:.4f} (max {most:.4f})"
        print(f"  {args.handover}, delay {args.delay}: switch discontinuity {shown} rad, jerk RMS "
              f"{'-' if jerk is None else f'{jerk:.0f}'} rad/s^3, {result['held_steps']} held steps, "
              f"{result['chunks_rejected']} chunks arrived past their end")
        if "rtc" in result:
            print(f"  real-time chunking: {', '.join(f'{k} {v}' for k, v in result['rtc'].items() if v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
