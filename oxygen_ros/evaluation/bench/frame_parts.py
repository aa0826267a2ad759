"""Where a frame's time goes on a GPU: each part of an action frame (the prefill, the denoising loop) and one decode
step, eagerly and replayed from CUDA graphs, timed two ways side by side: the host's wall clock (what a control
loop waits for) and CUDA events (what the device spent). A part whose wall time is far above its device time is
bound by launching kernels from Python, which a graph removes; one whose device time dominates is bound by the
kernels themselves. Then torch's profiler over one eager prefill and one graphed frame names the kernels that take
the device time.

    python -m oxygen_ros.evaluation.bench.frame_parts --preset pi05 --dtype bfloat16 --out DIR

Writes `DIR/frame_parts.json` (after every part, so a run cut short keeps what it measured) and prints a table.
Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ...model.config import PRESETS, get_preset
from ...model.kv_cache import KVCache
from ...model.loading import build_on_device
from .workloads import synthetic_frames


def timed(run: Callable[[], object], repeats: int) -> dict[str, float]:
    """Median wall and device milliseconds of `run` (each call synchronized: the wall time is what a caller that
    needs the result waits for)."""
    wall, device = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        device.append(start.elapsed_time(end))
    return {"wall_ms": statistics.median(wall), "device_ms": statistics.median(device)}


def top_kernels(run: Callable[[], object], rows: int) -> dict:
    """torch's profiler over one call of `run`: kernel launches and the kernels with the most device time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events)
    return {"kernel_launches": sum(e.count for e in events), "device_ms": total / 1e3,
            "top": [{"kernel": e.key[:90], "count": e.count, "ms": e.device_time_total / 1e3} for e in events[:rows]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="pi05", choices=sorted(PRESETS))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10, help="denoising steps")
    parser.add_argument("--device", default="cuda", help="a CUDA device (the timing uses CUDA events)")
    parser.add_argument("--out", required=True, help="folder for frame_parts.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("frame_parts needs a CUDA device")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = get_preset(args.preset)
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    model = build_on_device(config, device, dtype)
    frames, noises = synthetic_frames(config, 1, seed=0, device=device, dtype=dtype)
    cache = KVCache(config, num_slots=1, max_len=config.prefix_len + 64, dtype=dtype, device=device)
    slot = torch.tensor([0])
    p = config.prefix_len
    results: dict = {"preset": args.preset, "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
                     "device": torch.cuda.get_device_name(), "steps": args.steps, "repeats": args.repeats,
                     "build_s": round(time.perf_counter() - t0, 1), "parts": {}}

    def save() -> None:
        (out / "frame_parts.json").write_text(json.dumps(results, indent=1))

    num_valid = model.prefill(frames[0], cache, slot).num_valid.cpu()
    parts = {
        "prefill": lambda: model.prefill(frames[0], cache, slot, want_hidden=True),
        "denoise": lambda: model.sample_actions(cache, slot, noises[0], args.steps),
        "frame": lambda: (model.prefill(frames[0], cache, slot), model.sample_actions(cache, slot, noises[0],
                                                                                      args.steps).cpu()),
        "decode_step": lambda: model.decode_step(cache, slot, torch.tensor([7]), torch.tensor([p]), num_valid),
    }
    with torch.inference_mode():
        for graphs in (False, True):
            if graphs:
                model.use_cuda_graphs(buckets=(1,))
            mode = "graphs" if graphs else "eager"
            for name, run in parts.items():
                for _ in range(3):  # warm-up (and the graph's capture)
                    run()
                results["parts"][f"{name} {mode}"] = timed(run, args.repeats)
                save()
                row = results["parts"][f"{name} {mode}"]
                print(f"{name:12s} {mode:6s} wall {row['wall_ms']:8.2f} ms  device {row['device_ms']:8.2f} ms",
                      flush=True)
        results["profile graphed frame"] = top_kernels(parts["frame"], 12)
        save()
        model._graphs = None
        results["profile eager prefill"] = top_kernels(parts["prefill"], 15)
        save()
    for name in ("profile eager prefill", "profile graphed frame"):
        found = results[name]
        print(f"{name}: {found['kernel_launches']} kernel launches, {found['device_ms']:.2f} ms on the device")
        for row in found["top"]:
            print(f"  {row['ms']:8.3f} ms  x{row['count']:<5d} {row['kernel']}")
    print(f"wrote {out / 'frame_parts.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
