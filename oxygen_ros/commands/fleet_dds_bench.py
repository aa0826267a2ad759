"""``oxygen-ros fleet-dds-bench``: one fleet node, N robot client processes over DDS, SLO attainment vs N.

For every repeat and every run (a set of fleet node parameters, e.g. ``queue=esf`` or ``design=robion,queue=esf``)
one `fleet_node` process serves the largest robot count (tiny models on the CPU by default), and robot client
processes (`nodes/robot_client.py`) join it: for each robot count N, in increasing order, clients are started up
to N, and once each has had a chunk back (or sent 10 s without one) and ``--warmup`` seconds passed, every
client's frames sent in the next ``--duration`` seconds are scored from the robots' own side: header stamp ->
chunk received on time within the SLO; a late chunk or none at all is a miss. Robots use the models in turn,
send ``--image-size`` images of each of their model's cameras at ``--rate`` Hz from a random phase, each frame up
to ``--jitter`` of a period late; the repeat seeds the phases and jitter. Runs are interleaved per repeat, so a
change in the machine's load hits them alike. All processes run on an isolated DDS domain with localhost-only
discovery unless ``--user-domain``.

Prints, per run and N: attainment over all robots and the worst robot's (median [min-max] over repeats),
latency p50 / p99 and the frames with no chunk; then the robots served at >= 98 % per run: per repeat the largest
N of the list at which that N and every smaller one reached 98 %. Writes results.json and every process's log and
client summary into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from oxygen_ros.command_line import CommandParser, claim_output_dir, progress
from oxygen_ros.commands.processes import add_user_domain_argument, demo_env, python_command, stop
from oxygen_ros.evaluation.fleet.robot_load import frames_from_rows, pool, score
from oxygen_ros.fleet.capacity import TARGET

FLEET_NODE = "oxygen_ros.nodes.fleet_node"
ROBOT_CLIENT = "oxygen_ros.nodes.robot_client"
DEFAULT_RUNS = ("queue=esf", "queue=rr")  # the fleet node's design is fixed today; its queue policy is a parameter


def parse_run(text: str) -> dict[str, str]:
    """``name=value,name=value`` -> fleet node parameters (values as ROS parameter text, e.g. YAML)."""
    params = {}
    for item in (x for x in text.split(",") if x):
        name, separator, value = item.partition("=")
        if not separator or not name or not value:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE[,NAME=VALUE...], got {text!r}")
        params[name] = value
    if not params:
        raise argparse.ArgumentTypeError("a run needs at least one NAME=VALUE")
    return params


def counts(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected robot counts like 2,4,8, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"robot counts must be positive, got {text!r}")
    return values


def run_label(params: dict[str, str]) -> str:
    return ",".join(f"{name}={value}" for name, value in params.items())


def robot_name(i: int) -> str:
    return f"robot{i + 1}"


def fleet_command(args: argparse.Namespace, run: dict[str, str], n_robots: int) -> list[str]:
    model_ids = [spec.split("=", 1)[0] for spec in args.models]
    robots = [robot_name(i) for i in range(n_robots)]
    params = {"models": "[" + ",".join(f"'{m}'" for m in args.models) + "]",
              "robots": f"[{','.join(robots)}]",
              "robot_models": f"[{','.join(model_ids[i % len(model_ids)] for i in range(n_robots))}]",
              "slo_ms": float(args.slo_ms), "rate_hz": float(args.rate), "narrate_every": "0",
              "compressed": str(args.compressed).lower(), "device": args.device,
              # every core for the node (the clients' environment pins OMP_NUM_THREADS to 1, which the node would
              # otherwise inherit as its intra-op budget)
              "cpu_threads": str(os.cpu_count() or 1), **args.fleet_param, **run}
    return [*python_command(FLEET_NODE), "--ros-args",
            *(x for name, value in params.items() for x in ("-p", f"{name}:={value}"))]


def client_command(args: argparse.Namespace, i: int, seed: int, folder: Path) -> list[str]:
    rng = random.Random(seed * 100_003 + i)
    params = {"rate_hz": float(args.rate), "slo_ms": float(args.slo_ms), "image_size": args.image_size,
              "compressed": str(args.compressed).lower(), "jitter": float(args.jitter), "seed": rng.randrange(2**31),
              "phase_s": rng.random() / args.rate, "warmup_s": float(args.warmup), "grace_s": args.slo_ms / 1e3 + 1,
              "cameras": f"[{args.cameras}]",
              "ready_path": folder / f"{robot_name(i)}.ready", "summary_path": folder / f"{robot_name(i)}.json"}
    return [*python_command(ROBOT_CLIENT), "--ros-args", "-r", f"__ns:=/{robot_name(i)}",
            *(x for name, value in params.items() for x in ("-p", f"{name}:={value}"))]


def log_tail(path: Path, lines: int = 8) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


class BenchError(RuntimeError):
    """A process of the run failed or did not come up in time (says which, with its log's tail)."""


@dataclass
class Trial:
    """One fleet node and its clients for one (run, repeat): the measured window per robot count."""

    folder: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: list = field(default_factory=list)
    windows: dict[int, tuple[int, int]] = field(default_factory=dict)

    def start(self, name: str, command: list[str], env: dict) -> None:
        log = open(self.folder / f"{name}.log", "w")
        self.logs.append(log)
        self.processes[name] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise BenchError(f"{name} exited with status {process.returncode}:\n"
                                 f"{log_tail(self.folder / f'{name}.log')}")

    def stop_all(self) -> dict[str, int]:
        """Clients first (all signalled, then waited for: they listen for late chunks, then write summaries)."""
        clients = [name for name in self.processes if name != "fleet_node"]
        for name in clients:
            if self.processes[name].poll() is None:
                self.processes[name].send_signal(signal.SIGINT)
        codes = {name: stop(self.processes[name], timeout=30) for name in clients}
        if "fleet_node" in self.processes:
            codes["fleet_node"] = stop(self.processes["fleet_node"])
        for log in self.logs:
            log.close()
        return codes


def wait_ready(trial: Trial, names: Sequence[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all((trial.folder / f"{name}.ready").is_file() for name in names):
        trial.check_alive()
        if time.monotonic() > deadline:
            late = [n for n in names if not (trial.folder / f"{n}.ready").is_file()]
            raise BenchError(f"{', '.join(late)} did not start sending within {timeout:.0f} s "
                             f"(see {trial.folder})")
        time.sleep(0.2)


def run_trial(args: argparse.Namespace, run: dict[str, str], seed: int, folder: Path, env: dict) -> dict:
    """Serve every robot count of the list with one fleet node; returns {N: pooled score dict with per-robot}."""
    folder.mkdir(parents=True)
    trial = Trial(folder)
    results: dict[int, dict] = {}
    try:
        trial.start("fleet_node", fleet_command(args, run, args.robots[-1]), env)
        for n in args.robots:
            new = [i for i in range(n) if robot_name(i) not in trial.processes]
            for i in new:
                trial.start(robot_name(i), client_command(args, i, seed, folder), env)
            wait_ready(trial, [robot_name(i) for i in new], args.startup_timeout)
            time.sleep(args.warmup)
            trial.check_alive()
            start_ns = time.time_ns()
            time.sleep(args.duration)
            trial.windows[n] = (start_ns, time.time_ns())
            trial.check_alive()
    finally:
        codes = trial.stop_all()
    summaries = {}
    for i in range(args.robots[-1]):
        path = folder / f"{robot_name(i)}.json"
        if not path.is_file():
            raise BenchError(f"{robot_name(i)} wrote no summary (exit status {codes.get(robot_name(i))}):\n"
                             f"{log_tail(folder / f'{robot_name(i)}.log')}")
        summaries[i] = json.loads(path.read_text())
    for n, (start_ns, end_ns) in trial.windows.items():
        scores = [score(frames_from_rows(summaries[i]["frames"]), args.slo_ms / 1e3, start_ns, end_ns)
                  for i in range(n)]
        results[n] = pool(scores).as_dict() | {"per_robot": [s.attainment for s in scores]}
    results_of_node = {robot_name(i): summaries[i]["engine_status"] for i in summaries}
    return {"points": results, "engine_status": results_of_node, "exit_codes": codes}


def spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def robots_at_target(points: dict[int, dict]) -> int:
    """The largest N of the list at which N and every smaller N reached the target attainment (0: none)."""
    best = 0
    for n in sorted(points):
        if points[n]["attainment"] < TARGET:
            break
        best = n
    return best


def table(results: dict[str, list[dict]], robot_counts: Sequence[int]) -> list[str]:
    lines = ["| run | robots | attainment | worst robot | latency p50 ms | latency p99 ms | frames without chunk |",
             "|---|---|---|---|---|---|---|"]
    for label, trials in results.items():
        for n in robot_counts:
            points = [t["points"][n] for t in trials]
            lines.append(f"| {label} | {n} | {spread([p['attainment'] for p in points])} | "
                         f"{spread([p['worst_robot'] for p in points])} | "
                         f"{spread([p['latency_ms_p50'] for p in points], '{:.1f}')} | "
                         f"{spread([p['latency_ms_p99'] for p in points], '{:.1f}')} | "
                         f"{spread([p['missed'] for p in points], '{:g}')} of "
                         f"{spread([p['frames'] for p in points], '{:g}')} |")
    lines += ["", f"| run | robots at >= {TARGET:.0%}: median [min-max] | per repeat |", "|---|---|---|"]
    for label, trials in results.items():
        at = [robots_at_target(t["points"]) for t in trials]
        lines.append(f"| {label} | {spread(at, '{:g}')} | {' '.join(map(str, at))} |")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser("fleet-dds-bench", __doc__)
    p.add_argument("--runs", nargs="+", type=parse_run, default=None, metavar="NAME=VALUE[,NAME=VALUE]",
                   help=f"one fleet node parameter set per run, e.g. queue=esf queue=rr design=robion,queue=esf "
                   f"(default: {' '.join(DEFAULT_RUNS)})")
    p.add_argument("--robots", type=counts, default="2,4,8", help="robot counts (comma separated)")
    p.add_argument("--models", default="a=tiny:0,b=tiny:1",
                   help="served models, id=source[:seed] (comma separated); robots use them in turn")
    p.add_argument("--cameras", default="base_0_rgb,left_wrist_0_rgb",
                   help="camera keys each robot sends (those of the served models; default: the tiny preset's)")
    p.add_argument("--rate", type=float, default=10.0, help="each robot's frame rate (Hz)")
    p.add_argument("--slo-ms", type=float, default=100.0, help="latency budget from the frame's stamp (ms)")
    p.add_argument("--image-size", type=int, default=224, help="side of the square camera images (pixels)")
    p.add_argument("--compressed", action="store_true", help="send JPEG (image_raw/compressed) instead of rgb8")
    p.add_argument("--jitter", type=float, default=0.2, help="each frame up to this fraction of a period late")
    p.add_argument("--duration", type=float, default=10.0, help="measured wall seconds per robot count")
    p.add_argument("--warmup", type=float, default=3.0,
                   help="seconds after the newest client is ready before measuring")
    p.add_argument("--repeats", type=int, default=2, help="repeats (each seeds the phases and jitter anew)")
    p.add_argument("--device", default="cpu", help="the fleet node's device")
    p.add_argument("--fleet-param", nargs="*", type=parse_run, default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                   help="fleet node parameters for every run (a run's own win), e.g. cpu_threads=2,max_batch=8")
    p.add_argument("--startup-timeout", type=float, default=180.0,
                   help="seconds for new clients to start and be ready (first chunk, or 10 s of frames without)")
    p.add_argument("--out", default="out/fleet_dds_bench", help="output folder (an earlier run's is replaced)")
    add_user_domain_argument(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.runs = args.runs or [parse_run(text) for text in DEFAULT_RUNS]
    if args.rate <= 0 or args.slo_ms <= 0 or args.duration <= 0 or args.warmup < 0 or args.repeats < 1:
        parser.error("--rate, --slo-ms, --duration and --repeats must be positive and --warmup >= 0")
    if not 0 <= args.jitter < 1:
        parser.error("--jitter must be in [0, 1)")
    args.models = [x for x in args.models.split(",") if x]
    if not args.models or any("=" not in x for x in args.models):
        parser.error("--models takes id=source[:seed],...")
    args.fleet_param = {name: value for params in args.fleet_param for name, value in params.items()}
    out = claim_output_dir(Path(args.out))
    env = demo_env(args.user_domain, "fleet-dds-bench")
    env.setdefault("OMP_NUM_THREADS", "1")  # the clients; the fleet node sets its own thread count (cpu_threads)
    load_before = os.getloadavg()
    print(f"fleet-dds-bench: runs {[run_label(r) for r in args.runs]}, robots {args.robots}, models {args.models}, "
          f"{args.image_size}x{args.image_size} {'JPEG' if args.compressed else 'rgb8'} at {args.rate:g} Hz, "
          f"SLO {args.slo_ms:g} ms, {args.repeats} repeats; load average {load_before[0]:.2f} on "
          f"{os.cpu_count()} cores", flush=True)
    results: dict[str, list[dict]] = {run_label(r): [] for r in args.runs}
    plan = [(seed, run) for seed in range(args.repeats) for run in args.runs]
    started = time.monotonic()
    try:
        for seed, run in progress(plan, total=len(plan), desc="fleet-dds-bench"):
            folder = out / f"repeat{seed}" / run_label(run).replace("=", "-").replace(",", "_")
            results[run_label(run)].append(run_trial(args, run, seed, folder, env))
    except BenchError as error:
        print(f"oxygen-ros fleet-dds-bench: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # every process of the trial was stopped on the way out
        print("oxygen-ros fleet-dds-bench: interrupted", file=sys.stderr)
        return 130
    load_after = os.getloadavg()
    lines = table(results, args.robots)
    print("\n".join(lines))
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} cores); "
          f"{time.monotonic() - started:.0f} s wall")
    (out / "results.json").write_text(json.dumps({
        "args": {k: v for k, v in vars(args).items()}, "load_average": [load_before, load_after],
        "cores": os.cpu_count(), "results": results, "table": lines}, indent=1, default=str) + "\n")
    print(f"wrote {out / 'results.json'}")
    return 0
