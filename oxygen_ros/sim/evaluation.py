"""The bookkeeping of a closed-loop evaluation on gym-aloha, whatever path the chunks took (in process, ROS, serve).

Each path yields one record per episode: `{"seed", "max_reward", "success", "steps", "diverged"}` (and, where the
path knows it, `success_step`). Success is gym-aloha's own: the episode reached the task's top reward stage. This
module turns those records into the figures every path prints: the success rate with its 95 % Wilson interval, how
many episodes reached each reward stage, the mean episode length, and the seeds (never a training seed).
"""

from __future__ import annotations

import math

import numpy as np

from .aloha_env import REWARD_STAGES


def episode_record(env, seed: int, succeeded_at: int | None, diverged: bool) -> dict:
    """One episode as every path records it: its seed, best reward stage, success (gym-aloha's top stage reached)
    and the step it came at, its length and whether its physics diverged."""
    return {"seed": seed, "max_reward": env.episode_max_reward, "success": succeeded_at is not None,
            "success_step": succeeded_at, "steps": env.steps, "diverged": diverged}


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


def summarize(episodes: list[dict], task: str = "transfer_cube") -> dict:
    """Success rate, its interval, the stage histogram and episode lengths of `episodes` (records as above)."""
    successes = sum(bool(e["success"]) for e in episodes)
    stages = REWARD_STAGES[task]
    histogram = {stages[level]: sum(1 for e in episodes if int(e["max_reward"]) >= level)
                 for level in range(1, len(stages))}
    to_success = [e["success_step"] for e in episodes if e["success"] and e.get("success_step") is not None]
    trials = len(episodes)
    return {"episodes": episodes, "successes": successes, "trials": trials,
            "success_rate": successes / trials if trials else 0.0,
            "interval_95": wilson_interval(successes, trials), "reached_stage": histogram,
            "mean_episode_steps": float(np.mean([e["steps"] for e in episodes])) if episodes else None,
            "mean_steps_to_success": float(np.mean(to_success)) if to_success else None,
            "diverged": sum(bool(e["diverged"]) for e in episodes), "seeds": [e["seed"] for e in episodes]}


def percentiles_ms(seconds: list[float]) -> dict:
    """p50 / p99 of durations in seconds, as milliseconds (zeros when there are none)."""
    ms = 1000 * np.asarray(seconds or [0.0])
    return {"p50": float(np.median(ms)), "p99": float(np.quantile(ms, 0.99)), "count": len(seconds)}


def report_lines(result: dict, path: str) -> list[str]:
    """The printed report of one path's result (`summarize`'s fields plus `control_rate_hz`, `chunk_ms`, and
    optionally `chunk_latency_steps`)."""
    low, high = result["interval_95"]
    trials = result["trials"]
    seeds = result["seeds"]
    lines = [f"sim-eval [{path}]: {result['successes']}/{trials} transferred ({result['success_rate']:.0%}, 95 % "
             f"interval {low:.0%}-{high:.0%}), seeds {seeds[0]}..{seeds[-1]}, {result['diverged']} diverged"]
    lines += [f"  reached {stage:<32} {count}/{trials}" for stage, count in result["reached_stage"].items()]
    to_success = result["mean_steps_to_success"]
    lines.append(f"  mean episode length              {result['mean_episode_steps']:.0f} steps (to success: "
                 + (f"{to_success:.0f})" if to_success is not None else "-)"))
    lines.append(f"  achieved control rate            {result['control_rate_hz']:.1f} Hz")
    chunk = result["chunk_ms"]
    lines.append(f"  chunk latency p50 / p99          {chunk['p50']:.1f} / {chunk['p99']:.1f} ms ({chunk['what']})")
    if result.get("chunk_latency_steps"):
        steps = result["chunk_latency_steps"]
        lines.append(f"  chunk latency in sim steps       median {steps['median']:.1f}, max {steps['max']:.1f}")
    return lines
