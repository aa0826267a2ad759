"""`oxygen-ros sim-probe CHECKPOINT`: does a policy trained on transfer_cube see the cube? Its first chunk at the
start pose, where only the camera tells the episodes apart, against the scripted plan's on the same seeds
(`sim/probe.py` says what is fitted).

By default on held-out seeds (the first `--episodes` from `--seed` that the training data did not use), the frame
rendered by the sim at the checkpoint's image size and the plan from the scripted end-effector rollout; with
`--dataset DEMOS` (a `sim-record` dataset) on its first `--episodes` recorded episodes instead, their first recorded
frame and recorded actions: a policy that explains its training episodes but not held-out ones memorized them, one
that explains neither did not learn to localize the cube. Writes `sim_probe.json` under `--out`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from ..command_line import CommandParser, UsageError
from ..data.episode import DataError
from ..data.lerobot import read_lerobot
from ..sim.evaluation import evaluation_seeds
from ..sim.probe import probe_first_chunks, probe_lines
from .sim_eval import CheckpointPolicy, checkpoint_env


def build_parser() -> CommandParser:
    parser = CommandParser("sim-probe", __doc__)
    parser.add_argument("checkpoint", help="checkpoint folder (train-tiny's, with training.json)")
    parser.add_argument("--episodes", type=int, default=30, help="episodes probed (at least 4)")
    parser.add_argument("--seed", type=int, default=100_000, help="the first held-out seed")
    parser.add_argument("--dataset", help="probe the first --episodes episodes of this sim-record dataset instead")
    parser.add_argument("--out", default="out/sim_probe", help="folder for sim_probe.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.episodes < 4:
        raise UsageError("--episodes must be at least 4 (a fit on the cube's x and y)")
    from gym_aloha.utils import sample_box_pose

    from ..sim.demonstrations import end_effector_rollout

    torch.set_num_threads(1)
    try:
        policy = CheckpointPolicy(args.checkpoint)
        env = checkpoint_env(policy, 1)
        if args.dataset is None:
            seeds = evaluation_seeds(args.seed, args.episodes, policy.training_seeds)

            def first_chunk(seed: int) -> np.ndarray:
                observation = env.reset(seed)
                return policy.chunk(observation.images, observation.qpos, env.instruction)

            scripted_plan, where = end_effector_rollout, "held-out seeds"
        else:
            recorded = json.loads((Path(args.dataset) / "meta" / "sim.json").read_text())["seeds"]
            if len(recorded) < args.episodes:
                raise DataError(f"{args.dataset}: {len(recorded)} episodes, {args.episodes} asked")
            seeds = [int(s) for s in recorded[: args.episodes]]
            episodes = {seed: read_lerobot(args.dataset, i) for i, seed in enumerate(seeds)}

            def first_chunk(seed: int) -> np.ndarray:
                episode = episodes[seed]
                images = {cam: episode.images[cam][0] for cam in policy.cameras}
                return policy.chunk(images, episode.state[0].astype(np.float64), env.instruction)

            def scripted_plan(seed: int) -> np.ndarray:
                return episodes[seed].actions

            where = f"the training episodes of {args.dataset}"
        probe = probe_first_chunks(first_chunk, scripted_plan, lambda seed: sample_box_pose(seed)[:2], seeds)
    except (DataError, OSError, ValueError, KeyError) as err:
        print(f"sim-probe failed: {err}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"checkpoint": str(args.checkpoint), "on": where, **probe.as_dict()}
    (out / "sim_probe.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"sim-probe on {where}:")
    for line in probe_lines(probe, policy.model.config.action_horizon):
        print(f"  {line}")
    print(f"  wrote {out / 'sim_probe.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
