"""Model benchmark: parameter counts per preset, the memory a loaded preset takes, and CPU latency of prefill,
denoising and decoding.

    python -m oxygen_ros.evaluation.bench.model_bench [--presets tiny small] [--batches 1 4 16] [--repeats 5]
                                           [--dtype float32|bfloat16] [--threads N]

The full pi05 model is counted on the `meta` device (no memory); timings run the random-init presets (`tiny` and
`small` by default) in `--dtype` (float32 by default) with random inputs (latency does not depend on the weights).
Each figure is the median of `--repeats` timed runs after one warm-up. Each timed preset's memory line gives its
weights, the process's resident memory once the model is built (and the peak until then, which building through
float32 raises for bfloat16) and one KV pool slot (prefix plus the node's default 32 narration tokens), the
figures that size a GPU for the released shapes (`--presets pi05 --batches 1 --repeats 1`: 13.4 GB of float32
weights, so one process at a time on a small machine).
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable

import torch

from oxygen_ros.command_line import CommandParser
from oxygen_ros.model.config import PRESETS, Pi05Config, get_preset
from oxygen_ros.model.inputs import ModelInputs
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import Pi05Model, build_model, parameter_counts

DECODE_TOKENS = 16
NARRATION_TOKENS = 32  # the node's default language.max_new_tokens: a pool slot's room past the prefix
GIB, MIB = 2**30, 2**20


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def random_inputs(config: Pi05Config, batch: int, seed: int = 0) -> ModelInputs:
    """All cameras present, prompts using half of the token budget."""
    gen = torch.Generator().manual_seed(seed)
    size, length = config.vision.image_size, config.max_token_len
    return ModelInputs(
        images=torch.rand(batch, config.num_cameras, 3, size, size, generator=gen) * 2 - 1,
        image_masks=torch.ones(batch, config.num_cameras, dtype=torch.bool),
        tokens=torch.randint(4, config.vocab_size, (batch, length), generator=gen),
        token_masks=(torch.arange(length) < length // 2).expand(batch, length).clone(),
    )


def resident_bytes() -> int:
    """This process's resident memory now (Linux `/proc/self/statm`), 0 where that file does not exist."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def memory_figures(model: Pi05Model) -> dict[str, float]:
    """What the loaded model takes: weights, the process's resident memory now and at its peak (GiB), and the
    bytes of one KV pool slot (MiB) in the model's dtype."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    slot = KVCache(model.config, 1, model.config.prefix_len + NARRATION_TOKENS, dtype=model.dtype).nbytes
    return {"params_m": sum(p.numel() for p in model.parameters()) / 1e6, "weights_gib": weights / GIB,
            "rss_gib": resident_bytes() / GIB, "peak_gib": peak_resident_bytes() / GIB, "kv_slot_mib": slot / MIB}


def time_model(model: Pi05Model, batch: int, repeats: int) -> dict[str, float]:
    """prefill ms, denoise ms per Euler step, one chunk (prefill + every Euler step) ms, decode ms per token, for
    one batch size."""
    cfg = model.config
    cache = KVCache(cfg, num_slots=batch, max_len=cfg.prefix_len + DECODE_TOKENS, dtype=model.dtype)
    slots = torch.arange(batch)
    inputs = random_inputs(cfg, batch).to(model.device, model.dtype)
    noise = torch.randn(batch, cfg.action_horizon, cfg.action_dim)
    prefill_ms = median_ms(lambda: model.prefill(inputs, cache, slots, want_logits=True), repeats)
    denoise_ms = median_ms(lambda: model.sample_actions(cache, slots, noise), repeats) / cfg.num_steps

    num_valid = model.prefill(inputs, cache, slots).num_valid
    tokens = torch.full((batch,), 5)

    def decode_run() -> None:
        for n in range(DECODE_TOKENS):
            index = torch.full((batch,), cfg.prefix_len + n)
            model.decode_step(cache, slots, tokens, index, num_valid + n)

    decode_ms = median_ms(decode_run, repeats) / DECODE_TOKENS
    return {"prefill_ms": prefill_ms, "denoise_step_ms": denoise_ms,
            "chunk_ms": prefill_ms + denoise_ms * cfg.num_steps, "decode_token_ms": decode_ms}


def print_parameter_counts() -> None:
    print("Parameters (millions; pi05 counted on the meta device)")
    print(f"{'preset':<8}{'vision':>10}{'backbone':>10}{'expert':>10}{'heads':>8}{'total':>10}")
    for name, cfg in PRESETS.items():
        with torch.device("meta"):
            counts = parameter_counts(Pi05Model(cfg))
        m = {k: v / 1e6 for k, v in counts.items()}
        print(
            f"{name:<8}{m['vision']:>10.2f}{m['backbone']:>10.2f}{m['expert']:>10.2f}"
            f"{m['action_heads']:>8.2f}{m['total']:>10.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = CommandParser("model-bench", __doc__)
    parser.add_argument("--presets", "--preset", nargs="+", default=["tiny", "small"], choices=sorted(PRESETS),
                        help="model presets to time")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16], help="batch sizes to time")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per point (the median is kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="weights and KV cache")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    print_parameter_counts()
    print(
        f"\nCPU {args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}"
    )
    for name in args.presets:
        cfg = get_preset(name)
        model = build_model(cfg, dtype=getattr(torch, args.dtype))
        m = memory_figures(model)
        print(f"{name}: memory {m['params_m']:.2f} M parameters, weights {m['weights_gib']:.2f} GiB, resident "
              f"{m['rss_gib']:.2f} GiB after building (peak {m['peak_gib']:.2f} GiB), KV pool slot "
              f"{m['kv_slot_mib']:.2f} MiB ({cfg.prefix_len} + {NARRATION_TOKENS} tokens)")
        print(f"{'preset':<8}{'batch':>6}{'prefix':>8}{'prefill ms':>12}{'denoise ms/step':>17}{'chunk ms':>11}"
              f"{'decode ms/token':>17}")
        for batch in args.batches:
            r = time_model(model, batch, args.repeats)
            print(
                f"{name:<8}{batch:>6}{cfg.prefix_len:>8}{r['prefill_ms']:>12.2f}"
                f"{r['denoise_step_ms']:>17.2f}{r['chunk_ms']:>11.2f}{r['decode_token_ms']:>17.2f}",
                flush=True,
            )
        del model


if __name__ == "__main__":
    main()
