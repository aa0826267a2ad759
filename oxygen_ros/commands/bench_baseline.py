"""The openpi-style baseline of `oxygen-ros serve-bench` in a process of its own: the same request read and acted
on with the engine, one at a time (batch 1), on the same weights as the benchmark's server.

`python -m oxygen_ros.commands.bench_baseline PRESET DTYPE SEED SECONDS` acts for SECONDS after a warm-up and prints
one JSON object (requests per second, latency p50 / p99, this process's id and OpenMP settings). One thread runs
torch here, as in openpi's server, so libgomp's own waits are its best (its threads spin between operators): the
parent leaves its own OpenMP settings (`oxygen_ros/openmp.py`) out of this process's environment. Measured on the
tiny preset: 8 ms an act with libgomp's own waits, about 10 ms with short spins, about 38 ms with sleeping waits.
"""

from __future__ import annotations

import json
import os
import sys

from ..openmp import SPIN_VARIABLE, VARIABLE
from ..serving.server import ServeConfig
from .serve import Capacity, build_server
from .serve_bench import DTYPES, bench_parameters, sequential_loop


def main(argv: list[str] | None = None) -> int:
    preset, dtype, seed, seconds = sys.argv[1:] if argv is None else argv
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
