"""`oxygen-ros rtc-compare CHECKPOINT --out DIR`: the hand-overs under an inference delay, side by side in closed
loop on gym-aloha's transfer_cube (in process, `sim-eval --delay D --handover H`): for each delay, `newest_wins`,
`temporal_ensemble`, the post-hoc `rtc` blend and `rtc_guided` (real-time chunking's guidance) on CHECKPOINT, and,
with `--prefix-checkpoint`, `rtc_guided` with the `prefix` method on a checkpoint trained with
`train-tiny --rtc-max-delay` (training-time RTC). Every cell runs the same held-out seeds (the first `--episodes`
from `--seed` that neither checkpoint trained on) and writes its `sim-eval` folder `DIR/<cell>_d<D>`; a cell whose
`sim_eval.json` is there already is read, not run again, so a run cut short resumes and two runs with different
`--delays` or `--cells` can share DIR. Then `DIR/table.md`: per cell the success rate (95 % interval), the reward stages reached,
the switch discontinuity, the jerk, the held steps and the frames guided.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ..command_line import CommandParser, UsageError
from ..model.rtc import PREFIX
from ..sim.aloha_env import MAX_EPISODE_STEPS, REWARD_STAGES
from ..sim.evaluation import evaluation_seeds
from . import sim_eval
from .train_tiny import INFO_FILE

TABLE_FILE = "table.md"


@dataclass(frozen=True)
class Cell:
    name: str  # the folder's stem and the table's label
    handover: str
    prefix: bool = False  # the training-time RTC checkpoint, sampled with the prefix method


CELLS = (Cell("newest_wins", "newest_wins"), Cell("temporal_ensemble", "temporal_ensemble"),
         Cell("rtc_blend", "rtc"), Cell("rtc_guided", "rtc_guided"), Cell("rtc_prefix", "rtc_guided", prefix=True))
CELL = {c.name: c for c in CELLS}


def cell_arguments(cell: Cell, args, delay: int, seeds: list[int], out: Path) -> list[str]:
    """`sim-eval`'s arguments for one cell: its checkpoint, hand-over and delay, the shared seeds (one contiguous
    run from the first, the training seeds of both checkpoints skipped by `--seed`'s own rule)."""
    checkpoint = args.prefix_checkpoint if cell.prefix else args.checkpoint
    argv = [checkpoint, "--episodes", str(len(seeds)), "--seed", str(args.seed), "--steps", str(args.steps),
            "--execute", str(args.execute), "--delay", str(delay), "--handover", cell.handover, "--out", str(out)]
    return argv + (["--rtc-method", PREFIX] if cell.prefix else [])


def training_seeds(checkpoint: str) -> set[int]:
    info = Path(checkpoint) / INFO_FILE
    return {int(s) for s in json.loads(info.read_text()).get("sim_seeds", [])} if info.is_file() else set()


def run_cells(args) -> dict[tuple[int, str], dict]:
    """Each cell's `sim_eval.json`, run where it is missing; every cell must have evaluated the same seeds."""
    checkpoints = [args.checkpoint] + ([args.prefix_checkpoint] if args.prefix_checkpoint else [])
    seen = [training_seeds(c) for c in checkpoints]
    if len(seen) == 2 and seen[0] != seen[1]:
        raise UsageError("the two checkpoints were trained on different simulator seeds: their held-out seeds "
                         "would differ; train the prefix checkpoint on the same dataset")
    seeds = evaluation_seeds(args.seed, args.episodes, seen[0])
    cells = [CELL[name] for name in args.cells or [c.name for c in CELLS]]
    if any(c.prefix for c in cells) and not args.prefix_checkpoint:
        if args.cells:
            raise UsageError("the rtc_prefix cell needs --prefix-checkpoint")
        cells = [c for c in cells if not c.prefix]
    results = {}
    for delay in args.delays:
        for cell in cells:
            out = Path(args.out) / f"{cell.name}_d{delay}"
            if not (out / "sim_eval.json").is_file():
                print(f"rtc-compare: {cell.name} at delay {delay} ({len(seeds)} episodes)", flush=True)
                if sim_eval.main(cell_arguments(cell, args, delay, seeds, out)) != 0:
                    raise RuntimeError(f"sim-eval failed for {cell.name} at delay {delay}")
            result = json.loads((out / "sim_eval.json").read_text())
            if result["seeds"] != seeds:
                raise RuntimeError(f"{out} evaluated seeds {result['seeds'][:3]}..., not {seeds[:3]}...: remove it "
                                   "or use another --out")
            results[delay, cell.name] = result
    return results


def table(results: dict[tuple[int, str], dict]) -> list[str]:
    """The markdown table of the cells, by delay then hand-over."""
    stages = REWARD_STAGES["transfer_cube"][1:-1]  # right gripper touches, lifted, left gripper touches
    lines = ["| D | hand-over | transferred (95 %) | touched / lifted / left touches | discontinuity mean / max (rad) | "
             "jerk RMS (rad/s^3) | held steps | frames guided / plain |",
             "|---:|---|---|---|---|---:|---:|---|"]
    for (delay, name), r in sorted(results.items(), key=lambda item: (item[0][0], _order(item[0][1]))):
        low, high = r["interval_95"]
        reached = " / ".join(str(r["reached_stage"][s]) for s in stages)
        jump = "-" if r["discontinuity_mean"] is None else f"{r['discontinuity_mean']:.3f} / {r['discontinuity_max']:.3f}"
        jerk = "-" if r["jerk_rms"] is None else f"{r['jerk_rms']:,.0f}"
        rtc = r.get("rtc")
        guided = "-" if rtc is None else f"{rtc.get('rtc_guided', 0)} / {sum(v for k, v in rtc.items() if k.startswith('rtc_plain'))}"
        lines.append(f"| {delay} | {name} | {r['successes']}/{r['trials']} ({low:.0%}-{high:.0%}) | {reached} | "
                     f"{jump} | {jerk} | {r['held_steps']} | {guided} |")
    return lines


def _order(name: str) -> int:
    return [c.name for c in CELLS].index(name)


def build_parser() -> CommandParser:
    parser = CommandParser("rtc-compare", __doc__)
    parser.add_argument("checkpoint", help="checkpoint folder (train-tiny's) for the four hand-overs")
    parser.add_argument("--prefix-checkpoint", help="a checkpoint trained with --rtc-max-delay on the same data")
    parser.add_argument("--delays", nargs="+", type=int, default=[3, 10, 20], help="control steps (50 Hz)")
    parser.add_argument("--episodes", type=int, default=20, help="episodes per cell (the same seeds in each)")
    parser.add_argument("--seed", type=int, default=100_000, help="the first evaluation seed")
    parser.add_argument("--execute", type=int, default=1,
                        help="a new frame once the previous chunk arrived and this many steps passed")
    parser.add_argument("--steps", type=int, default=MAX_EPISODE_STEPS, help="steps per episode")
    parser.add_argument("--cells", nargs="+", choices=list(CELL),
                        help="these cells only, run in this order (default: all; rtc_prefix with --prefix-checkpoint)")
    parser.add_argument("--out", required=True, help="folder for the cells' sim-eval folders and table.md")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.episodes <= 0 or args.execute < 1 or args.steps <= 0 or min(args.delays) < 0:
        raise UsageError("--episodes, --execute and --steps must be positive, --delays not negative")
    try:
        results = run_cells(args)
    except (OSError, ValueError, RuntimeError) as err:
        print(f"rtc-compare failed: {err}", file=sys.stderr)
        return 1
    lines = table(results)
    (Path(args.out) / TABLE_FILE).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
