"""`oxygen-ros serve-bench`: openpi-client clients against one `oxygen-ros serve`, beside the openpi-style
baseline on the same model.

Per preset, one server runs in this process (embodiment droid; every request is DROID's, two 224 x 224 x 3 images,
joints, gripper, prompt) and each setting below runs for `--seconds`, the settings interleaved round by round so
that a change in the machine's load hits them all alike:

- `sequential`: a process of its own (`bench_baseline`) reads the same request and acts on it with the engine, one
  request at a time (batch 1), as openpi's server does; N separate openpi-style servers sharing one device serve at
  most this many requests per second between them (the baseline the OxyGen benchmark also calls sequential). It
  runs at its best: one thread runs torch there, so libgomp's own waits suit it (its threads spin between
  operators), whereas the server's process sleeps them (it runs torch from several threads:
  `oxygen_ros/openmp.py`); in the server's process the baseline's tiny-preset acts took about 4 times as long;
- `serve N` for each N of `--clients`: N client processes (`bench_client`, openpi-client's
  `WebsocketClientPolicy`) back to back, or each at `--rate-hz`, their requests batched by the server;
- `probe`: one client at `--probe-rate-hz` (well below capacity, so nothing queues), for the overhead.

Reported per setting: requests per second, round trip p50 / p99, and per request the server's overhead (the
round trip less the engine's own time for it, `policy_timing`: serialization, network, the request's checks);
for the probe also its round trip against the sequential act p50 of the same round.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..command_line import CommandParser, claim_output_dir
from ..engine.runtime import Runtime, RuntimeConfig, Served
from ..engine.scheduler import SchedulerConfig
from ..engine.stats import percentile_ms
from ..model.loading import load_model_source, tokenizer_for
from ..openmp import SPIN_VARIABLE as OPENMP_SPINS
from ..openmp import VARIABLE as OPENMP_WAITS
from ..serving.params import engine_parameters
from ..serving.server import OpenpiServer, ServeConfig
from .bench_client import droid_request
from .serve import Capacity, build_server

CLIENT_START_TIMEOUT_S = 300.0
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cpu_model() -> str:
    """The CPU's model name (lscpu's), for the record."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def sequential(preset: str, dtype: str, seed: int, seconds: float) -> dict:
    """The openpi-style baseline in a process of its own (`bench_baseline`), with libgomp's own waits rather than
    the server process's: its figures."""
    env = {k: v for k, v in os.environ.items() if k not in (OPENMP_WAITS, OPENMP_SPINS)}
    result = subprocess.run([sys.executable, "-m", "oxygen_ros.commands.bench_baseline", preset, dtype, str(seed),
                             str(seconds)], env=env, capture_output=True, text=True,
                            timeout=seconds + CLIENT_START_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"the sequential baseline failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def sequential_loop(server: OpenpiServer, preset: str, dtype: torch.dtype, seed: int, seconds: float) -> dict:
    """The openpi-style baseline in this process: read the request and act on it, one at a time, on the same
    weights as `server`'s (built, not started: only its reader and embodiment are used)."""
    model = load_model_source(preset, "cpu", dtype, seed).model
    runtime = Runtime(Served(model, tokenizer_for(model, None)),
                      RuntimeConfig(SchedulerConfig(num_steps=model.config.num_steps)))
    obs = droid_request(0)
    latencies = []

    def act() -> None:
        request = server.reader.read(obs)
        chunk = runtime.act(runtime.frame(runtime.prepare(request.observation), False))
        server.embodiment.openpi_actions(runtime.robot_actions(chunk, 8), request.state)

    for _ in range(3):
        act()
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds:
        start = time.perf_counter()
        act()
        latencies.append(time.perf_counter() - start)
    runtime.close()
    return {"setting": "sequential", "requests_per_s": len(latencies) / seconds,
            "latency_p50_ms": percentile_ms(latencies, 0.5), "latency_p99_ms": percentile_ms(latencies, 0.99)}


def clients(port: int, count: int, seconds: float, rate_hz: float) -> dict:
    """`count` client processes, started together once all have warmed up; their merged figures."""
    procs = [subprocess.Popen([sys.executable, "-m", "oxygen_ros.commands.bench_client", str(port), str(seconds),
                               str(rate_hz), str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(count)]
    try:
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a benchmark client did not start: {line!r}")
        start_at = f"{time.time() + 0.2}\n"
        for proc in procs:
            proc.stdin.write(start_at)
            proc.stdin.flush()
        results = [json.loads(proc.communicate(timeout=seconds + CLIENT_START_TIMEOUT_S)[0]) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    done = [t for r in results for t in r["done_s"] if t <= seconds]
    rtt = [ms / 1e3 for r in results for ms in r["rtt_ms"]]
    overhead = [(a - b) / 1e3 for r in results for a, b in zip(r["rtt_ms"], r["engine_ms"])]
    return {"requests_per_s": len(done) / seconds, "latency_p50_ms": percentile_ms(rtt, 0.5),
            "latency_p99_ms": percentile_ms(rtt, 0.99), "overhead_p50_ms": percentile_ms(overhead, 0.5),
            "overhead_p99_ms": percentile_ms(overhead, 0.99), "requests": len(rtt),
            "late_start_s": max(r["late_s"] for r in results)}


def bench_parameters(preset: str, dtype: str, seed: int) -> dict:
    """The server's engine parameters for a preset (the baseline builds its reader from the same)."""
    return engine_parameters([], [f"model.preset={preset}", "embodiment=droid", f"model.dtype={dtype}",
                                  "model.cpu_kernel=off", f"model.seed={seed}"])


def bench_preset(preset: str, args) -> list[dict]:
    counts = sorted(set(args.clients))
    max_batch = 1 << (max(counts) - 1).bit_length()
    server = build_server(bench_parameters(preset, args.dtype, args.seed), ServeConfig(port=0),
                          Capacity(max(counts), max_batch, 60.0)).start()
    records = []
    try:
        for round_index in range(args.rounds):
            base = dict(sequential(preset, args.dtype, args.seed, args.seconds), round=round_index)
            probe = clients(server.port, 1, args.seconds, args.probe_rate_hz)
            records += [base, dict(probe, setting="probe", round=round_index,
                                   over_sequential_ms=probe["latency_p50_ms"] - base["latency_p50_ms"])]
            for count in counts:
                records.append(dict(clients(server.port, count, args.seconds, args.rate_hz),
                                    setting=f"serve {count}", round=round_index))
    finally:
        server.close()
    return [dict(r, preset=preset) for r in records]


def table(records: list[dict]) -> str:
    """One row per preset and setting: the median over rounds of each figure."""
    rows = ["| preset | setting | requests/s | round trip p50 / p99 ms | overhead p50 / p99 ms | vs sequential |",
            "|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["preset"], r["setting"]) for r in records))
    for preset, setting in keys:
        mine = [r for r in records if (r["preset"], r["setting"]) == (preset, setting)]

        def med(key: str, mine: list[dict] = mine) -> float:
            return float(np.median([r[key] for r in mine]))

        base = float(np.median([r["requests_per_s"] for r in records
                                if (r["preset"], r["setting"]) == (preset, "sequential")]))
        overhead = f"{med('overhead_p50_ms'):.2f} / {med('overhead_p99_ms'):.2f}" if "overhead_p50_ms" in mine[0] \
            else "-"
        versus = f"{med('requests_per_s') / base:.2f}x" if setting.startswith("serve") else \
            f"{med('over_sequential_ms'):+.2f} ms round trip" if setting == "probe" else "1.00x"
        rows.append(f"| {preset} | {setting} | {med('requests_per_s'):.1f} | {med('latency_p50_ms'):.1f} / "
                    f"{med('latency_p99_ms'):.1f} | {overhead} | {versus} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser("serve-bench", __doc__)
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=["tiny", "small", "pi05"],
                        help="model shapes (random weights)")
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 2, 4, 8], help="client counts")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per setting and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each figure is the median over them")
    parser.add_argument("--rate-hz", type=float, default=0.0, help="each client's request rate; 0: back to back")
    parser.add_argument("--probe-rate-hz", type=float, default=2.0, help="the overhead probe's request rate")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES), help="weights dtype")
    parser.add_argument("--seed", type=int, default=0, help="random weights")
    parser.add_argument("--out", type=Path, default=Path("out/serve_bench"), help="folder for the table and JSON")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.clients) or args.seconds <= 0 or args.rounds < 1:
        parser.error("--clients must be >= 1, --seconds > 0, --rounds >= 1")
    out = claim_output_dir(args.out)
    records = [r for preset in args.presets for r in bench_preset(preset, args)]
    header = (f"oxygen-ros serve-bench on {cpu_model()}: DROID requests (2 x 224x224x3), {args.seconds:g} s per "
              f"setting, {args.rounds} rounds interleaved, clients back to back" +
              (f" at {args.rate_hz:g} Hz" if args.rate_hz else ""))
    text = f"{header}\n\n{table(records)}\n"
    (out / "serve_bench.md").write_text(text)
    (out / "serve_bench.json").write_text(json.dumps(records, indent=1))
    print(text)
    return 0
