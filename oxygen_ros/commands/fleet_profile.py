"""``oxygen-ros fleet-profile``: measure real stage latencies of co-located models and write the LUT JSON.

Every (model, stage, power-of-two batch bucket, device share) is timed on the engine's model runners and stage
workers, as a stage-split fleet server runs them (``profiler.StageProfiler``: prefill into KV slots, denoise from
them), median of ``--repeats`` after a warm-up.
It then runs a VLM batch and an action batch side by side on complementary shares and records how much slower
that is than the slower of the two alone, timed in the same rounds (``meta["co_run_slowdown"]``, the interference
the profile of a stage alone cannot see); ``fleet-sim --profile`` and ``fleet_node``'s ``profile_file`` read the
same file.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

from oxygen_ros.command_line import CommandParser, add_device_options, check_device_options
from oxygen_ros.engine.frames import power_of_two_buckets
from oxygen_ros.engine.planners import Stage
from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.profiler import StageProfiler


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser("fleet-profile", __doc__)
    p.add_argument(
        "--models",
        default="a=tiny:0,b=tiny:1",
        help="served models, comma separated id=source[:seed]; source = preset, config JSON or checkpoint folder",
    )
    p.add_argument("--out", required=True, help="LUT JSON to write")
    p.add_argument("--max-batch", type=int, default=8, help="largest power-of-two bucket")
    p.add_argument("--shares", default="", help="device shares to profile (default: every core count / tenths)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per point (the median is kept)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per point first")
    add_device_options(p)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="the models' dtype (default: bfloat16 on cuda, as a GPU deployment serves; float32 on cpu)")
    p.add_argument("--require-sm-partitions", action="store_true",
                   help="fail (status 1) where the shares are not green-context SM partitions, instead of "
                        "profiling plain streams (a CUDA device only)")
    p.add_argument("--cpu-threads", type=int, default=None, help="cores that make up the CPU device")
    p.add_argument("--num-steps", type=int, default=None, help="denoising steps (default: the model's)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_device_options(parser, args)
    if args.require_sm_partitions and not args.device.startswith("cuda"):
        parser.error(f"--require-sm-partitions needs a CUDA device, not {args.device}")
    specs = [ModelSpec.parse(x) for x in args.models.split(",") if x]
    profiler = StageProfiler(
        specs, args.device, dtype=getattr(torch, args.dtype) if args.dtype else None, max_batch=args.max_batch,
        cpu_threads=args.cpu_threads, num_steps=args.num_steps, cuda_graphs=args.cuda_graphs,
    )
    if args.require_sm_partitions and profiler.partitions is None:
        profiler.close()
        print(f"fleet-profile: no SM partitions here: shares would be {profiler.partition_mode}", file=sys.stderr)
        return 1
    try:
        shares = [float(x) for x in args.shares.split(",") if x] or profiler.shares()
        buckets = power_of_two_buckets(args.max_batch)
        print(f"profiling {len(specs)} models x 2 stages x buckets {buckets} x shares {shares} ({profiler.partition_mode},"
              f" {str(profiler.dtype).removeprefix('torch.')}): {args.warmup} warm-up and {args.repeats} timed runs "
              "each, then the co-run rounds", flush=True)
        started = time.perf_counter()
        table = profiler.profile(shares, args.repeats, args.warmup)
    finally:
        profiler.close()
    table.save(args.out)
    print(f"profiled {len(table.entries)} entries ({table.meta['dtype']}, {profiler.partition_mode}) in "
          f"{time.perf_counter() - started:.1f} s -> {args.out}")
    for model_id in table.models():
        for stage in Stage:
            for share in table.shares(model_id, stage):
                row = "  ".join(
                    f"b{b}={1e3 * table.latency(model_id, stage, b, share):.2f}"
                    for b in table.batches(model_id, stage, share)
                )
                print(f"{model_id:>8} {stage.value:<6} share {share:<5} ms: {row}", file=sys.stdout)
    print(f"co-run slowdown (median): {table.meta['co_run_slowdown']:.2f}  max: {table.meta['co_run_max']:.2f}")
    print(f"load average before/after: {table.meta['load_average']} on {table.meta['cores']} cores")
    noise = table.meta.get("relative_iqr")
    if noise:
        print(f"noise (IQR / median over repeats): median {noise['median']:.2f}  max {noise['max']:.2f}")
    inversions = table.meta["inversions"]
    print(f"{len(inversions)} inversions (a bigger batch faster, or more of the device slower, by > 5%)"
          + "".join(f"\n  {line}" for line in inversions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
