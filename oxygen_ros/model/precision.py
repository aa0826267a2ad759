"""The precision the model runs in. `auto` means bfloat16 on CUDA; on a CPU, bfloat16 only where the CPU has
native bfloat16 arithmetic (AVX-512 BF16 or AMX) and a text-head-shaped matmul measures faster in it than in
float32, else float32. Every choice comes with the reason, for the start-up log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPE_NAMES = ("auto", "float32", "bfloat16")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of the CPUs with bfloat16 dot products


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str

    def __str__(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')} ({self.reason})"


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags the kernel reports; empty where there is no such file (not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def native_bf16_cpu() -> str | None:
    """The first native-bfloat16 flag this CPU reports, or None."""
    flags = cpu_flags()
    return next((flag for flag in NATIVE_BF16_FLAGS if flag in flags), None)


def head_matmul_ms(dtype: torch.dtype, width: int, vocab: int, batch: int = 16, repeats: int = 3) -> float:
    """Best-of-`repeats` ms of hidden [batch, width] @ head.T with head [rows, width] in `dtype`, rows capped so
    the head takes at most 64 MiB in float32 (the choice needs a comparison, not the real head)."""
    rows = max(1, min(vocab, 2**24 // width))
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(batch, width, generator=gen).to(dtype)
    head = torch.randn(rows, width, generator=gen).to(dtype)
    hidden @ head.T  # warm-up: first-call kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        hidden @ head.T
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def resolve_dtype(requested: str, device: str, width: int, vocab: int) -> DtypeChoice:
    """The dtype for `requested` (one of DTYPE_NAMES) on `device`; width and vocab shape the `auto` measurement."""
    if requested not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {requested!r}; choose one of {DTYPE_NAMES}")
    if requested != "auto":
        return DtypeChoice(getattr(torch, requested), "as configured")
    if device.startswith("cuda"):
        return DtypeChoice(torch.bfloat16, "auto: CUDA")
    flag = native_bf16_cpu()
    if flag is None:
        return DtypeChoice(torch.float32, "auto: this CPU has no native bfloat16 (avx512_bf16 / amx_bf16)")
    fp32_ms = head_matmul_ms(torch.float32, width, vocab)
    bf16_ms = head_matmul_ms(torch.bfloat16, width, vocab)
    measured = f"a text-head matmul took {bf16_ms:.2f} ms in bfloat16, {fp32_ms:.2f} ms in float32"
    if bf16_ms < fp32_ms:
        return DtypeChoice(torch.bfloat16, f"auto: CPU has {flag} and {measured}")
    return DtypeChoice(torch.float32, f"auto: CPU has {flag} but {measured}")
