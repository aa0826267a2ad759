"""The `oxygen-ros` command: one entry point, one subcommand per job, each implemented where its layer lives.

Subcommands are imported only when run, so `oxygen-ros bench` does not load rclpy and `oxygen-ros replay` does not
load torch.
"""

from __future__ import annotations

import importlib
import sys

from oxygen_ros import __version__
from oxygen_ros.command_line import UsageError
from oxygen_ros.openmp import prefer_passive_waits, prefer_short_spins

PASSIVE_OPENMP_COMMANDS = {"fleet-profile", "fleet-bench", "serve", "serve-bench"}  # torch from several threads

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("oxygen_ros.evaluation.bench.oxygen_bench", "OxyGen benchmark matrix (five settings side by side)"),
    "model-bench": ("oxygen_ros.evaluation.bench.model_bench", "parameter counts and per-call model timings"),
    "rtc-bench": ("oxygen_ros.evaluation.bench.rtc_bench", "a chunk's denoising with and without real-time chunking's guidance"),
    "download": ("oxygen_ros.commands.download", "fetch a pi05 checkpoint by hub id and its tokenizer ahead of time"),
    "convert": ("oxygen_ros.data.convert", "ALOHA HDF5 / LeRobot v3 episode -> rosbag2"),
    "replay": ("oxygen_ros.nodes.replay_node", "publish a rosbag2 with its timing (raw CDR, optional /clock)"),
    "record": ("oxygen_ros.nodes.record_node", "record topics into a rosbag2"),
    "report": ("oxygen_ros.data.report", "rates, action latency, narration timeline and plots from a bag"),
    "demo": ("oxygen_ros.commands.demo", "end-to-end demo: synthetic ALOHA episode -> bag -> replay + vla_node -> report"),
    "train-tiny": ("oxygen_ros.commands.train_tiny", "fit the tiny pi0.5 on one ALOHA episode -> checkpoint folder"),
    "sim-record": ("oxygen_ros.commands.sim_record", "scripted gym-aloha transfer-cube demonstrations -> LeRobot v3 dataset"),
    "sim-eval": ("oxygen_ros.commands.sim_eval", "a trained checkpoint on gym-aloha transfer-cube in process: success rate over held-out seeds"),
    "sim-probe": ("oxygen_ros.commands.sim_probe", "does a trained policy see the cube? its first chunk vs the scripted plan's, per cube position"),
    "rtc-compare": ("oxygen_ros.commands.rtc_compare", "the hand-overs under a delay side by side in closed loop (sim-eval per cell) -> table"),
    "sim-demo": ("oxygen_ros.commands.sim_demo", "closed loop: gym-aloha sim_node + the VLA node on sim time, timing report"),
    "fleet-sim-demo": ("oxygen_ros.commands.fleet_sim_demo", "closed loop: several gym-aloha sim_node robots on one fleet_node"),
    "fleet-sim": ("oxygen_ros.commands.fleet_sim", "fleet simulator: SLO attainment vs robots per design"),
    "fleet-profile": ("oxygen_ros.commands.fleet_profile", "measure real stage latencies of served models -> LUT JSON"),
    "fleet-assign": ("oxygen_ros.commands.fleet_assign", "traffic controller: robots -> GPUs (assignment JSON)"),
    "fleet-bench": ("oxygen_ros.commands.fleet_bench", "real fleet serving on this machine: robots at 98% SLO per design"),
    "fleet-ipc": ("oxygen_ros.evaluation.fleet.ipc", "measured cost of handing stage outputs between processes -> JSON"),
    "fleet-dds-bench": ("oxygen_ros.commands.fleet_dds_bench", "one fleet_node, N robot client processes over DDS: SLO vs N"),
    "serve": ("oxygen_ros.commands.serve", "openpi's websocket protocol (openpi-client) in front of the engine"),
    "fleet-ray": ("oxygen_ros.commands.fleet_ray", "the fleet on Ray Serve: replicas placed by the MILP, openpi's protocol"),
    "serve-bench": ("oxygen_ros.commands.serve_bench", "openpi-client clients against serve vs the sequential baseline"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: oxygen-ros [--version] <command> [args...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    lines += ["", "`oxygen-ros <command> --help` describes each command and its options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--version":
        print(f"oxygen-ros {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"oxygen-ros: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if name in PASSIVE_OPENMP_COMMANDS:  # before torch is imported (`oxygen_ros/openmp.py`)
        prefer_passive_waits()
    else:
        prefer_short_spins()
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except UsageError as error:
        print(f"oxygen-ros {name}: error: {error} (see --help)", file=sys.stderr)
        return 2
    except (OSError, ValueError) as error:
        # A file that is missing, unreadable or malformed: one line, not a traceback.
        print(f"oxygen-ros {name}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
