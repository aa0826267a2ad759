"""End-to-end latency of the VLA node: image stamp -> action chunk received, and the node's overhead on the engine.

`python -m oxygen_ros.evaluation.bench.node_latency [--presets tiny small] [--rate 10] [--seconds 10] [--image 480x640]`

For each preset the VLA node runs as its own process with the ALOHA parameter file (as `ros2 launch` starts it),
and `oxygen_ros.nodes.latency_probe` runs as another: it publishes camera images and joint states at 30 Hz and
measures when chunks arrive. Both are separate processes because this layer does not import ROS. Reported per
preset: the chunk rate, end-to-end latency percentiles (receipt time minus the chunk's header stamp, which is the
stamp of the newest image the node used, so it includes up to one control period of waiting for the next tick),
the engine's act latency (`Runtime.act`), the whole control tick, and the node's own share of a tick
(frame assembly, image conversion, trajectory message and publish).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from oxygen_ros.data.episode import ALOHA_JOINT_NAMES

REPO = Path(__file__).resolve().parents[3]
ALOHA_CAMERAS = ("cam_high", "cam_left_wrist", "cam_right_wrist")
PRESET_CAMERAS = {"tiny": 2, "small": 3, "pi05": 3}  # cameras the ALOHA file maps onto each preset's image keys
IMAGE_KEYS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")


def node_command(preset: str, params_file: Path, rate_hz: float, threads: int) -> tuple[list[str], list[str]]:
    """(vla_node command, camera topics) for a preset on the ALOHA layout."""
    count = PRESET_CAMERAS[preset]
    topics = [f"camera/{cam}/image_raw" for cam in ALOHA_CAMERAS[:count]]
    horizon = 8 if preset == "tiny" else 50
    command = [sys.executable, "-m", "oxygen_ros.nodes.vla_node", "--ros-args", "--params-file", str(params_file),
               "-p", f"model.preset:={preset}", "-p", f"cameras.topics:=[{','.join(topics)}]",
               "-p", f"cameras.keys:=[{','.join(IMAGE_KEYS[:count])}]",
               "-p", f"cameras.compressed:=[{','.join(['false'] * count)}]",
               "-p", f"control.rate_hz:={float(rate_hz)}", "-p", f"control.horizon:={horizon}",
               "-p", f"model.cpu_threads:={threads}", "-p", "autostart:=true"]  # a bench robot: act at once
    return command, topics


def run_preset(preset: str, args: argparse.Namespace, env: dict) -> dict:
    command, topics = node_command(preset, args.params_file, args.rate, args.threads)
    height, width = args.image
    node = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        probe = subprocess.run(
            [sys.executable, "-m", "oxygen_ros.nodes.latency_probe", "--cameras", *topics,
             "--joints", *ALOHA_JOINT_NAMES, "--rate", str(args.publish_rate), "--seconds", str(args.seconds),
             "--warmup", str(args.warmup), "--height", str(height), "--width", str(width)],
            env=env, capture_output=True, text=True, timeout=args.seconds + args.warmup + 180)
    finally:
        node.send_signal(signal.SIGINT)
        try:
            output, _ = node.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            node.kill()
            output, _ = node.communicate()
    lines = probe.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"error": probe.stderr[-2000:]}
    if "error" in result or node.returncode != 0:
        raise RuntimeError(f"{preset}: probe {result.get('error', 'ok')}; node exit {node.returncode}:\n{output}")
    return result


def table(rows: list[tuple[str, dict]], args: argparse.Namespace) -> str:
    lines = ["| preset | cameras | control Hz | chunks/s | e2e p50 / p99 ms | image age at tick p50 ms "
             "| act p50 / p99 ms | tick p50 ms | node overhead p50 / p99 ms | stale ticks |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for preset, r in rows:
        n = {k: float(v) for k, v in r["node"].items() if k != "state"}
        lines.append(
            f"| {preset} | {PRESET_CAMERAS[preset]} x {args.image[1]}x{args.image[0]} | {args.rate:g} "
            f"| {r['chunk_rate_hz']:.1f} | {r['e2e_ms_p50']:.1f} / {r['e2e_ms_p99']:.1f} "
            f"| {n['frame_age_ms_p50']:.1f} | {n['action_latency_p50_ms']:.1f} / {n['action_latency_p99_ms']:.1f} "
            f"| {n['tick_ms_p50']:.1f} | {n['node_overhead_ms_p50']:.2f} / {n['node_overhead_ms_p99']:.2f} "
            f"| {n.get('dropped_stale_frame', 0):.0f} |")
    return "\n".join(lines)


def image_size(text: str) -> tuple[int, int]:
    height, width = (int(v) for v in text.lower().split("x"))
    return height, width


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oxygen_ros.evaluation.bench.node_latency",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=sorted(PRESET_CAMERAS))
    parser.add_argument("--rate", type=float, default=10.0, help="the node's control.rate_hz")
    parser.add_argument("--publish-rate", type=float, default=30.0, help="camera frames per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured duration per preset")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds after the first chunk not measured")
    parser.add_argument("--image", type=image_size, default=(480, 640), help="HEIGHTxWIDTH of published images")
    parser.add_argument("--threads", type=int, default=0, help="the node's model.cpu_threads (0: torch default)")
    parser.add_argument("--params-file", type=Path, default=REPO / "config" / "aloha.yaml")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="node_latency_") as logs:
        env = dict(os.environ, ROS_DOMAIN_ID=str(random.randint(100, 200)), ROS_LOG_DIR=logs,
                   ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1")
        rows = [(preset, run_preset(preset, args, env)) for preset in args.presets]
    print(table(rows, args))
    print(json.dumps({preset: r for preset, r in rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
