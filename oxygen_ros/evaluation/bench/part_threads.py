"""The action frame's best thread layout: how many intra-op threads its prefill and its denoising each run fastest on.

`action_only` is the ceiling every narrated setting is divided by, so it must run at its best. Continuous batching
with overlap denoises on fewer threads than the process has (the language worker takes the rest); on a host where
the small matrices of a denoising step run faster on one thread than on two (OpenMP's fork and join cost more than
the second core gives), that setting got an advantage the ceiling did not have, and beat it. So before a run the
benchmark times each part of an action frame at every thread count up to the process's and gives the sequential
settings (`action_only`, `baseline`, `shared_kv`, `parallel`'s action worker) the fastest count per part; the
continuous-batching settings keep the runtime's own layout, which is what they are measured for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ...engine.kv_pool import KVPool
from ...engine.stats import percentile
from .workloads import synthetic_frames


@dataclass(frozen=True)
class PartThreads:
    """Intra-op threads for an action frame's two parts; 0 leaves the caller's count."""

    prefill: int = 0
    denoise: int = 0

    def describe(self) -> str:
        return f"prefill {self.prefill or 'all'}, denoise {self.denoise or 'all'}"


ALL_THREADS = PartThreads()  # both parts on the caller's threads


@contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """This thread's torch intra-op threads set to `count` for the block (0: left as they are)."""
    before = torch.get_num_threads()
    if count and count != before:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def probe(model, config, device, seed: int, num_steps: int, frames: int = 8, rounds: int = 4
          ) -> tuple[PartThreads, dict[str, dict[int, float]]]:
    """Time prefill and denoising at 1 .. the caller's thread count, the counts interleaved round by round (the
    order reversed every other round) so a drift in the machine's speed weighs on each alike; the first frame of
    each round is a warm-up. Returns the fastest count per part (ties go to fewer threads) and the median
    milliseconds per part and count."""
    most = torch.get_num_threads()
    counts = list(range(1, most + 1))
    inputs, noises = synthetic_frames(config, frames, seed=seed, device=device, dtype=model.dtype)
    pool = KVPool(config, 1, 0, model.dtype, model.device)
    slot = torch.tensor([0])
    samples: dict[str, dict[int, list[float]]] = {"prefill": {n: [] for n in counts},
                                                  "denoise": {n: [] for n in counts}}
    for r in range(rounds):
        for n in counts if r % 2 == 0 else counts[::-1]:
            with intra_op_threads(n):
                for frame, (frame_inputs, noise) in enumerate(zip(inputs, noises)):
                    start = time.perf_counter()
                    model.prefill(frame_inputs, pool.cache, slot)
                    prefilled = time.perf_counter()
                    model.sample_actions(pool.cache, slot, noise, num_steps)[0].cpu()
                    done = time.perf_counter()
                    if frame:
                        samples["prefill"][n].append(prefilled - start)
                        samples["denoise"][n].append(done - prefilled)
    medians = {part: {n: 1e3 * percentile(times, 0.5) for n, times in by_count.items()}
               for part, by_count in samples.items()}
    best = {part: min(counts, key=lambda n, part=part: (medians[part][n], n)) for part in medians}
    return PartThreads(prefill=best["prefill"], denoise=best["denoise"]), medians
