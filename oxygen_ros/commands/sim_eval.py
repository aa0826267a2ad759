"""`oxygen-ros sim-eval CHECKPOINT [--path inproc|ros|serve]`: a trained policy on gym-aloha's transfer_cube in
closed loop, M seeded episodes whose seeds are not the training seeds, through one of three paths with the same
checkpoint and seeds:

- `inproc` (the upper bound): the model in this process; each chunk computed from the current camera frame(s) and
  joint state, its first `--execute` actions executed open loop, the sim waiting for each chunk;
- `ros`: `sim_node` + `vla_node` over DDS on sim time (`commands/sim_eval_ros.py`), the node's checks and the
  sim's hand-over (`--blending`) as a user runs them, the sim paced at `--sim-rate` whatever the policy does;
- `serve`: `oxygen-ros serve` and openpi-client's `WebsocketClientPolicy` + `ActionChunkBroker`, the request
  openpi's ALOHA sim example sends (`commands/sim_eval_serve.py`).

Each episode resets the sim with its seed (the cube pose, gym-aloha's sampler) and ends at gym-aloha's top reward
stage (success, as gym-aloha counts it) or its 300 steps. The evaluation seeds are the first M integers from
`--seed` that the training data did not use: a checkpoint trained on a `sim-record` dataset lists every seed that
dataset tried (its `training.json`, `sim_seeds`). It prints the success rate with a 95 % (Wilson) interval, how
many episodes reached each reward stage, the mean episode length, the control rate achieved (sim steps per second
of wall time) and the chunk latency, and writes `sim_eval.json` (every episode's seed, best stage and length) and
a contact sheet of the first success and of the first failure under `--out`. A checkpoint trained in another
embodiment than gym-aloha's (ALOHA) is refused in one line; an episode whose physics diverges is one line, counts
as a failure, and the evaluation goes on.

In process, with `--delay D` (control steps) and `--handover` the chunks arrive D steps after their frame while the robot goes on
executing (`sim/delayed_loop.py`): a new frame once the previous chunk arrived and `--execute` steps passed (0: as
soon as it arrived), the hand-over `newest_wins`, `temporal_ensemble`, `rtc` (the post-hoc blend) or `rtc_guided`
(each chunk sampled with real-time chunking's guidance toward the chunk being executed, `model/rtc.py`); the result
adds the switch discontinuity and the jerk of the commands. The serve path takes `--handover` too (not
`rtc_guided`, which samples with the model): the client then asks openpi-client for a chunk every `--execute` steps
and hands the chunks over itself, as a robot running ACT's temporal ensemble on a remote policy would, instead of
the example's `ActionChunkBroker`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..command_line import CommandParser, UsageError, progress
from ..control.chunk_executor import BLENDING_MODES
from ..control.embodiment import load_embodiment
from ..control.handover import RTC_GUIDED
from ..data.aloha import read_aloha
from ..data.episode import DataError
from ..model.checkpoint import load_checkpoint
from ..model.kv_cache import KVCache
from ..model.preprocess import Observation, prepare_inputs, robot_actions
from ..model.rtc import GUIDANCE, PREFIX, Committed, GuidedSampler
from ..model.tokenizer import load_tokenizer
from ..robots.rtc_guide import RtcGuide, RtcSettings
from ..sim.aloha_env import DT, MAX_EPISODE_STEPS, AlohaSimEnv, SimulationDiverged
from ..sim.delayed_loop import HANDOVERS, run_delayed
from ..sim.evaluation import episode_record, evaluation_seeds, percentiles_ms, report_lines, summarize
from .processes import add_user_domain_argument, child_env
from .sim_demo import contact_sheet, parameter_override
from .train_tiny import ALOHA_CAMERA_KEYS, INFO_FILE, TOKENIZER_FILE, predict_chunks

EMBODIMENTS = ("aloha", "aloha_sim")  # gym-aloha's ViperX pair: ALOHA's joints and units, delta or absolute joints
PATHS = ("inproc", "ros", "serve")


class CheckpointPolicy:
    """A checkpoint folder as a policy on the sim's observations: camera frames and qpos -> an absolute chunk."""

    def __init__(self, folder: str | Path, seed: int = 0, rtc: RtcSettings | None = None):
        """`rtc`: sample chunks asked with a previous one (`chunk(..., previous=)`) with real-time chunking."""
        folder = Path(folder)
        loaded = load_checkpoint(folder)
        trained = loaded.trained_on.embodiment or EMBODIMENTS[0]
        if trained not in EMBODIMENTS:
            raise DataError(f"{folder}: trained in embodiment {trained!r}, the sim is ALOHA "
                            f"({' or '.join(map(repr, EMBODIMENTS))})")
        self.model, self.stats, self.seed = loaded.model, loaded.norm_stats, seed
        self.tokenizer = load_tokenizer(folder / TOKENIZER_FILE)
        self.embodiment = load_embodiment(trained)  # every path runs the checkpoint in the profile it learned
        info = json.loads((folder / INFO_FILE).read_text()) if (folder / INFO_FILE).is_file() else {}
        self.cameras = {cam: tuple(size) for cam, size in (info.get("cameras") or {"top": (240, 320)}).items()}
        unknown = [cam for cam in self.cameras if ALOHA_CAMERA_KEYS.get(cam) not in self.model.config.camera_names]
        if unknown:
            raise DataError(f"{folder}: cameras {unknown} do not map to the model's image keys")
        self.training_seeds = {int(s) for s in info.get("sim_seeds", [])}
        self.calls = 0
        self.seconds: list[float] = []  # each chunk's wall time (preprocessing and model)
        self.guide = self.sampler = None
        if rtc is not None:
            cfg = self.model.config
            config = rtc.config(cfg.action_horizon)
            self.guide = RtcGuide(config, 1, cfg.action_horizon, cfg.action_horizon, cfg.action_dim, self.embodiment,
                                  self.stats)
            self.sampler = GuidedSampler(config)

    def chunk(self, images: dict[str, np.ndarray], qpos: np.ndarray, task: str,
              previous: tuple[int, int] | None = None) -> np.ndarray:
        """[horizon, 14] absolute joint targets for this frame; `previous`: (the steps of the chunk being executed
        already past at this frame, the delay), to guide this chunk toward the rest of it (with `rtc`)."""
        started = time.perf_counter()
        state = self.embodiment.state_to_model(qpos[None])[0]
        observation = Observation(images={ALOHA_CAMERA_KEYS[cam]: images[cam] for cam in self.cameras},
                                  state=state, task=task)
        inputs = prepare_inputs([observation], self.model.config, self.tokenizer, self.stats)
        self.calls += 1
        if self.guide is None:
            positions = predict_chunks(self.model, inputs, self.stats, self.embodiment, qpos[None], len(qpos),
                                       self.seed + self.calls)[0][0]
        else:
            positions = self._guided(inputs, qpos, state, previous)
        self.seconds.append(time.perf_counter() - started)
        return positions

    def _guided(self, inputs, qpos: np.ndarray, state: np.ndarray, previous: tuple[int, int] | None) -> np.ndarray:
        """`predict_chunks` (the same noise) through the guided sampler, the chunk kept as the one executed next."""
        cfg, model = self.model.config, self.model
        cache = KVCache(cfg, 1, cfg.prefix_len, model.dtype)
        slots = torch.arange(1)
        model.prefill(inputs, cache, slots)
        noise = torch.randn(1, cfg.action_horizon, cfg.action_dim,
                            generator=torch.Generator().manual_seed(self.seed + self.calls))
        request = None if previous is None else self.guide.request_at(*previous, state)
        actions = self.sampler.sample(model, cache, slots, noise, [request if isinstance(request, Committed)
                                                                   else None])
        self.guide.executing(actions[0], 0, state)
        robot = robot_actions(actions, len(qpos), self.stats)
        return self.embodiment.actions_to_robot(robot, qpos[None]).positions[0]


def run_episode(env: AlohaSimEnv, policy: CheckpointPolicy, seed: int, execute: int, frames: list | None = None
                ) -> dict:
    """One seeded episode, ended at success or gym-aloha's time limit; its best reward stage, whether it succeeded,
    and at which step. `frames`, when given, gets each step's camera images."""
    observation = env.reset(seed)
    succeeded_at, diverged = None, False
    try:
        while succeeded_at is None and env.steps < env.max_steps:
            for action in policy.chunk(observation.images, observation.qpos, env.instruction)[:execute]:
                if frames is not None:
                    frames.append(observation.images)
                result = env.step(action)
                observation = result.observation
                if result.success:
                    succeeded_at = env.steps
                if result.success or result.truncated:
                    break
    except SimulationDiverged as err:
        print(f"sim-eval: seed {seed}: {err}; counted as a failure", file=sys.stderr)
        diverged = True
    return episode_record(env, seed, succeeded_at, diverged)


def run_delayed_episode(env: AlohaSimEnv, policy: CheckpointPolicy, seed: int, execute: int, delay: int,
                        handover: str) -> dict:
    """`run_episode` with chunks arriving `delay` steps after their frame (`sim/delayed_loop.py`), and smoothness."""
    observation = env.reset(seed)
    try:
        done = run_delayed(env, observation, policy, delay, execute, handover, DT)
    except SimulationDiverged as err:
        print(f"sim-eval: seed {seed}: {err}; counted as a failure", file=sys.stderr)
        return {"seed": seed, "max_reward": env.episode_max_reward, "success": False, "success_step": None,
                "steps": env.steps, "diverged": True, "smoothness": None}
    return {"seed": seed, "max_reward": env.episode_max_reward, "success": done.success_step is not None,
            "success_step": done.success_step, "steps": done.steps, "diverged": False, "smoothness": done.stats}


def checkpoint_env(policy: CheckpointPolicy, max_steps: int) -> AlohaSimEnv:
    """The sim rendering the checkpoint's cameras at the size it was trained on."""
    height, width = image_size(policy)
    return AlohaSimEnv("transfer_cube", cameras=list(policy.cameras), height=height, width=width, max_steps=max_steps)


def image_size(policy: CheckpointPolicy) -> tuple[int, int]:
    sizes = set(policy.cameras.values())
    if len(sizes) != 1:
        raise DataError(f"the checkpoint's cameras have different image sizes {policy.cameras}")
    return sizes.pop()


class Examples:
    """The frames of the first success and the first failure, for the contact sheets."""

    def __init__(self):
        self.kept: dict[bool, tuple[int, list]] = {}

    def wants(self) -> bool:
        return len(self.kept) < 2

    def offer(self, record: dict, frames: list) -> None:
        if frames and record["success"] not in self.kept:
            self.kept[record["success"]] = (record["seed"], frames)

    def write(self, out: Path) -> list[Path]:
        written = []
        for success, (seed, frames) in sorted(self.kept.items()):
            images = {cam: np.stack([f[cam] for f in frames]) for cam in frames[0]}
            written.append(contact_sheet(images, out / f"contact_{'success' if success else 'failure'}_seed{seed}.png",
                                         1 / DT))
        return written


def evaluate_in_process(policy: CheckpointPolicy, seeds: list[int], execute: int, max_steps: int,
                        examples: Examples, delay: int = 0, handover: str | None = None) -> dict:
    env = checkpoint_env(policy, max_steps)
    started = time.monotonic()
    episodes = []
    try:
        for seed in progress(seeds, desc="sim-eval"):
            frames = [] if examples.wants() and handover is None else None
            episodes.append(run_episode(env, policy, seed, execute, frames) if handover is None else
                            run_delayed_episode(env, policy, seed, execute, delay, handover))
            examples.offer(episodes[-1], frames)
    finally:
        env.close()
    wall = time.monotonic() - started
    return {**summarize(episodes), "control_rate_hz": sum(e["steps"] for e in episodes) / wall,
            "chunk_ms": {**percentiles_ms(policy.seconds), "what": "preprocessing and model, in process"},
            "execute": execute, "wall_seconds": wall,
            **({} if handover is None else smoothness(episodes, delay, handover))}


def evaluate_serve(checkpoint: str, policy: CheckpointPolicy, seeds: list[int], execute: int, max_steps: int,
                   out: Path, examples: Examples, delay: int = 0, handover: str | None = None) -> dict:
    from openpi_client.action_chunk_broker import ActionChunkBroker
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from . import sim_eval_serve as serve

    if list(policy.cameras) != ["top"]:
        raise DataError(f"the serve path sends openpi's ALOHA sim request (the top camera as cam_high); the "
                        f"checkpoint takes {list(policy.cameras)}")
    server = serve.ServeChild(serve.serve_arguments(checkpoint, policy.embodiment.name), child_env(), out / "serve.log")
    env = checkpoint_env(policy, max_steps)
    try:
        client = serve.TimedPolicy(WebsocketClientPolicy("127.0.0.1", server.wait_ready()))
        # openpi's example executes each chunk's first `execute` actions; with a hand-over the client blends them
        broker = ActionChunkBroker(client, action_horizon=execute) if handover is None else None
        chunks = serve.ServedChunks(client)
        started = time.monotonic()
        episodes = []
        for seed in progress(seeds, desc="sim-eval serve"):
            frames = [] if examples.wants() and handover is None else None
            episodes.append(serve.run_episode(env, broker, seed, frames=frames) if handover is None else
                            run_delayed_episode(env, chunks, seed, execute, delay, handover))
            examples.offer(episodes[-1], frames)
        wall = time.monotonic() - started
    finally:
        env.close()
        server.close()
    return {**summarize(episodes), "control_rate_hz": sum(e["steps"] for e in episodes) / wall,
            "chunk_ms": {**percentiles_ms(client.seconds), "what": "openpi-client round trip"},
            "execute": execute, "wall_seconds": wall,
            **({} if handover is None else smoothness(episodes, delay, handover))}


def evaluate_ros(checkpoint: str, policy: CheckpointPolicy, seeds: list[int], args, out: Path) -> dict:
    from . import sim_eval_ros as ros

    started = time.monotonic()
    policy_rate = args.policy_rate or 1.0 / (policy.model.config.action_horizon * DT)  # 0: each chunk runs whole
    run = ros.evaluate(checkpoint, seeds, list(policy.cameras), image_size(policy), args.blending, policy_rate,
                       args.sim_rate, args.steps, out, [f"embodiment:={policy.embodiment.name}", *args.policy_param],
                       args.user_domain, args.policy, args.inject_delay)
    summary = run["summary"]
    latency = summary["chunk_latency_steps"]
    result = {**summarize(run["episodes"]), "control_rate_hz": summary["step"] / summary["wall_s"],
              "chunk_ms": {"p50": latency["median"] * DT * 1e3, "p99": latency["max"] * DT * 1e3,
                           "count": latency["count"], "what": "sim time from the source frame to arrival; "
                                                              "p99 column is the max"},
              "chunk_latency_steps": latency, "blending": args.blending, "inject_delay_steps": args.inject_delay,
              "policy_rate_hz": policy_rate,
              "switch_discontinuity": summary["switch_discontinuity"], "jerk_rms": summary["jerk_rms"],
              "chunks_accepted": summary["chunks_accepted"], "chunks_rejected": summary["chunks_rejected"],
              "held_steps": summary["held_steps"], "wall_seconds": time.monotonic() - started}
    examples = {}
    for path, record in zip(summary["episodes_written"], result["episodes"]):
        if record["success"] not in examples:
            examples[record["success"]] = (record["seed"], path)
    result["contact_sheets"] = []
    for success, (seed, path) in sorted(examples.items()):
        episode = read_aloha(path)
        sheet = out / f"contact_{'success' if success else 'failure'}_seed{seed}.png"
        result["contact_sheets"].append(str(contact_sheet(episode.images, sheet, episode.fps)))
    return result


def smoothness(episodes: list[dict], delay: int, handover: str) -> dict:
    """Over the episodes that ran: the switch discontinuity (mean and max, rad), the jerk (mean of each episode's
    RMS, rad/s^3) and the held steps (no chunk covered them)."""
    stats = [e["smoothness"] for e in episodes if e["smoothness"] is not None]
    jumps = [s["switch_discontinuity"] for s in stats if s["switch_discontinuity"]["count"]]
    return {"delay": delay, "handover": handover,
            "discontinuity_mean": float(np.mean([j["mean"] for j in jumps])) if jumps else None,
            "discontinuity_max": float(max(j["max"] for j in jumps)) if jumps else None,
            "jerk_rms": float(np.mean([s["jerk_rms"] for s in stats])) if stats else None,
            "held_steps": int(sum(s["held_steps"] for s in stats)),
            "chunks_rejected": int(sum(s["chunks_rejected"] for s in stats))}


def build_parser() -> CommandParser:
    parser = CommandParser("sim-eval", __doc__)
    parser.add_argument("checkpoint", help="checkpoint folder (train-tiny's, with training.json)")
    parser.add_argument("--path", choices=PATHS, default="inproc",
                        help="inproc: the model in this process; ros: sim_node + vla_node over DDS; serve: "
                        "oxygen-ros serve and openpi-client")
    parser.add_argument("--episodes", type=int, default=50, help="evaluation episodes")
    parser.add_argument("--seed", type=int, default=100_000, help="the first evaluation seed")
    parser.add_argument("--execute", type=int, default=0,
                        help="inproc and serve: actions executed per chunk (0: the whole chunk)")
    parser.add_argument("--steps", type=int, default=MAX_EPISODE_STEPS, help="steps per episode (50 Hz)")
    parser.add_argument("--blending", choices=BLENDING_MODES, default="newest_wins",
                        help="ros: sim_node's hand-over (docs/sim.md says why newest_wins)")
    parser.add_argument("--inject-delay", type=int, default=0, metavar="STEPS",
                        help="ros: sim_node publishes each frame this many steps late (inject_delay_steps)")
    parser.add_argument("--policy-rate", type=float, default=0.0,
                        help="ros: the VLA node's control.rate_hz (0: one chunk per chunk span, so each runs whole "
                             "as --execute 0 does in process: 1 Hz for 50-step chunks at 50 Hz)")
    parser.add_argument("--sim-rate", type=float, default=50.0,
                        help="ros: sim_node's wall-clock pacing (rate_hz; 0: as fast as it goes)")
    parser.add_argument("--policy", default="oxygen_ros.nodes.vla_node",
                        help="ros: the policy node (a module run with -m or a .py script speaking the sim's topics)")
    parser.add_argument("--policy-param", nargs="*", default=[], type=parameter_override, metavar="NAME:=VALUE",
                        help="ros: more VLA node parameters (YAML values)")
    parser.add_argument("--delay", type=int, default=0,
                        help="inproc and serve: control steps between a frame and its chunk's arrival (with "
                             "--handover)")
    parser.add_argument("--handover", choices=HANDOVERS,
                        help="inproc and serve: a new frame every --execute steps, its chunk arriving --delay steps "
                             "late while the robot executes, handed over so (default: none, each chunk executed at "
                             "once, open loop; serve: openpi-client's ActionChunkBroker)")
    parser.add_argument("--rtc-method", choices=(GUIDANCE, PREFIX), default=GUIDANCE,
                        help="with --handover rtc_guided: guidance (inpainting, any checkpoint) or prefix (a "
                             "checkpoint trained with train-tiny --rtc-max-delay)")
    parser.add_argument("--out", default="out/sim_eval", help="folder for sim_eval.json and the contact sheets")
    add_user_domain_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (args.episodes <= 0 or args.steps <= 0
            or min(args.execute, args.policy_rate, args.sim_rate, args.inject_delay, args.delay) < 0):
        raise UsageError("--episodes and --steps must be positive, --execute, --policy-rate, --sim-rate, "
                         "--inject-delay and --delay not negative")
    if args.delay and args.handover is None:
        raise UsageError("--delay needs --handover")
    if args.handover == RTC_GUIDED and args.path == "serve":
        raise UsageError("--handover rtc_guided samples with the model in this process; the serve path takes "
                         "newest_wins, temporal_ensemble or rtc")
    if args.handover is not None and args.path == "ros":
        raise UsageError("--delay and --handover are for the in-process and serve paths; the ros path takes "
                         "--inject-delay and --blending")
    torch.set_num_threads(1)
    out = Path(args.out)
    try:
        rtc = RtcSettings(method=args.rtc_method) if args.handover == "rtc_guided" else None
        policy = CheckpointPolicy(args.checkpoint, rtc=rtc)
        horizon = policy.model.config.action_horizon
        execute = min(args.execute or horizon, horizon) if args.handover is None else max(args.execute, 1)
        seeds = evaluation_seeds(args.seed, args.episodes, policy.training_seeds)
        out.mkdir(parents=True, exist_ok=True)
        examples = Examples()
        if args.path == "inproc":
            result = evaluate_in_process(policy, seeds, execute, args.steps, examples, args.delay, args.handover)
            if policy.guide is not None:  # frames guided, and the plain ones by reason
                result["rtc"] = {k: v for k, v in policy.guide.counts().items() if k != "rtc_delay_steps"}
                result["rtc_method"] = args.rtc_method
        elif args.path == "serve":
            result = evaluate_serve(args.checkpoint, policy, seeds, execute, args.steps, out, examples, args.delay,
                                    args.handover)
        else:
            result = evaluate_ros(args.checkpoint, policy, seeds, args, out)
        result.setdefault("contact_sheets", [str(p) for p in examples.write(out)])
    except (DataError, OSError, ValueError, RuntimeError) as err:
        print(f"sim-eval failed: {err}", file=sys.stderr)
        return 1
    result.update(path=args.path, checkpoint=str(args.checkpoint), training_seeds_avoided=len(policy.training_seeds))
    (out / "sim_eval.json").write_text(json.dumps(result, indent=1) + "\n")
    for line in report_lines(result, args.path):
        print(line)
    print(f"  {len(policy.training_seeds)} training seeds avoided; {result['wall_seconds']:.0f} s wall; wrote "
          f"{out / 'sim_eval.json'}" + "".join(f", {p}" for p in result["contact_sheets"]))
    if args.handover is not None:
        jump, most, jerk = result["discontinuity_mean"], result["discontinuity_max"], result["jerk_rms"]
        shown = "-" if jump is None else f"{jump:.4f} (max {most:.4f})"
        print(f"  {args.handover}, delay {args.delay}: switch discontinuity {shown} rad, jerk RMS "
              f"{'-' if jerk is None else f'{jerk:.0f}'} rad/s^3, {result['held_steps']} held steps, "
              f"{result['chunks_rejected']} chunks arrived past their end")
        if "rtc" in result:
            print(f"  real-time chunking: {', '.join(f'{k} {v}' for k, v in result['rtc'].items() if v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
