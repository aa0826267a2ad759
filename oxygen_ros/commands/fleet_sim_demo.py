"""`oxygen-ros fleet-sim-demo`: several simulated ALOHA robots in closed loop on one fleet node.

Starts one `fleet_node` serving robot1..robotN and N `sim_node` processes (gym-aloha), each in its own namespace
(`/robotK`), its cameras remapped to the model's image keys (`camera/top/image_raw` -> `camera/base_0_rgb/...`).
The sims stamp frames with the system clock (`stamps: wall`; no /clock, so N sims can share the fleet node's
clock) and map each chunk's stamp back to the sim step of its frame; the fleet node drives every robot in the
`--embodiment` profile (default `aloha`, as `sim-demo`'s `config/aloha.yaml`); each sim waits for the fleet node,
runs one episode of `--seconds` sim seconds with the chunks it gets, and exits. Prints per robot: chunks received and
their wall rate, chunk latency (wall, frame stamp -> chunk received at the sim; and in sim steps), the control
rate the sim achieved and the best reward stage; writes every process's log and summary.json into `--out`.
Random weights do not solve the task; the demo shows the plumbing and the timing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from oxygen_ros.command_line import CommandParser, claim_output_dir
from oxygen_ros.commands.processes import (
    add_user_domain_argument,
    demo_env,
    python_command,
    stop,
    wait_for_exit,
)
from oxygen_ros.commands.sim_demo import MODEL_CAMERA_KEYS, add_scene_arguments, scene_params, sim_summary

SIM_STEP_MS = 20.0  # gym-aloha's 50 Hz


def robot_name(i: int) -> str:
    return f"robot{i + 1}"


def ros_params(params: dict) -> list[str]:
    return [x for name, value in params.items() for x in ("-p", f"{name}:={value}")]


def fleet_command(args: argparse.Namespace) -> list[str]:
    model_ids = [spec.split("=", 1)[0] for spec in args.models]
    params = {"models": "[" + ",".join(f"'{m}'" for m in args.models) + "]",
              "robots": f"[{','.join(robot_name(i) for i in range(args.robots))}]",
              "robot_models": f"[{','.join(model_ids[i % len(model_ids)] for i in range(args.robots))}]",
              "slo_ms": float(args.slo_ms), "rate_hz": float(args.policy_rate), "narrate_every": 0,
              "queue": args.queue, "device": args.device, "embodiments": f"[{args.embodiment}]"}
    return [*python_command("oxygen_ros.nodes.fleet_node"), "--ros-args", *ros_params(params)]


def sim_command(args: argparse.Namespace, i: int) -> list[str]:
    params = {**scene_params(args, args.seed + i),
              "episode_steps": int(round(args.seconds * 1e3 / SIM_STEP_MS)), "max_episodes": 1,
              "rate_hz": float(args.sim_rate), "wait_for_policy": "true", "stamps": "wall"}
    remaps = [x for cam in args.cameras
              for x in ("-r", f"camera/{cam}/image_raw:=camera/{MODEL_CAMERA_KEYS.get(cam, cam)}/image_raw")]
    return [*python_command("oxygen_ros.nodes.sim_node"), "--ros-args", "-r", f"__ns:=/{robot_name(i)}",
            *remaps, *ros_params(params)]


def robot_lines(name: str, summary: dict) -> str:
    wall = summary["chunk_wall_latency_ms"] or {"median": float("nan"), "max": float("nan")}
    steps = summary["chunk_latency_steps"]
    rewards = summary["episode_max_rewards"] or [summary["episode_max_reward"]]
    return (f"{name}: {summary['chunks_received']} chunks ({summary['chunks_received'] / summary['wall_s']:.1f}/s "
            f"wall), latency median {wall['median']:.0f} ms wall (max {wall['max']:.0f}), "
            f"{steps['median']:.1f} sim steps; sim {summary['achieved_rate_hz']:.1f} Hz for {summary['step']} steps, "
            f"{summary['held_steps']} held; best reward stage {max(rewards):g} of {summary['task_max_reward']:g}")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("fleet-sim-demo", __doc__)
    parser.add_argument("--robots", type=int, default=2, help="simulated robots (one sim_node process each)")
    parser.add_argument("--models", default="a=tiny:0",
                        help="served models, id=source[:seed] (comma separated); robots use them in turn")
    parser.add_argument("--seconds", type=float, default=4.0, help="sim seconds of each robot's episode")
    add_scene_arguments(parser)
    parser.add_argument("--sim-rate", type=float, default=50.0,
                        help="wall-clock pacing of each sim's steps (Hz; 50 is real time)")
    parser.add_argument("--policy-rate", type=float, default=10.0, help="the fleet node's nominal robot rate (Hz)")
    parser.add_argument("--slo-ms", type=float, default=500.0, help="latency budget from each frame's stamp (ms)")
    parser.add_argument("--queue", choices=("esf", "rr", "lqf", "fifo"), default="esf",
                        help="the fleet node's queue policy")
    parser.add_argument("--device", default="cpu", help="the fleet node's device")
    parser.add_argument("--embodiment", default="aloha",
                        help="every robot's embodiment profile (docs/embodiments.md): a shipped name or a YAML file")
    parser.add_argument("--seed", type=int, default=0, help="robot K's episode seed is seed + K - 1")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many wall seconds")
    parser.add_argument("--out", default="out/fleet_sim_demo", help="output folder (an earlier run's is replaced)")
    add_user_domain_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.robots < 1 or args.seconds <= 0 or args.sim_rate <= 0 or args.slo_ms <= 0:
        parser.error("--robots, --seconds, --sim-rate and --slo-ms must be positive")
    args.models = [x for x in args.models.split(",") if x]
    if not args.models or any("=" not in x for x in args.models):
        parser.error("--models takes id=source[:seed],...")
    out = claim_output_dir(Path(args.out))
    env = demo_env(args.user_domain, "fleet-sim-demo")
    names = [robot_name(i) for i in range(args.robots)]
    print(f"fleet-sim-demo: {args.robots} {args.task} sims ({args.blending}, cameras {args.cameras} at "
          f"{args.size[0]}x{args.size[1]}) on one fleet node (models {args.models}, queue {args.queue}, "
          f"SLO {args.slo_ms:g} ms)", flush=True)
    logs = {name: open(out / f"{name}.log", "w") for name in ["fleet_node", *names]}
    fleet = subprocess.Popen(fleet_command(args), env=env, stdout=logs["fleet_node"], stderr=subprocess.STDOUT)
    sims = {name: subprocess.Popen(sim_command(args, i), env=env, stdout=logs[name], stderr=subprocess.STDOUT)
            for i, name in enumerate(names)}
    try:
        failure = wait_for_exit(sims, {"fleet_node": fleet}, args.timeout)
        if failure and fleet.poll() is not None:
            failure += f" (see {out / 'fleet_node.log'})"
    finally:
        codes = {name: stop(sim) for name, sim in sims.items()}
        stop(fleet)
        for log in logs.values():
            log.close()
    summaries = {name: sim_summary((out / f"{name}.log").read_text()) for name in names}
    failed = [name for name in names if codes[name] != 0 or summaries[name] is None]
    if failure or failed:
        log = out / ("fleet_node.log" if failure else f"{failed[0]}.log")
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        print(f"error: {failure or f'{failed[0]} exited with status {codes[failed[0]]} (see {log})'}\n{tail}",
              file=sys.stderr)
        return 1
    for name in names:
        print(robot_lines(name, summaries[name]))
    (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
