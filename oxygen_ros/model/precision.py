"""The precision the model runs in. `auto` means bfloat16 on CUDA; on a CPU, bfloat16 only where the CPU has
native bfloat16 arithmetic (AVX-512 BF16 or AMX) and both a text-head and an action-expert-MLP matmul of the
model's shapes measure faster in it than in float32 (tiny widths can be slower in bfloat16), else float32. Every
choice comes with the reason, for the start-up log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import Pi05Config

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


def matmul_ms(dtype: torch.dtype, rows: int, inner: int, cols: int, repeats: int = 5) -> float:
    """Best-of-`repeats` ms of a [rows, inner] @ [inner, cols] matmul in `dtype`, after a warm-up call."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(rows, inner, generator=gen).to(dtype)
    b = torch.randn(cols, inner, generator=gen).to(dtype).T
    a @ b  # first-call kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def probe_shapes(config: Pi05Config) -> dict[str, tuple[int, int, int]]:
    """The two matmuls `auto` compares: the text head for 16 requests (its rows capped so the head takes at most
    64 MiB in float32) and the action expert's MLP over one action chunk."""
    width = config.backbone.width
    return {
        "text head": (16, width, max(1, min(config.vocab_size, 2**24 // width))),
        "expert MLP": (config.action_horizon, config.expert.width, config.expert.mlp_dim),
    }


def default_dtype(device: str | torch.device) -> torch.dtype:
    """The dtype the benchmarks and the fleet run in unless told: bfloat16 on CUDA (as `auto` there, what a GPU
    deployment serves in), float32 elsewhere (no measurement: the same everywhere a CPU table is compared)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def resolve_dtype(requested: str, device: str, config: Pi05Config) -> DtypeChoice:
    """The dtype for `requested` (one of DTYPE_NAMES) on `device`; `auto` on a CPU measures at `config`'s shapes."""
    if requested not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {requested!r}; choose one of {DTYPE_NAMES}")
    if requested != "auto":
        return DtypeChoice(getattr(torch, requested), "as configured")
    if device.startswith("cuda"):
        return DtypeChoice(torch.bfloat16, "auto: CUDA")
    flag = native_bf16_cpu()
    if flag is None:
        return DtypeChoice(torch.float32, "auto: this CPU has no native bfloat16 (avx512_bf16 / amx_bf16)")
    times = {name: (matmul_ms(torch.bfloat16, *shape), matmul_ms(torch.float32, *shape))
             for name, shape in probe_shapes(config).items()}
    measured = ", ".join(f"{name} {bf16:.2f} ms in bfloat16 vs {fp32:.2f} ms in float32"
                         for name, (bf16, fp32) in times.items())
    if all(bf16 < fp32 for bf16, fp32 in times.values()):
        return DtypeChoice(torch.bfloat16, f"auto: CPU has {flag}; {measured}")
    return DtypeChoice(torch.float32, f"auto: CPU has {flag} but bfloat16 is not faster everywhere; {measured}")
