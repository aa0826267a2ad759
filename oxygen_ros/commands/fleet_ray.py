"""`oxygen-ros fleet-ray`: the fleet as a pool of replicas on Ray Serve, robots placed by the fleet placement's MILP,
served over openpi's websocket protocol (docs/ray.md).

Without --address the command starts a local Ray of its own (one machine, stopped with the command); with
--address it joins a cluster started with `ray start --head` (and `ray start --address=...` on the other machines),
as Ray users run it, and leaves the cluster running when it stops.
"""

import logging
import signal
import threading

import ray

from ..command_line import CommandParser, port_number
from ..control.embodiment import load_embodiment
from ..scaleout.pool import PoolConfig, start_pool, stop_pool
from .serve import API_KEY_ENV, api_key


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser("fleet-ray", __doc__)
    parser.add_argument("--models", required=True,
                        help="served models, comma-separated id=source[:seed] (source: a preset, a config JSON, a "
                             "checkpoint folder or hub id), e.g. a=tiny:0,b=tiny:1")
    parser.add_argument("--embodiment", default="droid", help="the robots' profile (its openpi_keys): droid | aloha "
                                                              "| a profile YAML file")
    parser.add_argument("--replicas", type=int, default=2, help="replica slots (one per GPU, or per CPU slice)")
    parser.add_argument("--max-robots-per-replica", type=int, default=8, help="the placement's capacity of a replica")
    parser.add_argument("--threads", type=int, default=1, help="CPU cores of a replica (its intra-op threads)")
    parser.add_argument("--max-batch", type=int, default=8, help="frames of one model batched together")
    parser.add_argument("--address", help="an existing Ray cluster (ray start --head); default: a local Ray of its own")
    parser.add_argument("--host", default="127.0.0.1", help="interface of Serve's HTTP proxy (0.0.0.0: all; set an "
                                                            "API key then)")
    parser.add_argument("--port", type=port_number, default=8000, help="TCP port of Serve's HTTP proxy")
    parser.add_argument("--api-key", help=f"refuse connections without `Authorization: Api-Key <key>`; unset: "
                                          f"${API_KEY_ENV}, if set")
    args = parser.parse_args(argv)
    config = PoolConfig(tuple(m for m in args.models.split(",") if m), args.embodiment, args.replicas,
                        args.max_robots_per_replica, args.host, args.port, api_key(args.api_key), args.max_batch,
                        args.threads)  # ValueError (one line, before Ray starts) for a configuration no pool has
    load_embodiment(config.embodiment)  # an unknown profile: the same
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.address:
        ray.init(address=args.address, logging_level="WARNING")
    else:
        ray.init(num_cpus=max(args.replicas * args.threads, 1), include_dashboard=False, logging_level="WARNING")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        controller = start_pool(config)
        print(f"oxygen-ros fleet-ray: {args.replicas} replicas of {', '.join(config.models)} on "
              f"ws://{args.host}:{args.port}/robots/<robot_id>?model=<id>&rate_hz=<hz>&slo_ms=<ms> "
              f"({'API key required' if config.api_key else 'no API key'})", flush=True)
        stop.wait()
        print(f"oxygen-ros fleet-ray: stopping; {ray.get(controller.status.remote())['counts']}", flush=True)
        stop_pool(controller)
    finally:
        ray.shutdown()
    return 0
