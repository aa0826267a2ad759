"""Decode-step benchmark: what one language decode step costs against its compute and memory floors, and where
its time goes.

    python -m oxygen_ros.evaluation.bench.decode_bench [--preset fullvocab] [--batches 1 50] [--dtypes float32 bfloat16]
                                            [--rounds 5] [--steps 10] [--profile] [--compile] [--cpu-kernel]

For every dtype and batch it times `Pi05Model.decode_step` (logits, then the argmax a greedy request takes) and
`Pi05Model.decode_next` (the token chosen inside the model, no [batch, vocab] logits), and two floors:
- compute: the bare text-head matmul for that batch (hidden [batch, width] @ head.T in the model's dtype, into an
  output allocated once, as the model's step reuses one; for one row the matrix-vector product the model uses);
- memory: the bytes one step must read (backbone weights, text head included, plus the requests' K/V) divided
  by the read bandwidth measured here over a 1 GiB buffer.
Variants are interleaved round by round, so machine load moves them together; each figure is the median over all
rounds. The cache holds random K/V (a decode step's cost does not depend on the values); every request sits at
cache index prefix_len + 24, the middle of a 50-token narration. `decode_next scattered` passes the slots in
descending order, which the cache cannot serve as a view: every layer gathers the requests' K/V.
`decode_batch` is the engine's step over language requests in those slots (`EngineBatch`): its index stays on the
device and advances in place; `decode_batch rebuilt` builds every index from the requests' lists each step instead.
`decode_batch cpu kernel` (`--cpu-kernel`) is that step with the backbone layers and the greedy choice as compiled
CPU calls (`Pi05Model.use_cpu_kernel`), the text head fused with the choice where `cpu_kernel.head_greedy_pays`;
`fused head+greedy` is that fused call alone on the floor's hidden states.
`--beside` times what a step costs a denoising that runs beside it, as the engine's overlap runs them (each on one
intra-op thread, on its own Python thread): one frame's denoising alone, beside a thread that runs the engine's
batch step over and over, beside one that runs only the step's two compiled calls (`--cpu-kernel`; what is left
when the step's Python and torch operators are taken away) and beside one that runs only its text head; and the
step beside the denoising. `--profile` prints torch.profiler's
per-operator table for each variant; `--compile` adds the compiled decode
step (`Pi05Model.compile_steps`) and one denoise step (one Euler step of `sample_actions`), eager and compiled,
as variants; compiling takes tens of seconds per batch size.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import threading
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from oxygen_ros.engine.language import LanguageRequest, decode_batch
from oxygen_ros.model import cpu_kernel
from oxygen_ros.model.config import Pi05Config, get_preset
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import Pi05Model, build_model

TEXT_OFFSET = 24  # generated tokens before the timed step


def read_bandwidth_gbs(repeats: int = 5) -> float:
    """Best-of-`repeats` read bandwidth in GB/s: summing a 1 GiB float32 buffer reads each byte once."""
    buffer = torch.ones(2**28)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * buffer.element_size() / best / 1e9


def step_bytes(model: Pi05Model, batch: int, span: int) -> int:
    """Bytes one decode step reads at least: the backbone's weights (the embedding once, as the text head) and
    each request's K/V over `span` positions of every layer."""
    weights = sum(p.numel() * p.element_size() for p in model.backbone.parameters())
    g = model.config.backbone
    kv = 2 * g.depth * batch * g.num_kv_heads * span * g.head_dim * model.dtype.itemsize
    return weights + kv


def random_cache(config: Pi05Config, batch: int, dtype: torch.dtype, seed: int) -> KVCache:
    cache = KVCache(config, num_slots=batch, max_len=config.prefix_len + 2 * TEXT_OFFSET, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    cache.valid[:, : config.prefix_len + TEXT_OFFSET] = True
    return cache


class EngineBatch:
    """`batch` language requests at TEXT_OFFSET tokens in slots 0..batch-1, decoded step after step as the engine
    decodes them (`decode_batch`: the index kept on the device and advanced in place); or, with `rebuilt`, with every
    index built from the requests' lists each step, as the engine did before. A request is wound back to
    TEXT_OFFSET tokens before it would run out of room (every TEXT_OFFSET - 1 steps, a step that builds a new index
    either way)."""

    def __init__(self, model: Pi05Model, cache: KVCache, tokens: list[int], rebuilt: bool):
        cfg = model.config
        self.model, self.cache, self.rebuilt = model, cache, rebuilt
        self.requests = [LanguageRequest(i, i, i, 0, cfg.prefix_len, cfg.prefix_len - cfg.max_token_len // 2,
                                         2 * TEXT_OFFSET, -1, tokens=[t] * (TEXT_OFFSET + 1))
                         for i, t in enumerate(tokens)]

    def __call__(self) -> None:
        if len(self.requests[0].tokens) >= 2 * TEXT_OFFSET - 1:
            for request in self.requests:
                del request.tokens[TEXT_OFFSET + 1:]
        if not self.rebuilt:
            decode_batch(self.model, self.cache, self.requests)
            return
        offsets = torch.tensor([len(r.tokens) - 1 for r in self.requests])
        chosen = self.model.decode_next(
            self.cache, torch.tensor([r.slot for r in self.requests]), torch.tensor([r.tokens[-1] for r in self.requests]),
            torch.tensor([r.prefix_len for r in self.requests]) + offsets,
            torch.tensor([r.num_valid_prefix for r in self.requests]) + offsets, [None] * len(self.requests))
        for request, token in zip(self.requests, chosen.tolist()):
            request.accept(token, 0.0)


def variants(model: Pi05Model, batch: int, seed: int, compiled: Pi05Model | None,
             kernel: Pi05Model | None = None) -> dict[str, Callable]:
    cfg = model.config
    cache = random_cache(cfg, batch, model.dtype, seed)
    slots = torch.arange(batch)
    tokens = torch.randint(4, cfg.vocab_size, (batch,), generator=torch.Generator().manual_seed(seed))
    index = torch.full((batch,), cfg.prefix_len + TEXT_OFFSET)
    positions = index - cfg.max_token_len // 2
    hidden = torch.randn(batch, cfg.backbone.width, dtype=model.dtype)
    head = model.backbone.text_head.detach()
    out = torch.empty(batch, cfg.vocab_size, dtype=model.dtype)
    runs = {
        "decode_step+argmax": lambda: model.decode_step(cache, slots, tokens, index, positions).argmax(dim=-1),
        "decode_next": lambda: model.decode_next(cache, slots, tokens, index, positions),
        "decode_next scattered": lambda: model.decode_next(cache, slots.flip(0), tokens, index, positions),
        "decode_batch": EngineBatch(model, cache, tokens.tolist(), rebuilt=False),
        "decode_batch rebuilt": EngineBatch(model, cache, tokens.tolist(), rebuilt=True),
        # one row the way the model computes it (`GemmaStack.logits`): a matrix-vector product
        "floor: head matmul": (lambda: torch.mv(head, hidden[0])) if batch == 1 else (
            lambda: torch.mm(hidden, head.T, out=out)),
    }
    if kernel is not None:
        runs["decode_batch cpu kernel"] = EngineBatch(kernel, cache, tokens.tolist(), rebuilt=False)
        fused = fused_head(hidden, head)
        if fused is not None:
            runs["fused head+greedy"] = fused
    if compiled is not None:
        noise = torch.randn(batch, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))
        runs["decode_next compiled"] = lambda: compiled.decode_next(cache, slots, tokens, index, positions)
        runs["denoise step"] = lambda: model.sample_actions(cache, slots, noise, num_steps=1)
        runs["denoise step compiled"] = lambda: compiled.sample_actions(cache, slots, noise, num_steps=1)
    return runs


def fused_head(hidden: torch.Tensor, head: torch.Tensor) -> Callable | None:
    """The text head fused with the greedy choice on `hidden` as the kernel model runs it (a float32 head screened
    on a bfloat16 copy, made once here as the model makes it once), on torch's threads of the calling
    thread; None where the model would not take it (`cpu_kernel.head_greedy_pays`)."""
    if not cpu_kernel.head_greedy_pays(hidden.dtype, len(hidden), hidden.shape[1]):
        return None
    copy = cpu_kernel.head_copy(head) if cpu_kernel.screens(hidden.dtype, hidden.shape[1]) else None
    return lambda: cpu_kernel.head_greedy(hidden, head, torch.get_num_threads(), copy=copy)


def time_calls(fn: Callable, calls: int) -> list[float]:
    """The ms of each of `calls` calls of `fn`, in inference mode."""
    ms = []
    with torch.inference_mode():
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - start) * 1e3)
    return ms


def measure(runs: dict[str, Callable], rounds: int, steps: int) -> dict[str, float]:
    """Median ms per call for each run, interleaving the runs round by round after one warm-up each."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            times[name] += time_calls(fn, steps)
    return {name: statistics.median(values) for name, values in times.items()}


def beside(main: Callable, background: Callable, calls: int) -> tuple[list[float], list[float]]:
    """`calls` timed calls of `main` on this thread while another thread calls `background` over and over, each on
    one intra-op thread; the ms of each `main` call and of each `background` call that ran beside them (the first
    and the last in part: the one in flight when `main` began, and the one that `main`'s end lets finish)."""
    stop, started = threading.Event(), threading.Event()
    times: list[float] = []

    def loop() -> None:
        torch.set_num_threads(1)
        with torch.inference_mode():
            while True:
                start = time.perf_counter()
                background()
                times.append((time.perf_counter() - start) * 1e3)
                started.set()
                if stop.is_set():
                    return

    worker = threading.Thread(target=loop, name="decode-beside", daemon=True)
    worker.start()
    started.wait()  # its first call (warm-up) is over: every timed main call has it running beside
    times.clear()
    ms = time_calls(main, calls)
    stop.set()
    worker.join()
    return ms, times


def overlap_costs(model: Pi05Model, batch: int, seed: int, rounds: int, calls: int) -> dict[str, float]:
    """Median ms: a frame's denoising alone and beside a thread that repeats the engine's batch step, the step's
    two kernel calls alone (with the CPU kernel: its arguments built once, so that thread runs almost no Python and
    no torch operator) or its text head alone; and the step alone and beside the denoising. The cases interleave
    round by round, each on one intra-op thread."""
    cfg, g = model.config, model.config.backbone
    cache = random_cache(cfg, batch + 1, model.dtype, seed)  # the frame's prefix in the last slot
    gen = torch.Generator().manual_seed(seed)
    step = EngineBatch(model, cache, torch.randint(4, cfg.vocab_size, (batch,), generator=gen).tolist(), rebuilt=False)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen).to(model.dtype)
    frame = torch.tensor([batch])
    hidden = torch.randn(batch, g.width, generator=gen).to(model.dtype)
    head = model.backbone.text_head.detach()
    x = hidden.clone()  # the fused head's input: the step's final-norm outputs are copied in
    fused = fused_head(x, head) if model.uses_cpu_kernel else None
    backgrounds = {"the step": step}
    if fused is not None:
        weights = cpu_kernel.StepWeights(model.backbone)
        slots, at = torch.arange(batch), torch.full((batch,), cfg.prefix_len + TEXT_OFFSET)
        positions = at - cfg.max_token_len // 2
        tables = cpu_kernel.rope_tables(cache.max_len, g.head_dim, cfg.rope_theta, model.dtype)
        fed = torch.randint(4, cfg.vocab_size, (batch,), generator=gen)

        def kernels() -> None:  # the step's two calls, as `Pi05Model.decode_tokens` makes them
            x.copy_(cpu_kernel.decode_step(fed, weights, cfg, cache, slots, at, positions,
                                           cfg.prefix_len + TEXT_OFFSET + 1, tables))
            fused()

        backgrounds["its kernels"] = kernels
        backgrounds["the head"] = fused
    else:
        backgrounds["the head"] = lambda: torch.mm(hidden, head.T)
    denoise = lambda: model.sample_actions(cache, frame, noise, cfg.num_steps)  # noqa: E731
    times: dict[str, list[float]] = {"denoise alone": [], "step alone": [], "step beside denoise": []}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for fn in (denoise, *backgrounds.values()):
                fn()
        for _ in range(rounds):
            times["denoise alone"] += time_calls(denoise, calls)
            times["step alone"] += time_calls(step, calls)
            for name, fn in backgrounds.items():
                ms, background = beside(denoise, fn, calls)
                times.setdefault(f"denoise beside {name}", []).extend(ms)
                if fn is step:
                    times["step beside denoise"] += background
    finally:
        torch.set_num_threads(threads)
    return {name: statistics.median(values) for name, values in times.items()}


def print_profile(name: str, fn: Callable, steps: int) -> None:
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    print(f"\n--- profile: {name}, {steps} calls ---")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="fullvocab")
    parser.add_argument("--model-config", help="JSON file with model shapes (overrides --preset)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 50])
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed calls per variant and round")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--profile", action="store_true", help="print the profiler's operator table per variant")
    parser.add_argument("--compile", action="store_true", help="also time the torch.compile'd decode step")
    parser.add_argument("--cpu-kernel", action="store_true",
                        help="also time the engine's step with the compiled CPU kernel (Pi05Model.use_cpu_kernel)")
    parser.add_argument("--beside", action="store_true",
                        help="also time a denoising beside the batch step and beside its text head (largest batch)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = Pi05Config.load_json(args.model_config) if args.model_config else get_preset(args.preset)
    bandwidth = read_bandwidth_gbs()
    print(f"decode bench: {args.model_config or args.preset} (vocab {config.vocab_size}, backbone width "
          f"{config.backbone.width}, depth {config.backbone.depth}), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, read bandwidth {bandwidth:.1f} GB/s, median of {args.rounds} "
          f"interleaved rounds x {args.steps} calls")
    print(f"{'dtype':<10}{'batch':>6}  {'variant':<28}{'ms':>9}{'x head':>8}{'x memory':>10}")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        model = build_model(config, dtype=dtype, seed=args.seed)
        compiled = build_model(config, dtype=dtype, seed=args.seed).compile_steps() if args.compile else None
        # the same weights as the eager variants (a shallow copy), so its text head is as warm in the caches as theirs
        kernel = copy.copy(model).use_cpu_kernel() if args.cpu_kernel else None
        for batch in args.batches:
            runs = variants(model, batch, args.seed, compiled, kernel)
            result = measure(runs, args.rounds, args.steps)
            memory_ms = step_bytes(model, batch, config.prefix_len + TEXT_OFFSET + 1) / bandwidth / 1e6
            head_ms = result["floor: head matmul"]
            for name, ms in result.items():
                ratios = "" if name.startswith("denoise") else f"{ms / head_ms:>8.2f}{ms / memory_ms:>10.2f}"
                print(f"{dtype_name:<10}{batch:>6}  {name:<28}{ms:>9.2f}{ratios}")
            print(f"{dtype_name:<10}{batch:>6}  {'floor: memory':<28}{memory_ms:>9.2f}")
            if args.profile:
                for name, fn in runs.items():
                    print_profile(f"{dtype_name} batch {batch} {name}", fn, args.steps)
        if args.beside:
            batch = max(args.batches)
            for name, ms in overlap_costs(kernel or model, batch, args.seed, args.rounds, args.steps).items():
                print(f"{dtype_name:<10}{batch:>6}  {name:<28}{ms:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
