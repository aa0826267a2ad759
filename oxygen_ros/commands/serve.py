"""`oxygen-ros serve`: the engine behind openpi's remote-inference protocol (docs/serve.md).

Robot code written for openpi's `serve_policy.py` (DROID's control laptop, ALOHA's real env, a LIBERO loop) keeps
its `openpi-client` and its observation dicts and points them here: one prefill per request, requests of several
robots batched on one device, and narration as an extra.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..command_line import CommandParser, existing_file, port_number, positive_float
from ..control.embodiment import load_embodiment
from ..fleet.models import ModelSpec
from ..fleet.server import ServedRobot
from ..robots.command_path import CommandPath
from ..robots.engine import build_fleet, check_device, checkpoint_source, embodiment_fit
from ..robots.engine_params import ParameterError, read_engine
from ..robots.output_params import command_path
from ..robots.session import RobotSession
from ..serving.client import API_KEY_ENV
from ..serving.params import ACTION_NAMES, engine_parameters
from ..serving.requests import RequestReader
from ..serving.server import OpenpiServer, ServeConfig

MODEL_ID = "policy"
log = logging.getLogger("oxygen_ros.serve")


@dataclass(frozen=True)
class Capacity:
    """How many clients, how big a batch, how long a request may wait."""

    max_clients: int = 16
    max_batch: int = 8
    slo_s: float = 1.0


def build_server(p: dict[str, Any], config: ServeConfig, capacity: Capacity) -> OpenpiServer:
    """The server the engine parameters `p` (`params.engine_parameters`) describe, not started; ValueError (or
    OSError for an unreadable file) with the reason otherwise."""
    e = read_engine(p)
    if capacity.max_clients < 1 or capacity.slo_s <= 0:
        raise ValueError("--max-clients must be >= 1 and --slo-ms > 0")
    if e.text_head != "auto":
        raise ValueError("model.text_head: serve loads a checkpoint's text head as the stack that wrote it (auto)")
    embodiment = load_embodiment(e.embodiment_name)
    action_names = p[ACTION_NAMES]
    if action_names is not None and embodiment.kinds is not None and len(action_names) != len(embodiment.kinds):
        raise ValueError(f"embodiment {embodiment.name} has {len(embodiment.kinds)} action dims, "
                         f"{ACTION_NAMES} has {len(action_names)}")
    path_of = reply_limits(p, embodiment, e)
    check_device(e.device)
    source, _, tokenizer, _ = checkpoint_source(e)  # a folder or a hub id with its tokenizer, as the node finds them
    robots = [ServedRobot(f"client{i}", MODEL_ID, capacity.slo_s) for i in range(capacity.max_clients)]
    holder: dict[str, OpenpiServer] = {}
    fleet = build_fleet(e, [ModelSpec(MODEL_ID, source, e.seed, e.norm_stats, e.norm_mode)], robots,
                        device=e.device, max_batch=capacity.max_batch, queue="esf",
                        pool_slots=capacity.max_batch + max(1, e.pool_slots - 1), stream_every=0,
                        tokenizer=tokenizer, choose_dtype=True,
                        rtc=config.rtc.engine_config(),  # for the requests that ask for real-time chunking
                        on_chunk=lambda chunk: holder["server"].on_chunk(chunk),
                        on_text=lambda update: holder["server"].on_text(update), publish_late=True)
    try:
        warning = embodiment_fit(embodiment, fleet.trained_on[MODEL_ID], action_names or (), e.embodiment_override,
                                 "the model")
    except ParameterError:
        fleet.close()
        raise
    if warning:
        log.warning(f"{warning} (serving: embodiment_override is true)")
    model = fleet.model_config(robots[0].robot_id)
    reader = RequestReader(embodiment, (model.action_horizon, model.action_dim), e.max_pixels,
                           e.default_instruction)
    keys = embodiment.openpi_keys
    metadata = {**keys.metadata, "server": "oxygen-ros serve", "version": __version__, "embodiment": embodiment.name,
                "action_horizon": model.action_horizon, "state_keys": [k for k, _ in keys.state],
                "image_keys": [k for k, _ in keys.images], "narration": True}
    width = len(embodiment.kinds) if embodiment.kinds is not None else len(action_names or ()) or None
    if width is not None:
        metadata["action_dim"] = width
    config = dataclasses.replace(config, action_dims=width)
    session = RobotSession(fleet.runtime, embodiment, None, width or 0, MODEL_ID)  # prompts come with requests
    holder["server"] = server = OpenpiServer(fleet, session, reader, config, metadata, path_of)
    return server


def reply_limits(p: dict[str, Any], embodiment, e) -> Callable[[], CommandPath] | None:
    """With output groups given (`output.groups`, their joints' limits or `robot_description`): what makes each
    client's command path, checked now; None without (openpi clients often have no limits to give)."""
    if p["output.groups"] is None:
        return None
    names = p[ACTION_NAMES]
    if names is None:
        raise ValueError(f"output.groups: the groups' joints are named in {ACTION_NAMES}; set it")
    if embodiment.has_velocity:
        raise ValueError(f"output.groups: embodiment {embodiment.name}'s replies hold velocities; serve applies "
                         "joint limits to position replies only")
    step_s = embodiment.time_step or e.period_s

    def path_of() -> CommandPath:
        return command_path(p, tuple(names), embodiment, step_s)

    path_of()  # a group or a limit that does not fit is a start-up error
    return path_of


def api_key(given: str | None) -> str | None:
    """The key every connection must carry: `--api-key`, else the environment's $OXYGEN_ROS_API_KEY (so that the key
    need not stand in the process's command line); None (no key) when neither is set or both are empty."""
    return given or os.environ.get(API_KEY_ENV) or None


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser("serve", __doc__)
    parser.add_argument("--params-file", action="append", type=existing_file, default=[],
                        help="a VLA node parameter file (config/aloha.yaml, config/droid.yaml): the engine's options "
                             "(model.*, embodiment, language.*, control.denoise_steps, instruction.default, "
                             "cameras.max_pixels); repeat for several, later ones win")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help="one engine option on top of the files, e.g. model.dtype=float32")
    parser.add_argument("--preset", help="random-init model shape (tiny | small | pi05): model.preset")
    parser.add_argument("--checkpoint", help="pi05 checkpoint folder or hub id: model.checkpoint")
    parser.add_argument("--tokenizer", help="the checkpoint's tokenizer, if it does not carry or name one (a file, a "
                                            "folder or a hub id): model.tokenizer")
    parser.add_argument("--norm-stats", help="the robot's own dataset stats replacing the checkpoint's (LeRobot's "
                                             "meta/stats.json or openpi's norm_stats.json): model.norm_stats")
    parser.add_argument("--embodiment", help="absolute | aloha | droid | a profile YAML file (its openpi_keys name "
                                             "the observation keys): embodiment")
    parser.add_argument("--seed", type=int, help="random weights of a preset and the default noise: model.seed")
    parser.add_argument("--device", help="auto | cpu | cuda: model.device")
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to listen on; 0.0.0.0 serves every interface (set an API key then)")
    parser.add_argument("--port", type=port_number, default=8000, help="TCP port (0: any free one, printed)")
    parser.add_argument("--api-key", help=f"refuse connections without `Authorization: Api-Key <key>` "
                                          f"(openpi-client's api_key=); unset: ${API_KEY_ENV}, if set")
    parser.add_argument("--max-clients", type=int, default=Capacity.max_clients,
                        help="connections served at once; more are refused (HTTP 503)")
    parser.add_argument("--max-batch", type=int, default=Capacity.max_batch,
                        help="requests of different clients batched together (a power of two)")
    parser.add_argument("--slo-ms", type=float, default=Capacity.slo_s * 1e3,
                        help="a request waiting longer than this for the model is refused as expired; one computed "
                             "later is sent, marked deadline_missed")
    parser.add_argument("--max-message-mb", type=positive_float, default=32.0,
                        help="larger messages close their connection (code 1009)")
    parser.add_argument("--idle-timeout-s", type=positive_float, default=ServeConfig.idle_timeout_s,
                        help="a connection that sends no request for this long is closed, freeing its slot")
    args = parser.parse_args(argv)
    args.api_key = api_key(args.api_key)
    shorthands = {"preset": "model.preset", "checkpoint": "model.checkpoint", "tokenizer": "model.tokenizer",
                  "norm_stats": "model.norm_stats", "embodiment": "embodiment", "seed": "model.seed", "device": "model.device"}
    overrides = args.param + [f"{name}={getattr(args, flag)}" for flag, name in shorthands.items()
                              if getattr(args, flag) is not None]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)
    p = engine_parameters(args.params_file, overrides)
    server = build_server(p, ServeConfig(args.host, args.port, args.api_key, int(args.max_message_mb * 2**20),
                                         idle_timeout_s=args.idle_timeout_s),
                          Capacity(args.max_clients, args.max_batch, args.slo_ms / 1e3))
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    try:
        source = p["model.checkpoint"] or f"preset {p['model.preset']}"
        print(f"oxygen-ros serve: {source}, embodiment {server.embodiment.name}, on ws://{args.host}:{server.port} "
              f"({'API key required' if args.api_key else 'no API key'}; up to {args.max_clients} clients, batches "
              f"of {args.max_batch}, cpu kernel {server.fleet.cpu_kernel[MODEL_ID]})", flush=True)
        if not args.api_key and args.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning(f"serving {args.host} without an API key: anyone who reaches this port can drive the model "
                        f"(--api-key or ${API_KEY_ENV})")
        stop.wait()
    finally:
        server.close()
    log.info(f"stopped after {server.served} replies; refused {dict(server.refused) or 'none'}")
    return 0
