"""`oxygen-ros download ID [--revision R] [--tokenizer T]`: fetch a pi05 checkpoint and its tokenizer ahead of time.

A robot is often offline, or should not fetch gigabytes at start-up. This resolves the checkpoint exactly as the
node does (`loading.checkpoint_folder`, `loading.checkpoint_tokenizer`) into huggingface_hub's cache, checks its
config, the tokenizer's vocabulary and the normalization stats the node will use (the checkpoint's, or the
`--norm-stats` file of the robot's own dataset), and prints the parameter lines that load it; a checkpoint
without usable stats (`lerobot/pi05_base` ships its normalizer without features or a stats file) is an error
saying what is missing and how to give them. Run it where there is network;
on the robot the node then finds the same snapshot offline (`HF_HUB_OFFLINE=1`), from this cache or from a copy of
its `models--org--name` folders under the robot's `HF_HUB_CACHE`.
"""

from __future__ import annotations

from oxygen_ros.command_line import CommandParser, UsageError

from ..model.checkpoint import CheckpointError, checkpoint_config, checkpoint_normalization
from ..model.hub import HubId, parse_hub_id
from ..model.loading import checkpoint_folder, checkpoint_tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser("download", __doc__)
    parser.add_argument("id", help="hub repo id of a pi05 checkpoint, org/name (e.g. lerobot/pi05_base)")
    parser.add_argument("--revision", default=None, help="branch, tag or commit (default: the repo's main branch)")
    parser.add_argument("--tokenizer", default="", help="tokenizer to use instead of the one found from the "
                                                        "checkpoint: a hub id, file or folder")
    parser.add_argument("--norm-stats", default="", help="the robot's own dataset stats to use instead of the "
                                                         "checkpoint's: LeRobot's meta/stats.json or openpi's "
                                                         "norm_stats.json (the node's model.norm_stats)")
    args = parser.parse_args(argv)
    hub_id = parse_hub_id(args.id)
    if hub_id is None or (hub_id.revision and args.revision):
        raise UsageError(f"{args.id!r} is not a hub repo id org/name (give a revision with --revision)")
    hub_id = HubId(hub_id.repo_id, args.revision or hub_id.revision)

    folder = checkpoint_folder(str(hub_id))
    config = checkpoint_config(folder)
    tokenizer, where = checkpoint_tokenizer(folder, config.vocab_size, args.tokenizer)
    size = (folder / "model.safetensors").stat().st_size
    print(f"checkpoint {hub_id}: {folder} (weights {size / 2**30:.2f} GiB)")
    print(f"tokenizer: {where} ({tokenizer.vocab_size} tokens)")
    try:
        norm, stats_from = checkpoint_normalization(folder, args.norm_stats or None)
    except CheckpointError as err:
        raise CheckpointError(f"{hub_id} cannot run without normalization stats: {err}. Give the stats of the "
                              f"robot's own dataset (LeRobot's meta/stats.json or openpi's norm_stats.json): "
                              f"--norm-stats here, model.norm_stats on the node") from None
    print(f"normalization: {norm.describe()}, stats from {stats_from}")
    print(f"\nparameter lines (the vla_node parameter file's model section; the snapshot is commit {folder.name}):")
    print("    model:")
    print(f"      checkpoint: \"{hub_id}\"")
    print(f"      tokenizer: \"{args.tokenizer}\"" + ("" if args.tokenizer else "  # empty: found as above"))
    print(f"      norm_stats: \"{args.norm_stats}\"" + ("" if args.norm_stats else "  # empty: the checkpoint's"))
    print("\non a robot without network: copy the cache folders named above (models--...) into its HF_HUB_CACHE "
          "and set HF_HUB_OFFLINE=1")
    return 0
