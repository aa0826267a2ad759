"""What real-time chunking's guidance costs: a chunk's denoising with and without it, side by side.

    python -m oxygen_ros.evaluation.bench.rtc_bench [--presets tiny small] [--batches 1 4] [--repeats 7]
                                                    [--threads N] [--device cpu|cuda] [--dtype float32|bfloat16]

Each repeat times the plain sampler (`Pi05Model.sample_actions`) and then the guided one (`model/rtc.py`, every row
guided, EXP schedule, delay 3, execution horizon 3/4 of the chunk) on the same prefixes and noise, so a loaded
machine slows both alike; the medians and their ratio are printed per preset and batch. Guidance adds a backward
pass through the action expert to every Euler step and keeps that step's activations for it, so the ratio is the
figure to read (a GPU shows its own: it runs the same forward and backward, eagerly, without CUDA graphs).

`--device cuda` builds each model on the GPU itself (`build_on_device`: pi05's weights never pass through host
memory) in `--dtype`, and synchronizes the device around every timed call, so a time is what a caller that needs
the chunk waits for. The plain sampler is timed eagerly here too; the engine replays it from CUDA graphs
(`frame_parts` times both).
"""

from __future__ import annotations

import statistics
import time

import torch

from oxygen_ros.command_line import CommandParser
from oxygen_ros.evaluation.bench.model_bench import random_inputs
from oxygen_ros.model.config import PRESETS, get_preset
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.loading import build_on_device
from oxygen_ros.model.rtc import Committed, GuidedSampler, RtcConfig, Schedule

DELAY = 3


def time_guidance(preset: str, batch: int, repeats: int, device: str = "cpu", dtype: torch.dtype = torch.float32
                  ) -> dict[str, float]:
    """Median ms of one chunk's denoising (all Euler steps), plain and guided, and guided / plain."""
    cfg = get_preset(preset)
    model = build_on_device(cfg, device, dtype)
    cache = KVCache(cfg, num_slots=batch, max_len=cfg.prefix_len, dtype=dtype, device=model.device)
    slots = torch.arange(batch)
    model.prefill(random_inputs(cfg, batch).to(model.device, dtype), cache, slots)
    noise = torch.randn(batch, cfg.action_horizon, cfg.action_dim,
                        generator=torch.Generator().manual_seed(0)).to(model.device)
    previous = model.sample_actions(cache, slots, noise.flip(1))
    sampler = GuidedSampler(RtcConfig(max(DELAY + 1, 3 * cfg.action_horizon // 4), Schedule.EXP))
    committed = [Committed(previous[b], DELAY) for b in range(batch)]
    runs = {"plain": lambda: model.sample_actions(cache, slots, noise),
            "guided": lambda: sampler.sample(model, cache, slots, noise, committed)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    synchronize = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    for repeat in range(repeats + 1):  # the first round warms up
        for name, run in runs.items():
            synchronize()
            start = time.perf_counter()
            run()
            synchronize()
            if repeat:
                times[name].append((time.perf_counter() - start) * 1e3)
    if sampler.fallbacks:
        raise RuntimeError(f"guidance fell back: {dict(sampler.fallbacks)}")
    plain, guided = (statistics.median(times[name]) for name in runs)
    return {"steps": cfg.num_steps, "plain_ms": plain, "guided_ms": guided, "ratio": guided / plain}


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser("rtc-bench", __doc__)
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=sorted(PRESETS),
                        help="model presets to time (random weights)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4], help="batch sizes, every row guided")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds after one warm-up round")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu or a CUDA device")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="weights and KV cache")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else \
        f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, {args.dtype}; median of {args.repeats}, ms per chunk")
    print(f"{'preset':<8}{'batch':>6}{'steps':>6}{'plain':>10}{'guided':>10}{'ratio':>8}")
    for preset in args.presets:
        for batch in args.batches:
            r = time_guidance(preset, batch, args.repeats, args.device, dtype)
            print(f"{preset:<8}{batch:>6}{r['steps']:>6}{r['plain_ms']:>10.2f}{r['guided_ms']:>10.2f}"
                  f"{r['ratio']:>8.2f}")


if __name__ == "__main__":
    main()
