"""`oxygen-ros convert {aloha,lerobot} SRC OUT_BAG`: turn one recorded episode into a replayable rosbag2.

SRC is an ALOHA `episode_N.hdf5` (or a folder of them, picked with --episode) or a LeRobot v3 dataset folder
(DROID and ALOHA on the hub use that layout) or v2.x one (what openpi's conversion scripts write, its DROID data:
keys without the `observation.` prefix). Any problem with the input is reported as one line naming it,
with exit status 1, and no output bag is left behind: a file of another structure, an episode without frames,
and state, action, velocity or effort values that are NaN or infinite (a robot would be fed them) are refused.
"""

from __future__ import annotations

import argparse
import sys

from ..command_line import CommandParser
from .aloha import aloha_episode_path, read_aloha
from .episode import DataError, Episode
from .episode_bag import DEFAULT_BASE_TIME_NS, STORAGES, base_time_seconds, write_episode_bag
from .lerobot import read_lerobot


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("convert", __doc__)
    parser.add_argument("format", choices=("aloha", "lerobot"), help="source episode format")
    parser.add_argument("src", help="ALOHA .hdf5 file or folder, or LeRobot v3 or v2.x dataset folder")
    parser.add_argument("out_bag", help="output rosbag2 folder (must not exist)")
    parser.add_argument("--episode", type=int, default=None, help="episode index (default: 0)")
    parser.add_argument("--storage", choices=sorted(STORAGES), default="mcap", help="rosbag2 storage format")
    parser.add_argument("--compressed-images", action="store_true", help="JPEG CompressedImage instead of rgb8")
    parser.add_argument("--task", default=None, help="instruction text (ALOHA files carry none)")
    parser.add_argument("--base-time", type=base_time_seconds, default=DEFAULT_BASE_TIME_NS / 1e9,
                        help="stamp of the first frame, seconds since the epoch")
    return parser


def load_episode(fmt: str, src: str, episode: int | None, task: str | None) -> Episode:
    """Read the requested episode from SRC, refusing unusable numbers; `task`, if given, replaces its instruction."""
    if fmt == "aloha":
        loaded = read_aloha(aloha_episode_path(src, episode))
    else:
        loaded = read_lerobot(src, 0 if episode is None else episode)
    problem = loaded.numeric_problem()
    if problem is not None:
        raise DataError(f"{src}: episode {episode or 0}: {problem}; refusing to convert")
    if task is not None:
        loaded.task = task
    return loaded


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.episode is not None and args.episode < 0:
        print(f"error: --episode must be >= 0, got {args.episode}", file=sys.stderr)
        return 1
    try:
        episode = load_episode(args.format, args.src, args.episode, args.task)
        write_episode_bag(episode, args.out_bag, storage=args.storage, compressed_images=args.compressed_images,
                          base_time_ns=int(round(args.base_time * 1e9)))
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_bag}: {episode.length} frames, cameras {list(episode.cameras)}, task {episode.task!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
