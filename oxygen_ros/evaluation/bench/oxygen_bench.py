"""The OxyGen benchmark matrix: five settings side by side on one model, over decode length, k, denoise steps and
arrival pattern. Writes results.json (one record per setting and sweep point), results.md and PNG plots.

Every point runs all its settings back to back in this process on the same weights and frames, so ratios are
measured side by side; absolute times on a CPU are only a compass.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ...command_line import CommandParser, progress
from ...engine.frames import deadline_missed
from ...engine.stats import percentile, percentile_ms
from ...model import cpu_kernel
from ...model.config import PRESETS, Pi05Config, get_preset
from ...model.loading import build_on_device
from ...model.precision import DTYPE_NAMES, default_dtype, resolve_dtype
from .energy import EnergyMeter, cuda_uuid, open_energy_meter, per_unit
from .modes import OVERLAP, RUNNERS, SETTINGS, SettingRun, Workload
from .part_threads import ALL_THREADS, PartThreads, probe
from .workloads import arrivals, synthetic_frames

MB = 2**20
DEFAULT_K = 4  # decode steps per frame for continuous batching unless a sweep varies it


@dataclass(frozen=True)
class SweepPoint:
    sweep: str
    decode_len: int
    tokens_per_frame: int | str  # an int, or "adaptive"
    num_steps: int
    arrival: str
    settings: tuple[str, ...]
    steady_state: bool = False  # adaptive k: warm up for a whole request's life at the floor's steps per frame


NARRATED = ("continuous_batching", OVERLAP)
# The goal point's settings in their running order: action_only sits between the two narrated settings, so each
# ratio the goal judges is of two runs next to each other in time; `run_point` reverses the order every other round.
GOAL_SETTINGS = ("baseline", "continuous_batching", "action_only", OVERLAP)


def matrix(quick: bool, goals: bool = False) -> list[SweepPoint]:
    if goals:
        # 50 tokens a request, one request a frame, frames back to back as in action_only; k = 1: each frame owes
        # one decode step, one token for every request in flight, which is what keeps such text up
        # and as a robot's timer runs it: adaptive k at the control period, text in the slack and the floor
        return [SweepPoint("goals", 50, 1, 10, "every_frame", GOAL_SETTINGS, steady_state=True),
                SweepPoint("goals_timer", 50, "adaptive", 10, "every_frame", NARRATED, steady_state=True)]
    everything = SETTINGS
    if quick:
        points = [SweepPoint("decode_len", n, DEFAULT_K, 10, "every_frame", everything) for n in (10, 50, 200)]
        points += [SweepPoint("tokens_per_frame", 50, k, 10, "every_frame", ("continuous_batching",))
                   for k in (1, "adaptive")]
        points += [SweepPoint("arrival", 50, DEFAULT_K, 10, "burst", ("baseline", "continuous_batching"))]
        return points
    points = [SweepPoint("decode_len", n, DEFAULT_K, 10, "every_frame", everything) for n in (10, 25, 50, 100, 200)]
    # adaptive k against decode length: the action rate should stay put while the text gets longer
    points += [SweepPoint("decode_len_adaptive", n, "adaptive", 10, "every_frame", ("continuous_batching",))
               for n in (10, 50, 200)]
    points += [SweepPoint("num_steps", 50, DEFAULT_K, 5, "every_frame", everything)]
    points += [SweepPoint("tokens_per_frame", 50, k, 10, "every_frame", ("continuous_batching",))
               for k in (1, 2, 8, 16, "adaptive")]
    points += [SweepPoint("arrival", 50, DEFAULT_K, 10, a, ("baseline", "shared_kv", "continuous_batching"))
               for a in ("every_4", "burst")]
    return points


def summarize(runs: list[SettingRun], workload: Workload, model_bytes: int) -> dict:
    """One record from the rounds of one setting at one point (rounds interleave settings against noise)."""
    elapsed = sum(run.elapsed_s for run in runs)
    frames = sum(len(run.action_done_s) for run in runs)
    tokens = sum(run.tokens_generated for run in runs)
    energy = None if any(run.energy_j is None for run in runs) else sum(run.energy_j for run in runs)
    latencies = [x for run in runs for x in run.action_latency_s]
    misses = 0
    completion = []
    for run in runs:
        # frames follow each other, so a chunk is due one control period after the previous one: a miss means the
        # arm waited longer than that for its next chunk
        done = run.action_done_s
        misses += sum(deadline_missed(b, a + workload.control_period_s) for a, b in zip([0.0] + done[:-1], done))
        completion += run.completion_s
    copies = 2 if runs[0].setting == "parallel" else 1  # the parallel setting holds a second model copy
    round_hz = [len(run.action_done_s) / run.elapsed_s if run.elapsed_s > 0 else float("nan") for run in runs]
    return {
        "setting": runs[0].setting,
        "frames": frames,
        "rounds": len(runs),
        "action_hz": frames / elapsed,
        "round_action_hz": round_hz,  # round by round, in the order they ran
        "action_latency_p50_ms": percentile_ms(latencies, 0.5, float("nan")),
        "action_latency_p99_ms": percentile_ms(latencies, 0.99, float("nan")),
        "deadline_misses": misses,
        "tokens_per_s": tokens / elapsed,
        "requests_finished": len(completion),
        "request_completion_p50_ms": percentile_ms(completion, 0.5, float("nan")),
        "peak_memory_mb": (copies * model_bytes + runs[0].pool_bytes) / MB,
        "kv_pool_mb": runs[0].pool_bytes / MB,
        "floor_steps": sum(run.floor_steps for run in runs),
        "requests_dropped": sum(run.requests_dropped for run in runs),
        "floor_action_s": sum(run.floor_action_s for run in runs),
        **per_unit(energy, frames, tokens),
    }


def run_point(model, config: Pi05Config, point: SweepPoint, frames: int, control_period_s: float, seed: int,
              device: str, rounds: int, energy: EnergyMeter | None = None, min_steps: int = 1,
              overlap_threads: int = 1, part_threads: PartThreads = ALL_THREADS) -> list[dict]:
    """Every setting of `point`, rounds interleaved (the order reversed every other round, so a drift in the
    machine's speed over the run weighs on every setting alike); adaptive k decodes at least `min_steps` steps a
    frame; `continuous_batching_overlap` decodes beside the denoising on `overlap_threads` threads; the sequential
    settings run an action frame's parts on `part_threads`."""
    k = point.tokens_per_frame
    adaptive = k == "adaptive"
    tokens_per_frame = 64 if adaptive else max(1, k)  # adaptive: a cap the slack never reaches
    # enough slots that no request is evicted: a request lives decode_len / k frames (at least one step a frame
    # when adaptive), plus the frame's own slot
    fewest_steps = 1 if adaptive else tokens_per_frame
    pool_slots = -(-point.decode_len // fewest_steps) + 2
    # continuous batching reaches steady state once the first request has finished: decode_len / k frames (adaptive
    # k: assumed 8 steps a frame, or the floor's steps when the point asks for steady state)
    steps_per_frame = (max(1, min_steps) if point.steady_state else 8) if adaptive else tokens_per_frame
    warmup = 2 + -(-point.decode_len // steps_per_frame)
    inputs, noises = synthetic_frames(config, warmup + frames, seed=seed, device=device, dtype=model.dtype)
    narrate = arrivals(point.arrival, warmup + frames)
    workload = Workload(inputs, noises, narrate, point.decode_len,
                        num_steps=point.num_steps, tokens_per_frame=tokens_per_frame, adaptive_k=adaptive,
                        min_steps_per_frame=min_steps, control_period_s=control_period_s, warmup_frames=warmup,
                        pool_slots=pool_slots, energy_j=energy.read_j if energy else None,
                        overlap_threads=overlap_threads, part_threads=part_threads)
    # Only continuous batching needs a long warm-up (its pool fills over decode_len / k frames); the others measure
    # the same last `frames` frames after a short one.
    short = warmup - 2
    quick_start = Workload(inputs[short:], noises[short:], narrate[short:], point.decode_len,
                           num_steps=point.num_steps, control_period_s=control_period_s, warmup_frames=2,
                           energy_j=energy.read_j if energy else None, part_threads=part_threads)
    model_bytes = model.memory_bytes()
    runs: dict[str, list[SettingRun]] = {setting: [] for setting in point.settings}
    cuda_peak: dict[str, float] = {}
    for r in range(rounds):  # settings interleaved round by round, so a burst of load hits them all alike
        for setting in point.settings if r % 2 == 0 else point.settings[::-1]:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            runs[setting].append(RUNNERS[setting](model, workload if setting.startswith("continuous_batching")
                                                  else quick_start))
            if device.startswith("cuda"):
                cuda_peak[setting] = max(cuda_peak.get(setting, 0.0), torch.cuda.max_memory_allocated() / MB)
    records = []
    for setting in point.settings:
        record = summarize(runs[setting], workload, model_bytes)
        if setting in cuda_peak:
            record["cuda_max_allocated_mb"] = cuda_peak[setting]
        record.update(sweep=point.sweep, decode_len=point.decode_len, tokens_per_frame=k,
                      denoise_steps=point.num_steps, arrival=point.arrival)
        records.append(record)
        joules = "" if record["energy_j"] is None else f"  {record['energy_j_per_frame']:.3f} J/frame" + (
            f"  {record['energy_j_per_token']:.4f} J/token" if record["energy_j_per_token"] else "")
        print(f"  {setting:20s} action {record['action_hz']:7.1f} Hz  p99 {record['action_latency_p99_ms']:7.1f} ms"
              f"  tokens {record['tokens_per_s']:8.1f}/s  misses {record['deadline_misses']}{joules}", flush=True)
    return records


def measure_action_only_period(model, config, device, seed, part_threads: PartThreads = ALL_THREADS) -> float:
    """The control period the deadline counts against: 1.25x the action-only frame time (80% of its rate), with
    the action frame's parts on `part_threads` as action_only runs them.

    The median over 12 frames after 4 warm-up ones, so one slow frame (a cold cache, another process) does not
    stretch the period every later point is judged by."""
    inputs, noises = synthetic_frames(config, 16, seed=seed, device=device, dtype=model.dtype)
    workload = Workload(inputs, noises, [False] * 16, 1, warmup_frames=4, part_threads=part_threads)
    run = RUNNERS["action_only"](model, workload)
    return 1.25 * percentile(run.action_latency_s, 0.5)


def write_json(path: Path, records: list[dict]) -> None:
    """The records so far, written beside and renamed: a cut mid-write leaves the last whole file."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(records, indent=2) + "\n")
    part.replace(path)


def write_markdown(records: list[dict], path: Path, header: str) -> None:
    lines = [header, "", "| dtype | sweep | decode len | k | steps | arrival | setting | action Hz | p50 ms | p99 ms | "
             "misses | tok/s | speedup Hz | speedup tok/s | memory MB | J/frame | J/token |", "|" + "---|" * 17]

    def point(r: dict) -> tuple:
        return r["dtype"], r["sweep"], r["decode_len"], str(r["tokens_per_frame"]), r["denoise_steps"], r["arrival"]

    base = {point(r): r for r in records if r["setting"] == "baseline"}
    for r in records:
        b = base.get(point(r)) or next((x for x in records if x["setting"] == "baseline" and x["dtype"] == r["dtype"]
                                        and x["decode_len"] == r["decode_len"]
                                        and x["denoise_steps"] == r["denoise_steps"]
                                        and x["arrival"] == r["arrival"]), None)
        hz = f"{r['action_hz'] / b['action_hz']:.2f}x" if b else "-"
        tok = f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x" if b and b["tokens_per_s"] and r["tokens_per_s"] else "-"
        per_frame, per_token = r.get("energy_j_per_frame"), r.get("energy_j_per_token")
        lines.append(f"| {r['dtype']} | {r['sweep']} | {r['decode_len']} | {r['tokens_per_frame']} | "
                     f"{r['denoise_steps']} | {r['arrival']} | {r['setting']} | {r['action_hz']:.1f} | "
                     f"{r['action_latency_p50_ms']:.1f} | {r['action_latency_p99_ms']:.1f} | {r['deadline_misses']} | "
                     f"{r['tokens_per_s']:.1f} | {hz} | {tok} | {r['peak_memory_mb']:.1f} | "
                     f"{'-' if per_frame is None else f'{per_frame:.3f}'} | "
                     f"{'-' if per_token is None else f'{per_token:.4f}'} |")
    path.write_text("\n".join(lines) + "\n")


def write_plots(records: list[dict], out: Path) -> list[Path]:
    """Action Hz vs decode length per setting, and the tokens/s vs action Hz trade-off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def by_length(sweep: str, setting: str) -> list[tuple[int, float]]:
        return sorted((r["decode_len"], r["action_hz"]) for r in records
                      if r["sweep"] == sweep and r["setting"] == setting)

    length_series = [(s, by_length("decode_len", s)) for s in SETTINGS]
    length_series.append(("continuous_batching (adaptive k)", by_length("decode_len_adaptive", "continuous_batching")))
    trade_off = [(s, [(r["action_hz"], r["tokens_per_s"]) for r in records if r["setting"] == s]) for s in SETTINGS]
    plots = [
        ("action_hz_vs_decode_len.png", "Action rate under language load", "decode length per request (tokens)",
         "action rate (Hz)", "plot", length_series),
        ("tokens_per_s_vs_action_hz.png", "Throughput trade-off", "action rate (Hz)",
         "language throughput (tokens/s)", "scatter", trade_off),
    ]
    paths = []
    for name, title, xlabel, ylabel, kind, series in plots:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, points in series:
            if points and kind == "plot":
                ax.plot(*zip(*points), marker="o", label=label)
            elif points:
                ax.scatter(*zip(*points), label=label)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.legend()
        fig.tight_layout()
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser("bench", __doc__)
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model preset")
    parser.add_argument("--model-config", help="JSON file with model shapes (overrides --preset)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda or cuda:N")
    parser.add_argument("--dtype", nargs="+", choices=DTYPE_NAMES, help="model dtype(s), run one after the other in "
                        "this process; default bfloat16 on cuda, float32 on cpu (auto: as the node's model.dtype)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the denoise and decode steps")
    parser.add_argument("--cpu-kernel", choices=cpu_kernel.CHOICES, default="auto", help="the decode step's layers "
                        "and greedy choice as compiled CPU calls, as the node's model.cpu_kernel (every setting "
                        "runs the same model, so the baseline decodes as fast)")
    parser.add_argument("--cuda-graphs", action="store_true", help="replay CUDA graphs of the decode step and the "
                        "denoising loop per batch bucket (a CUDA device only)")
    parser.add_argument("--quick", action="store_true", help="a reduced matrix (under 2 minutes on 2 CPU cores)")
    parser.add_argument("--goals", action="store_true", help="only the goal points: action_only, baseline and "
                        "continuous batching at k = 1 without and with overlap, 50 tokens a request, one a frame; "
                        "then both continuous batching settings paced by a timer with adaptive k and its floor")
    parser.add_argument("--min-steps", type=int, default=1, help="adaptive k's floor: decode steps owed per frame")
    parser.add_argument("--overlap-threads", type=int, default=1, help="continuous_batching_overlap: the language "
                        "worker's intra-op threads beside a denoising (the control path keeps the rest)")
    parser.add_argument("--frames", type=int, help="measured frames per setting and point")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--part-threads", choices=("best", "all"), default="best", help="the sequential settings' "
                        "action frame (action_only, the ceiling, included): best = its prefill and its denoising "
                        "each on the thread count (1 .. --threads) a probe before the run finds fastest; all = both "
                        "on every thread")
    parser.add_argument("--rounds", type=int, help="rounds per point; settings are interleaved round by round")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, frames and noise")
    parser.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    config = Pi05Config.load_json(args.model_config) if args.model_config else get_preset(args.preset)
    preset = args.model_config or args.preset
    cuda = args.device.startswith("cuda")
    meter, energy_note = open_energy_meter(args.device, uuid=cuda_uuid(args.device) if cuda else None)
    print(energy_note, flush=True)
    frames = args.frames or (8 if args.quick else 16)
    rounds = args.rounds or (2 if args.quick else 4 if args.goals else 3)  # an even count balances the reversals
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    for requested in args.dtype or [str(default_dtype(args.device)).removeprefix("torch.")]:
        choice = resolve_dtype(requested, args.device, config)
        print(f"model dtype: {choice}", flush=True)
        built = time.perf_counter()
        # made on the device itself (on a GPU no float32 copy on the CPU first; on the CPU build_model's weights)
        model = build_on_device(config, args.device, choice.dtype, seed=args.seed)
        print(f"model built in {time.perf_counter() - built:.1f} s", flush=True)
        if args.compile:
            model.compile_steps()
        if args.cuda_graphs:
            model.use_cuda_graphs()
        kernel = cpu_kernel.apply(model, args.cpu_kernel)
        print(f"cpu kernel: {kernel}", flush=True)
        part_threads, probe_ms = ALL_THREADS, {}
        if args.part_threads == "best" and torch.get_num_threads() > 1 and not cuda:
            part_threads, probe_ms = probe(model, config, args.device, args.seed, num_steps=10)
            print("action frame, median ms by intra-op threads: " + "; ".join(
                f"{part} " + ", ".join(f"{n}: {ms:.2f}" for n, ms in by_count.items())
                for part, by_count in probe_ms.items()) + f" -> {part_threads.describe()}", flush=True)
        period = measure_action_only_period(model, config, args.device, args.seed, part_threads)
        meta = {"preset": preset, "device": args.device, "dtype": str(choice.dtype).removeprefix("torch."),
                "compiled": args.compile, "cuda_graphs": args.cuda_graphs, "cpu_kernel": kernel,
                "torch": torch.__version__, "threads": torch.get_num_threads(),
                "cpu": platform.processor() or platform.machine(), "control_period_ms": 1e3 * period,
                "frames_per_round": frames, "rounds": rounds, "min_steps_per_frame": args.min_steps,
                "overlap_threads": args.overlap_threads,
                "part_threads": {"prefill": part_threads.prefill, "denoise": part_threads.denoise,
                                 "probe_ms": probe_ms},
                "energy": energy_note}
        print(f"oxygen bench: {meta}", flush=True)
        for point in progress(list(matrix(args.quick, args.goals)), desc="bench points"):
            print(f"[{point.sweep}] decode_len={point.decode_len} k={point.tokens_per_frame} steps={point.num_steps} "
                  f"arrival={point.arrival}", flush=True)
            for record in run_point(model, config, point, frames, period, args.seed, args.device, rounds, meter,
                                    args.min_steps, args.overlap_threads, part_threads):
                records.append({**meta, **record, "load_average": os.getloadavg()[0]})
            # after every point, so a run cut by a time limit keeps the points it finished
            write_json(out / "results.json", records)
        del model
    write_json(out / "results.json", records)
    header = (f"OxyGen benchmark: preset {preset}, {args.device}, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, {rounds} interleaved rounds x {frames} measured frames per setting "
              f"and point, {time.perf_counter() - started:.0f} s, load average {load_start:.1f} at the start and "
              f"{os.getloadavg()[0]:.1f} at the end; {energy_note}")
    write_markdown(records, out / "results.md", header)
    plots = write_plots([r for r in records if r["dtype"] == records[0]["dtype"]], out)  # the first dtype
    print((out / "results.md").read_text())
    print("wrote", out / "results.json", out / "results.md", *plots)
    for text in (headline(records), goals_summary(records)):
        if text:
            print(text)
    return 0


def headline(records: list[dict]) -> str:
    """The paper's comparison at the default point (decode_len 50, k 4, 10 steps, a request every frame)."""
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in records):
        at = {r["setting"]: r for r in records if r["sweep"] == "decode_len" and r["decode_len"] == 50
              and r["dtype"] == dtype}
        if not {"baseline", "continuous_batching", "action_only"} <= at.keys():
            continue
        base, cb, only = at["baseline"], at["continuous_batching"], at["action_only"]
        text = (f"headline (decode_len 50, {dtype}): continuous_batching vs baseline "
                f"{cb['action_hz'] / base['action_hz']:.2f}x action Hz, {cb['tokens_per_s'] / base['tokens_per_s']:.2f}x "
                f"tokens/s; action Hz under language load {cb['action_hz'] / only['action_hz']:.2f}x action_only; "
                f"memory {cb['peak_memory_mb'] / only['peak_memory_mb']:.2f}x action_only")
        if "shared_kv" in at:
            text += f"; shared_kv vs baseline {at['shared_kv']['action_hz'] / base['action_hz']:.2f}x action Hz"
        lines.append(text)
    return "\n".join(lines)


def goals_summary(records: list[dict]) -> str:
    """The goal point against its goals, per dtype and continuous-batching setting: the arm keeps >= 0.85x
    action_only while the text keeps up (tokens/s >= 0.95 x tokens per request x action Hz, nothing dropped)."""
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in records):
        at = {r["setting"]: r for r in records if r["sweep"] == "goals" and r["dtype"] == dtype}
        if set(GOAL_SETTINGS) - at.keys():
            continue
        base, only = at["baseline"], at["action_only"]
        for setting in NARRATED:
            cb = at[setting]
            arm = cb["action_hz"] / only["action_hz"]
            needed = 0.95 * cb["decode_len"] * cb["action_hz"]
            rounds = [a / b for a, b in zip(cb["round_action_hz"], only["round_action_hz"])]
            lines.append(
                f"goals ({dtype}, {setting}): {cb['action_hz']:.1f} Hz = {arm:.2f}x action_only "
                f"({'met' if arm >= 0.85 else 'not met'}, goal >= 0.85x; round by round {min(rounds):.2f}-"
                f"{max(rounds):.2f}x); text {cb['tokens_per_s']:.0f} tokens/s "
                f"against {needed:.0f} needed to keep up ({'met' if cb['tokens_per_s'] >= needed else 'not met'}), "
                f"{cb['requests_dropped']} requests dropped; vs baseline {cb['action_hz'] / base['action_hz']:.2f}x "
                f"action Hz, {cb['tokens_per_s'] / base['tokens_per_s']:.2f}x tokens/s")
        for cb in (r for r in records if r["sweep"] == "goals_timer" and r["dtype"] == dtype):
            timer_hz = 1e3 / cb["control_period_ms"]
            needed = 0.95 * cb["decode_len"] * cb["action_hz"]
            lines.append(
                f"timer ({dtype}, {cb['setting']}, adaptive k, floor {cb['min_steps_per_frame']}): "
                f"{cb['action_hz']:.1f} Hz against the timer's {timer_hz:.1f} Hz ({cb['action_hz'] / timer_hz:.2f}x); "
                f"text {cb['tokens_per_s']:.0f} tokens/s against {needed:.0f} needed; floor steps past the tick "
                f"{cb['floor_steps']}, {1e3 * cb['floor_action_s']:.0f} ms of action time")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
