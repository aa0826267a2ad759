"""`oxygen-ros demo`: the whole pipeline on a generated episode, end to end, on one machine.

1. writes a synthetic ALOHA episode (a scripted bimanual hand-over seen by two cameras) as the ALOHA tools write
   it (HDF5, JPEG-compressed images), and converts it to a rosbag2 with `oxygen-ros convert`;
2. trains the `tiny` pi0.5 on that episode (`oxygen-ros train-tiny`: its actions, in the `aloha` embodiment's space
   (deltas from each frame's state, pi's signs and gripper units), and per-frame captions) into a checkpoint folder,
   cached by the episode's content and the training settings, so a rerun skips it;
3. starts the recorder, the VLA node (`config/aloha.yaml` + `config/demo_tiny.yaml`, on simulated time) loading
   that checkpoint and its tokenizer as it would a real one (`model.checkpoint`, `model.tokenizer`, greedy
   narration), and the replay of the episode bag with its /clock, as `launch/oxygen_demo.launch.py` does on a
   ROS 2 install;
4. when the replay ends, stops the nodes and writes the run report (topic rates, latency from frame stamp to
   chunk, narration timeline, action-chunk plot against the episode's recorded actions, the chunks' error against
   them and the narration's caption accuracy) and prints a summary.

`--untrained` (or a `--preset` other than tiny) runs random weights instead, which show only the plumbing.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ..command_line import CommandParser, UsageError, claim_output_dir, positive_float
from ..data.aloha import read_aloha, write_aloha
from ..data.bag import read_messages
from ..data.convert import main as convert_main
from ..data.report import actions_from_episode_bag, write_report
from ..data.synthetic import synthetic_episode
from ..model.config import PRESETS
from .processes import add_user_domain_argument, demo_env, find_config, python_command, stop, wait_for_exit
from .train_tiny import INFO_FILE, TOKENIZER_FILE, TrainConfig, episode_content_hash, train

CAMERAS = ("cam_high", "cam_left_wrist")  # as config/demo_tiny.yaml subscribes them
PARAMETER_FILES = ("aloha.yaml", "demo_tiny.yaml")
TASK = "pick up the red cube and place it in the bowl"
NODE_OUTPUTS = ("action_chunk", "narration", "engine_status")
RECORDED_TOPICS = (*NODE_OUTPUTS, "/clock")
TRAINING = TrainConfig()


def trained_checkpoint(hdf5: Path, cache: Path) -> Path:
    """The tiny policy trained on the episode, from `cache` when the same episode and settings were trained before."""
    episode = read_aloha(hdf5, task=TASK)
    key = hashlib.sha256(f"{episode_content_hash(episode)} {json.dumps(dataclasses.asdict(TRAINING))}".encode())
    folder = cache / f"tiny_{key.hexdigest()[:16]}"
    if (folder / INFO_FILE).is_file():
        print(f"demo: using the policy already trained on this episode, {folder}", flush=True)
        return folder
    print(f"demo: training the tiny policy on the episode ({TRAINING.steps} steps) into {folder}", flush=True)
    train(episode, folder, TRAINING, log=lambda line: print(f"  {line}", flush=True))
    return folder


def node_command(args: argparse.Namespace, out: Path, checkpoint: Path | None = None) -> list[str]:
    """The VLA node with the demo's parameter files, then this run's overrides as one more file.

    The overrides (sim time, the trained checkpoint with greedy narration, `--preset`, `--rate-hz`) go into
    `out/node_overrides.yaml`, loaded last: later parameter files win, whereas a `-p` given after parameter files
    loses to them.
    """
    command = [*python_command("oxygen_ros.nodes.vla_node"), "--ros-args"]
    for name in PARAMETER_FILES:
        path = find_config(name)
        if path is None:
            raise RuntimeError(f"config/{name} not found (source tree or share/oxygen_ros/config)")
        command += ["--params-file", str(path)]
    overrides: dict = {"use_sim_time": True, "autostart": True}  # a simulated robot: act at once
    if checkpoint is not None:
        overrides["model"] = {"checkpoint": str(checkpoint.resolve()),
                              "tokenizer": str((checkpoint / TOKENIZER_FILE).resolve())}
        overrides["language"] = {"temperature": 0.0}
    if args.preset:
        overrides.setdefault("model", {})["preset"] = args.preset
    if args.rate_hz:
        overrides["control"] = {"rate_hz": float(args.rate_hz)}
    overrides_file = out / "node_overrides.yaml"
    overrides_file.write_text(yaml.safe_dump({"/**": {"ros__parameters": overrides}}, sort_keys=False))
    return command + ["--params-file", str(overrides_file)]


def make_episode_bag(out: Path, seconds: float) -> tuple[Path, Path]:
    episode = synthetic_episode(seconds=seconds, fps=50.0, cameras=CAMERAS, task=TASK, motion="handover")
    hdf5 = write_aloha(out / "episode_0.hdf5", episode, compress=True)
    bag = out / "episode_bag"
    if convert_main(["aloha", str(hdf5), str(bag), "--task", TASK]) != 0:
        raise RuntimeError(f"converting {hdf5} failed")
    return hdf5, bag


def run_nodes(args: argparse.Namespace, out: Path, episode_bag: Path, checkpoint: Path | None) -> Path:
    """Recorder + VLA node + replay; returns the recorded bag once the replay has finished."""
    run_bag = out / "run_bag"
    env = demo_env(args.user_domain, "demo")
    node_cmd = node_command(args, out, checkpoint)
    logs = {name: open(out / f"{name}.log", "w") for name in ("record", "vla_node", "replay")}
    processes: dict[str, subprocess.Popen] = {}
    try:
        processes["record"] = subprocess.Popen(
            [*python_command("oxygen_ros.nodes.record_node"), str(run_bag), "--topics", *RECORDED_TOPICS],
            env=env, stdout=logs["record"], stderr=subprocess.STDOUT)
        processes["vla_node"] = subprocess.Popen(node_cmd, env=env, stdout=logs["vla_node"], stderr=subprocess.STDOUT)
        # the replay waits until the node subscribes (its model is loaded), so no frame goes unheard, and until
        # the recorder subscribes to the node's outputs (after the node advertised them), so no chunk goes
        # unrecorded: on a loaded machine the recorder's discovery can take longer than the replay's delay
        processes["replay"] = subprocess.Popen(
            [*python_command("oxygen_ros.nodes.replay_node"), str(episode_bag), "--clock", "--wait-for",
             "joint_states", "--wait-for-subscribers", *NODE_OUTPUTS], env=env, stdout=logs["replay"],
            stderr=subprocess.STDOUT)
        failure = wait_for_exit({"replay": processes["replay"]},
                                {name: processes[name] for name in ("record", "vla_node")}, args.timeout)
        if failure:
            see = next((name for name in ("record", "vla_node") if processes[name].poll() is not None), "replay")
            raise RuntimeError(f"{failure} before the replay finished; see {out / (see + '.log')}")
        if processes["replay"].returncode != 0:
            raise RuntimeError(f"replay failed; see {out / 'replay.log'}")
        time.sleep(1.0)  # the last chunks and narration reach the recorder
    finally:
        # the node first, so the recorder sees its last messages; the recorder last, so its bag is closed
        for name in ("replay", "vla_node", "record"):
            if name in processes and stop(processes[name]) not in (0, None):
                print(f"warning: {name} exited with status {processes[name].returncode}", file=sys.stderr)
        for log in logs.values():
            log.close()
    return run_bag


def engine_status(run_bag: Path) -> dict:
    """The last EngineStatus the node published (its own view of rates, tokens and the KV pool)."""
    statuses = [message for _, message in read_messages(run_bag, topics=["/engine_status"])]
    if not statuses:
        return {}
    status = statuses[-1]
    fields = ("state", "action_rate_hz", "action_latency_p50_ms", "action_latency_p99_ms", "actions_published",
              "deadline_misses", "dropped_frames", "language_tokens_per_s", "kv_slots_total", "kv_bytes_total")
    return {name: getattr(status, name) for name in fields}


def summary_lines(report: dict, status: dict, seconds: float, training: dict | None = None) -> list[str]:
    chunks = report["topics"].get("/action_chunk", {})
    latency = report["action_latency"]
    finals = [n for n in report["narration"] if n["final"]]
    lines = [
        "oxygen-ros demo summary",
        f"  episode            {seconds:.0f} s synthetic ALOHA episode, cameras {', '.join(CAMERAS)}",
        "  policy             " + (f"tiny pi0.5 trained on the episode ({training['train_config']['steps']} steps, "
                                    f"{training['train_seconds']:.0f} s), loaded from its checkpoint folder"
                                    if training else "random weights"),
        f"  action chunks      {report['action_chunks']} received, {chunks.get('rate_hz') or 0:.1f} Hz",
    ]
    error = report.get("action_error", {})
    if error.get("available"):
        contrast = (f"; random weights {training['before']['action_error']:.3f} (offline, every "
                    f"{training['train_config']['eval_every']}th frame)" if training else "")
        worst = max(error["per_joint"].items(), key=lambda item: item[1])
        space = f"robot units, embodiment {training['train_config']['embodiment']}" if training else "robot units"
        lines.append(f"  action error       {error['mean_abs']:.3f} mean abs vs recorded actions ({space}; worst "
                     f"{worst[0]} {worst[1]:.3f}){contrast}")
    if latency["available"]:
        lines.append(f"  action latency     p50 {latency['p50_ms']:.1f} ms, p99 {latency['p99_ms']:.1f} ms "
                     f"(frame stamp -> chunk received)")
    else:
        lines.append(f"  action latency     unavailable: {latency['reason']}")
    if latency.get("warning"):
        lines.append(f"  warning            {latency['warning']}")
    if status:
        lines.append(f"  engine             act p50 {status['action_latency_p50_ms']:.1f} ms, p99 "
                     f"{status['action_latency_p99_ms']:.1f} ms, {status['deadline_misses']} deadline misses, "
                     f"{status['dropped_frames']} dropped frames, {status['language_tokens_per_s']:.1f} tokens/s")
    captions = report.get("caption_accuracy", {})
    accuracy = (f", {captions['matches']}/{captions['scored']} ({captions['accuracy']:.0%}) equal their frame's "
                f"caption" if captions.get("available") else "")
    lines.append(f"  narration          {len(report['narration'])} requests, {len(finals)} finished{accuracy}")
    for entry in finals[:: max(1, len(finals) // 4)][:4]:
        expected = f" (caption {entry['expected']!r})" if "expected" in entry else ""
        lines.append(f"    [{entry['first_s']:5.2f} s] {entry['text'][:40]!r}{expected}")
    return lines


def build_parser() -> CommandParser:
    parser = CommandParser("demo", __doc__)
    parser.add_argument("--out", default="out/demo",
                        help="output folder: created, or replaced if an earlier oxygen-ros run made it; any other "
                        "non-empty folder is refused")
    parser.add_argument("--seconds", type=positive_float, default=20.0, help="length of the generated episode")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="model.preset for the VLA node (default: tiny, from config/demo_tiny.yaml)")
    parser.add_argument("--rate-hz", type=positive_float,
                        help="control.rate_hz for the VLA node (default: 10, from config/demo_tiny.yaml)")
    parser.add_argument("--timeout", type=positive_float, default=300.0,
                        help="give up after this many wall seconds")
    add_user_domain_argument(parser)
    parser.add_argument("--untrained", action="store_true", help="random weights instead of the trained tiny policy")
    parser.add_argument("--cache", default="out/cache", help="where trained policies are kept between runs")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = claim_output_dir(Path(args.out))
    except UsageError as error:
        parser.error(str(error))
    try:
        hdf5, episode_bag = make_episode_bag(out, args.seconds)
        print(f"demo: wrote {hdf5} and {episode_bag}", flush=True)
        checkpoint = None if args.untrained or args.preset not in (None, "tiny") else trained_checkpoint(
            hdf5, Path(args.cache))
        training = json.loads((checkpoint / INFO_FILE).read_text()) if checkpoint else None
        print("demo: replaying the episode into vla_node", flush=True)
        run_bag = run_nodes(args, out, episode_bag, checkpoint)
        report = write_report(run_bag, out / "report", actions_from_episode_bag(episode_bag),
                              random_weights=checkpoint is None)
        status = engine_status(run_bag)
    except Exception as error:  # noqa: BLE001 - one clear line for the person running the demo
        print(f"demo failed: {error}", file=sys.stderr)
        return 1
    summary = {"report": report, "engine_status": status, "checkpoint": str(checkpoint) if checkpoint else None,
               "training": {k: v for k, v in training.items() if k != "loss"} if training else None}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n".join(summary_lines(report, status, args.seconds, training)))
    print(f"wrote {out / 'report' / 'report.md'} and {out / 'report' / 'actions.png'}")
    if report["action_chunks"] == 0:
        print("demo failed: no action chunk was recorded", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
