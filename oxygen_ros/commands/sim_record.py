"""`oxygen-ros sim-record OUT`: scripted gym-aloha transfer_cube demonstrations that succeed, as a LeRobot v3 dataset.

Demonstration i uses seed `--seed + i` (the cube pose, gym-aloha's sampler): its plan is rolled out in gym-aloha's
end-effector task, the joints it reached replayed as joint targets in the joint-space task and recorded there
(`sim/demonstrations.py`, the way ACT made its simulated data). Only replays that reach the task's top reward stage
are kept; the seeds go on until `--episodes` are kept or `--max-attempts` tried. An attempt whose physics diverges
is one line and counted. It prints the scripted success rate and the SHA-256 of each file written; OUT also holds
`meta/sim.json` (task, cameras, image size, each kept episode's seed, the attempts' outcomes and `--perturb`), so
an evaluation can keep its seeds apart from the training seeds. `--perturb RAD` executes the right arm off its
targets (a seeded offset, `sim.demonstrations.right_arm_offsets`) while the targets are recorded as the actions.
`oxygen-ros convert lerobot OUT BAG --episode i` makes a bag of episode i.
"""

from __future__ import annotations

import sys
import time

from ..command_line import CommandParser, UsageError, progress
from ..data.episode import DataError
from ..data.lerobot import dataset_checksums, write_lerobot
from ..sim.aloha_env import SIM_CAMERAS, AlohaSimEnv, SimulationDiverged
from ..sim.demonstrations import EPISODE_STEPS, check_perturb, demonstration

SIM_META = "sim"  # meta/sim.json


def build_parser() -> CommandParser:
    parser = CommandParser("sim-record", __doc__)
    parser.add_argument("out", help="dataset folder to write (must not exist)")
    parser.add_argument("--episodes", type=int, default=50, help="successful demonstrations to keep")
    parser.add_argument("--seed", type=int, default=0, help="the first attempt's seed; attempt i uses seed + i")
    parser.add_argument("--max-attempts", type=int, help="give up after this many attempts (default 2 x episodes + 10)")
    parser.add_argument("--cameras", nargs="+", default=["top"], choices=SIM_CAMERAS, help="cameras to record")
    parser.add_argument("--height", type=int, default=240, help="image height (px)")
    parser.add_argument("--width", type=int, default=320, help="image width (px)")
    parser.add_argument("--steps", type=int, default=EPISODE_STEPS, help="steps per episode (50 Hz)")
    parser.add_argument("--perturb", type=float, default=0.0, metavar="RAD",
                        help="execute the right arm off its targets by this standard deviation (rad), the targets "
                             "recorded as the actions (DART; default 0: as planned)")
    return parser


def record(out: str, episodes: int, seed: int, max_attempts: int, cameras: list[str], height: int, width: int,
           steps: int, log=print, perturb: float = 0.0) -> dict:
    """Record until `episodes` demonstrations succeed; writes the dataset and returns meta/sim.json's content."""
    env = AlohaSimEnv("transfer_cube", cameras=cameras, height=height, width=width, max_steps=steps)
    kept, outcomes = [], []
    try:
        for attempt in progress(range(max_attempts), total=max_attempts, desc="sim-record"):
            if len(kept) == episodes:
                break
            try:
                demo = demonstration(env, seed + attempt, perturb)
            except SimulationDiverged as err:
                log(f"sim-record: seed {seed + attempt} dropped: {err}")
                outcomes.append({"seed": seed + attempt, "max_reward": None, "diverged": True})
                continue
            outcomes.append({"seed": demo.seed, "max_reward": demo.max_reward, "diverged": False})
            if demo.success:
                kept.append(demo)
    finally:
        env.close()
    if not kept:
        raise DataError(f"none of {len(outcomes)} scripted attempts succeeded; nothing written")
    info = {"task": "transfer_cube", "instruction": env.instruction, "cameras": list(cameras),
            "image_size": [height, width], "steps": steps, "success_reward": env.max_reward,
            "seeds": [d.seed for d in kept], "attempts": outcomes, "perturb": perturb}
    write_lerobot(out, [d.episode for d in kept], robot_type="aloha", extra_meta={SIM_META: info})
    return info


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.episodes <= 0 or args.steps <= 0 or args.height <= 0 or args.width <= 0:
        raise UsageError("--episodes, --steps, --height and --width must be positive")
    try:
        check_perturb(args.perturb)
    except ValueError as err:
        raise UsageError(str(err)) from None
    attempts = args.max_attempts if args.max_attempts is not None else 2 * args.episodes + 10
    if attempts < args.episodes:
        raise UsageError(f"--max-attempts {attempts} is fewer than --episodes {args.episodes}")
    started = time.monotonic()
    try:
        info = record(args.out, args.episodes, args.seed, attempts, args.cameras, args.height, args.width,
                      args.steps, perturb=args.perturb)
    except DataError as err:
        print(f"sim-record failed: {err}", file=sys.stderr)
        return 1
    tried = len(info["attempts"])
    succeeded = sum(1 for a in info["attempts"] if a["max_reward"] == info["success_reward"])
    diverged = sum(1 for a in info["attempts"] if a["diverged"])
    print(f"scripted success {succeeded}/{tried} ({succeeded / tried:.0%}; {diverged} diverged), seeds "
          f"{args.seed}..{args.seed + tried - 1}; wrote {len(info['seeds'])} episodes to {args.out} in "
          f"{time.monotonic() - started:.0f} s")
    for name, digest in dataset_checksums(args.out).items():
        print(f"  sha256 {digest}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
