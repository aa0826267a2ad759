"""The openpi-style baseline of `oxygen-ros serve-bench` in a process of its own: the same request read and acted
on with the engine, one at a time (batch 1), on the same weights as the benchmark's server.

`python -m oxygen_ros.commands.bench_baseline PRESET DTYPE SEED SECONDS` acts for SECONDS after a warm-up and prints
one JSON object (requests per second, latency p50 / p99, this process's id and OpenMP settings). One thread runs torch here, so OpenMP's threads spin
briefly between operators (`oxygen_ros/openmp.py`, as the nodes and benchmarks run); the parent leaves its own
wait policy out of this process's environment.
"""

from __future__ import annotations

import json
import os
import sys

from oxygen_ros.openmp import SPIN_VARIABLE, VARIABLE, prefer_short_spins


def main(argv: list[str] | None = None) -> int:
    preset, dtype, seed, seconds = sys.argv[1:] if argv is None else argv
    prefer_short_spins()  # before torch is imported
    from oxygen_ros.commands.serve import Capacity, build_server
    from oxygen_ros.commands.serve_bench import DTYPES, bench_parameters, sequential_loop
    from oxygen_ros.serving.server import ServeConfig

    server = build_server(bench_parameters(preset, dtype, int(seed)), ServeConfig(port=0), Capacity(1, 1, 60.0))
    try:
        figures = sequential_loop(server, preset, DTYPES[dtype], int(seed), float(seconds))
    finally:
        server.close()
    figures.update(pid=os.getpid(), openmp={name: os.environ.get(name) for name in (VARIABLE, SPIN_VARIABLE)})
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
