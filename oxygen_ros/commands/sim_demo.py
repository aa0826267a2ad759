"""`oxygen-ros sim-demo`: the VLA node driving a simulated ALOHA in closed loop, on sim time.

Starts `sim_node` (gym-aloha, 50 Hz, waits for the policy) and the policy node (by default the VLA node with the
tiny preset and random weights; any executable that subscribes `camera/<cam>/image_raw` + `joint_states` and
publishes `action_chunk` will do), lets the sim run one episode of `--seconds`, then prints the control rate the
sim achieved, chunk latency in sim steps, the discontinuity at chunk switches and jerk, and writes into `--out`:
the recorded ALOHA episode, a contact sheet PNG of the camera frames, an mp4 of them, both nodes' logs and
summary.json. Random weights do not solve the task (they may even command the physics into diverging, which
ends the episode early, counted); the demo shows the plumbing and the timing.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from oxygen_ros.command_line import CommandParser
from oxygen_ros.commands.processes import (
    add_user_domain_argument,
    demo_env,
    find_config,
    python_command,
    stop,
    wait_for_exit,
)
from oxygen_ros.control.chunk_executor import BLENDING_MODES
from oxygen_ros.data.aloha import read_aloha
from oxygen_ros.data.video import encode_video
from oxygen_ros.model.config import PRESETS

# pi0.5's image keys for ALOHA-style cameras (openpi / LeRobot naming): base view and the two wrists.
SCRIPTED = "scripted"
MODEL_CAMERA_KEYS = {"top": "base_0_rgb", "left_wrist": "left_wrist_0_rgb", "right_wrist": "right_wrist_0_rgb"}


def add_scene_arguments(parser: argparse.ArgumentParser) -> None:
    """The scene options of both sim demos: the gym-aloha task, the chunk hand-over, the cameras, the image size."""
    parser.add_argument("--task", choices=("transfer_cube", "insertion"), default="transfer_cube",
                        help="gym-aloha task")
    parser.add_argument("--blending", choices=BLENDING_MODES, default="rtc",
                        help="how a sim hands over from one action chunk to the next")
    parser.add_argument("--cameras", nargs="+", default=["top", "left_wrist"],
                        help="sim cameras rendered and sent to the policy (the tiny preset takes two)")
    parser.add_argument("--size", type=int, nargs=2, default=(224, 224), metavar=("H", "W"),
                        help="rendered image size")


def scene_params(args: argparse.Namespace, seed: int) -> dict:
    """sim_node parameters for the scene options of `add_scene_arguments` and an episode seed."""
    return {"task": args.task, "blending": args.blending, "cameras": f"[{','.join(args.cameras)}]",
            "image_height": args.size[0], "image_width": args.size[1], "seed": seed}


def sim_command(args: argparse.Namespace, record: Path) -> list[str]:
    params = {
        **scene_params(args, args.seed),
        "episode_steps": int(round(args.seconds * 50)), "max_episodes": 1, "record_path": record,
        "wait_for_policy": "true",
    }
    return [*python_command("oxygen_ros.nodes.sim_node"), "--ros-args",
            *(x for name, value in params.items() for x in ("-p", f"{name}:={value}"))]


def policy_command(args: argparse.Namespace, out: Path) -> list[str]:
    """The policy node with the VLA node's parameter files, then the sim's overrides as one more file.

    By default the files of `oxygen-ros demo` (config/aloha.yaml, then config/demo_tiny.yaml: tiny-sized chunks and
    narration settings). The overrides (sim time, the sim's camera topics and image keys, preset, rate, then each
    `--policy-param NAME:=VALUE`) go into `out/policy_overrides.yaml`, loaded last: later parameter files win over
    earlier ones, whereas a `-p` given after parameter files loses to them.
    """
    if args.policy == SCRIPTED:
        # The scripted plan (oxygen_ros/sim/scripted.py) knows the cube pose from the sim's seed.
        command = [*python_command("oxygen_ros.nodes.scripted_policy"), "--ros-args"]
        files = []
        overrides = {"use_sim_time": True, "seed": args.seed, "camera": args.cameras[0]}
    else:
        command = [*python_command(args.policy), "--ros-args"]
        files = ([Path(args.params_file)] if args.params_file
                 else [find_config(n) for n in ("aloha.yaml", "demo_tiny.yaml")])
        overrides = {
            "use_sim_time": True,
            "autostart": True,  # a simulated robot: act at once (the shipped robot files start disarmed)
            "model": {"preset": args.preset},
            "cameras": {"topics": [f"camera/{cam}/image_raw" for cam in args.cameras],
                        "keys": [MODEL_CAMERA_KEYS.get(cam, cam) for cam in args.cameras],
                        "compressed": [False] * len(args.cameras)},
            "control": {"rate_hz": float(args.policy_rate)},
        }
    for override in args.policy_param:
        name, _, value = override.partition(":=")
        *groups, leaf = name.split(".")
        level = overrides
        for group in groups:
            level = level.setdefault(group, {})
        level[leaf] = yaml.safe_load(value)
    overrides_file = out / "policy_overrides.yaml"
    overrides_file.write_text(yaml.safe_dump({"/**": {"ros__parameters": overrides}}, sort_keys=False))
    for params_file in [*files, overrides_file]:
        if params_file is not None:
            command += ["--params-file", str(params_file)]
    return command

def sim_summary(log: str) -> dict | None:
    match = re.search(r"sim summary: (\{.*\})", log)
    return json.loads(match.group(1)) if match else None


LABEL_TOP, LABEL_LEFT = 14, 52  # pixels for the camera names above and the times left of the frames


def contact_sheet(images: dict[str, np.ndarray], path: Path, fps: float, rows: int = 6) -> Path:
    """Frames at evenly spaced times (rows) for every camera (columns), with 4-pixel gaps; camera names on top,
    each row's episode time on the left."""
    from PIL import Image, ImageDraw

    length = next(iter(images.values())).shape[0]
    picks = np.linspace(0, length - 1, min(rows, length)).round().astype(int)
    height = max(frames.shape[1] for frames in images.values())
    width = sum(frames.shape[2] for frames in images.values()) + 4 * (len(images) - 1)
    sheet = np.full((LABEL_TOP + len(picks) * (height + 4) - 4, LABEL_LEFT + width, 3), 255, dtype=np.uint8)
    for r, t in enumerate(picks):
        x = LABEL_LEFT
        for frames in images.values():
            h, w = frames.shape[1:3]
            top = LABEL_TOP + r * (height + 4)
            sheet[top: top + h, x: x + w] = frames[t]
            x += w + 4
    picture = Image.fromarray(sheet)
    draw = ImageDraw.Draw(picture)
    x = LABEL_LEFT
    for camera, frames in images.items():
        draw.text((x + 2, 1), camera, fill=(0, 0, 0))
        x += frames.shape[2] + 4
    for r, t in enumerate(picks):
        draw.text((2, LABEL_TOP + r * (height + 4) + 2), f"t={t / fps:.2f}s", fill=(0, 0, 0))
    picture.save(path)
    return path


def side_by_side(images: dict[str, np.ndarray]) -> np.ndarray:
    """[T, H, sum W, 3]: all cameras next to each other (cropped/padded to even sizes for yuv420p)."""
    height = max(frames.shape[1] for frames in images.values())
    parts = []
    for frames in images.values():
        pad = height - frames.shape[1]
        parts.append(np.pad(frames, ((0, 0), (0, pad), (0, 0), (0, 0))) if pad else frames)
    video = np.concatenate(parts, axis=2)
    return video[:, : video.shape[1] // 2 * 2, : video.shape[2] // 2 * 2]


def report_lines(summary: dict) -> list[str]:
    latency, switch = summary["chunk_latency_steps"], summary["switch_discontinuity"]
    return [
        f"control rate: {summary['achieved_rate_hz']:.1f} Hz achieved (target {summary['target_rate_hz']:.0f} Hz), "
        f"sim step {summary['step_ms_p50']:.1f} ms median",
        f"chunks: {summary['chunks_accepted']} executed, {summary['chunks_rejected']} dropped (stale/out of order), "
        f"{summary['chunks_malformed']} malformed",
        f"chunk latency: median {latency['median']:.1f} sim steps ({latency['median'] * 20:.0f} ms), "
        f"max {latency['max']:.1f}",
        f"switch discontinuity ({summary['blending']}): mean {switch['mean']:.4f} rad, max {switch['max']:.4f} rad "
        f"over {switch['count']} switches; jerk rms {summary['jerk_rms']:.0f} rad/s^3",
        f"held steps (no chunk covering): {summary['held_steps']} of {summary['step']}",
        f"episodes: {summary['episode']} ended, {summary['successes']} succeeded, "
        f"{summary['diverged_episodes']} ended by diverging physics",
    ] + [f"episode {i} reward: best stage {best:g} of {summary['task_max_reward']:g} "
         f"({summary['reward_stages'][int(best)]})" for i, best in enumerate(summary["episode_max_rewards"])]


def parameter_override(text: str) -> str:
    name, separator, _ = text.partition(":=")
    if not separator or not name or any(not part for part in name.split(".")):
        raise argparse.ArgumentTypeError(f"expected NAME:=VALUE, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("sim-demo", __doc__)
    parser.add_argument("--seconds", type=float, default=6.0, help="sim seconds to run once the policy is up")
    add_scene_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="episode seed (cube placement)")
    parser.add_argument("--out", default="out/sim_demo", help="output folder (files of an earlier run are overwritten)")
    parser.add_argument("--policy", default="oxygen_ros.nodes.vla_node",
                        help=f"policy node: a module run with -m, a .py script, or `{SCRIPTED}` (transfer_cube only: "
                        "a scripted, not learned, plan that grasps the cube and lifts it)")
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model.preset for the VLA node")
    parser.add_argument("--policy-rate", type=float, default=10.0, help="control.rate_hz for the VLA node")
    parser.add_argument("--params-file", default=None, help="policy parameter file (default: config/aloha.yaml)")
    parser.add_argument("--policy-param", nargs="*", default=[], type=parameter_override, metavar="NAME:=VALUE",
                        help="more policy node parameters, loaded after its parameter files (YAML values)")
    parser.add_argument("--timeout", type=float, default=180.0, help="give up after this many wall seconds")
    parser.add_argument("--no-video", action="store_true", help="skip the mp4")
    add_user_domain_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    if args.policy == SCRIPTED and args.task != "transfer_cube":
        parser.error(f"--policy {SCRIPTED} has a plan for --task transfer_cube only")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = out / "episodes"
    env = demo_env(args.user_domain, "sim-demo")
    sim_log, policy_log = out / "sim_node.log", out / "policy.log"
    print(f"sim-demo: {args.task}, {args.blending}, cameras {args.cameras} at {args.size[0]}x{args.size[1]}, "
          f"policy {args.policy}")
    with open(sim_log, "w") as sim_out, open(policy_log, "w") as policy_out:
        sim = subprocess.Popen(sim_command(args, record), env=env, stdout=sim_out, stderr=subprocess.STDOUT)
        policy = subprocess.Popen(policy_command(args, out), env=env, stdout=policy_out, stderr=subprocess.STDOUT)
        try:
            failure = wait_for_exit({"sim": sim}, {"policy": policy}, args.timeout)
            if failure and policy.poll() is not None:
                failure += f" (see {policy_log})"
        finally:
            sim_status = stop(sim)
            stop(policy)
    summary = sim_summary(sim_log.read_text())
    if failure or sim_status != 0 or summary is None:
        # The log of the process that failed: the policy's when it exited or timed out, else the sim's.
        failed_log = policy_log if failure else sim_log
        tail = "\n".join(failed_log.read_text().splitlines()[-15:])
        print(f"error: {failure or f'sim_node exited with status {sim_status} (see {sim_log})'}\n{tail}",
              file=sys.stderr)
        return 1
    for line in report_lines(summary):
        print(line)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if summary["episodes_written"]:
        episode = read_aloha(summary["episodes_written"][0])
        print(f"wrote {contact_sheet(episode.images, out / 'contact_sheet.png', episode.fps)}")
        if not args.no_video:
            codec = encode_video(out / "sim_demo.mp4", side_by_side(episode.images), fps=episode.fps)
            print(f"wrote {out / 'sim_demo.mp4'} ({codec})")
        print(f"wrote {summary['episodes_written'][0]} ({episode.length} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
