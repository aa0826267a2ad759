"""A decode step's backbone layers, and its greedy token choice, as compiled CPU calls (`cpu_kernel.cpp`), for
`Pi05Model.use_cpu_kernel`. The choice is made either from logits (`greedy_tokens`) or, fused with the text head,
from the final hidden states (`head_greedy`: no [batch, vocab] logits are written; bfloat16 runs on the CPU's AMX
matrix tiles where the build and the kernel grant them).

The C++ source ships with the package and is compiled on first use with the system C++ compiler (`$CXX`, else
`g++`, else `c++`) for the machine it runs on (`-march=native`), into the user cache (`user_cache.py`) under a name
that hashes the source, the flags and this CPU's feature flags; later processes load the cached library. No
compiler, or a failed build, raises `CpuKernelUnavailable` with the compiler's message: the caller decides
whether to run eagerly instead (`Pi05Model.use_cpu_kernel` does not decide for it).

The call is bound with ctypes, not a torch extension: the kernel needs no torch headers and takes raw pointers to
the model's weights, the cache and a step's indices. The build for this machine is optimized at -O3 (about a
minute of one core on a 2-vCPU EPYC, once per machine); the builds for other instruction sets, which only the tests
run (`load("x86-64-v3")`: the code paths of CPUs with less than this one), at -O2: the same paths in an eighth of
the compile time.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import hashlib
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .gemma import rope_cos_sin
from .precision import cpu_flags
from .user_cache import cached_file

SOURCE = Path(__file__).with_name("cpu_kernel.cpp")
# With these, `flags` adds the optimization level and -march: the machine it runs on, unless a test asks. -Wno-psabi:
# the 64-byte vectors never cross the library's interface, so the ABI notes for CPUs without AVX-512 do not apply.
FLAGS = ("-std=c++17", "-shared", "-fPIC", "-Wno-psabi")
DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # the kernel's `bf16` argument


class CpuKernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here (no compiler, a failed build)."""


def compiler() -> str:
    """The C++ compiler the kernel is built with; CpuKernelUnavailable if there is none."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return name
    raise CpuKernelUnavailable("no C++ compiler found ($CXX, g++ or c++); `make setup` installs g++")


def flags(march: str) -> tuple[str, ...]:
    return (*FLAGS, "-O3" if march == "native" else "-O2", f"-march={march}")


def library_name(cxx: str, march: str = "native") -> str:
    """The cached library's file name: changes with the source, the compiler, the flags and the CPU."""
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), cxx.encode(), " ".join(flags(march)).encode(),
                 " ".join(sorted(cpu_flags())).encode()):
        key.update(part)
        key.update(b"\0")
    return f"cpu_kernel-{key.hexdigest()[:16]}.so"


def _build(cxx: str, march: str, out: str) -> None:
    result = subprocess.run([cxx, *flags(march), "-o", out, str(SOURCE)], capture_output=True, text=True)
    if result.returncode != 0:
        raise CpuKernelUnavailable(f"{cxx} failed to build {SOURCE.name}:\n{result.stderr.strip()}")


@functools.cache
def load(march: str = "native") -> ctypes.CDLL:
    """The compiled kernel library (built on first use, then cached on disk and in this process). The model runs
    the one for this machine (`native`); tests also build it for older instruction sets (`x86-64-v3`: AVX2, as
    desktop CPUs without AVX-512 have), to run the code the compiler lowers to narrower vectors."""
    cxx = compiler()
    path = cached_file(library_name(cxx, march), lambda out: _build(cxx, march, out))
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        raise CpuKernelUnavailable(f"cannot load {path}: {error}") from error
    fn = lib.oxy_decode_layers
    i, p, i64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [i, i, i, i, i, i, i, i, ctypes.c_float, p, p, p, p, i64, i64, p, p, p, i64, p, p]
    fn.restype = i
    lib.oxy_decode_step.argtypes = [i, i, i, i, i, i, i, i, ctypes.c_float, p, p, i64, ctypes.c_float, p, p, p, p,
                                    i64, i64, p, p, p, p, i64, p, p, i64, p]
    lib.oxy_decode_step.restype = i
    lib.oxy_greedy.argtypes = [i, p, i64, i64, i64, p]
    lib.oxy_greedy.restype = None
    lib.oxy_head_greedy.argtypes = [i, i, i, p, i64, i64, p, i64, p]
    lib.oxy_head_greedy.restype = i
    lib.oxy_head_greedy_screened.argtypes = [i, i, p, i64, i64, p, p, p, ctypes.c_float, i64, p]
    lib.oxy_head_greedy_screened.restype = i
    lib.oxy_row_norms.argtypes = [p, i64, i64, p]
    lib.oxy_row_norms.restype = None
    lib.oxy_has_amx.argtypes = []
    lib.oxy_has_amx.restype = i
    lib.oxy_head_rows_below.argtypes = []
    lib.oxy_head_rows_below.restype = ctypes.c_int64
    lib.oxy_has_row_head.argtypes = [i, ctypes.c_int64]
    lib.oxy_has_row_head.restype = i
    lib.oxy_has_pair_head.argtypes = []
    lib.oxy_has_pair_head.restype = i
    lib.oxy_has_avx2.argtypes = []
    lib.oxy_has_avx2.restype = i
    return lib


def layer_tensors(layers: torch.nn.ModuleList) -> list[Tensor]:
    """Each layer's weights in the kernel's order: input norm, q, k, v, o, post-attention norm, gate, up, down."""
    tensors = []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        tensors += [layer.input_layernorm.weight, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
                    attn.o_proj.weight, layer.post_attention_layernorm.weight, mlp.gate_proj.weight,
                    mlp.up_proj.weight, mlp.down_proj.weight]
    return tensors


def layer_weights(layers: torch.nn.ModuleList) -> ctypes.Array:
    """The pointers the kernel reads each layer's weights through, in `layer_tensors`' order."""
    return _pointers(layer_tensors(layers))


def _pointers(tensors: list[Tensor]) -> ctypes.Array:
    if not all(t.is_contiguous() and t.device.type == "cpu" for t in tensors):
        raise ValueError("the CPU kernel needs contiguous CPU weights")
    return (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))


class StepWeights:
    """What `decode_step` reads of a backbone (a GemmaStack): its layers' weights, its embedding table and its final
    norm, gathered once (walking the modules took 0.1 ms, a tenth of a one-request step) and gathered again when
    any of their storages has moved (`current`: `.to()` gives a parameter new storage; `load_state_dict` copies
    into the old one). A module replaced after this was made is not seen: make a new one."""

    def __init__(self, backbone: torch.nn.Module):
        self.backbone = backbone
        self._gather()

    def _gather(self) -> None:
        b = self.backbone
        self.tensors = [*layer_tensors(b.layers), b.embed_tokens.weight, b.norm.weight]
        self.layers = _pointers(self.tensors[:-2])
        self.embed, self.norm = self.tensors[-2], self.tensors[-1]
        if not (self.embed.is_contiguous() and self.norm.is_contiguous()):
            raise ValueError("the CPU kernel needs contiguous CPU weights")
        self._ptrs = [t.data_ptr() for t in self.tensors]
        # the eager embedding's scale, rounded to the table's dtype as it multiplies there (`GemmaStack.embed`)
        self.scale = float(torch.tensor(math.sqrt(b.cfg.width), dtype=self.embed.dtype))

    def __deepcopy__(self, memo: dict) -> StepWeights:  # a copied model's: gathered from its own backbone
        return StepWeights(copy.deepcopy(self.backbone, memo))

    def current(self) -> StepWeights:
        if [t.data_ptr() for t in self.tensors] != self._ptrs:
            self._gather()
        return self


def rope_tables(rows: int, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """`decode_step`'s RoPE tables: cos and sin [rows, head_dim] for positions 0 .. rows - 1, made by the eager
    `rope_cos_sin` (the same float32 angles, rounded to `dtype`)."""
    cos, sin = rope_cos_sin(torch.arange(rows)[None], head_dim, theta, dtype)
    return cos.reshape(rows, head_dim).contiguous(), sin.reshape(rows, head_dim).contiguous()


def decode_step(tokens: Tensor, weights: StepWeights, config, cache, slots: Tensor, cache_index: Tensor,
                positions: Tensor, span: int, rope: tuple[Tensor, Tensor]) -> Tensor:
    """A whole decode step before the text head in one call: the fed tokens [B] embedded (scaled as the eager
    embedding is), every backbone layer as `decode_layers` runs them (K/V written at `cache_index` of `slots`,
    marked valid; attending over the first `span` positions), RoPE from `rope` (`rope_tables`) at `positions`, and
    the final norm. Returns the final norm's outputs [B, W] in the model's dtype (what the text head multiplies).
    ValueError for a token outside the vocabulary, a position outside the tables, or indices out of range."""
    g = config.backbone
    w = weights.current()
    cos, sin = rope
    dtype = w.embed.dtype
    tensors = (tokens, cache.k, cache.v, cache.valid, slots, cache_index, positions, cos, sin)
    if not all(t.is_contiguous() and t.device.type == "cpu" for t in tensors):
        raise ValueError("the CPU kernel needs contiguous CPU tensors")
    if cache.k.dtype != dtype:
        raise ValueError(f"the CPU kernel needs the cache in the model's dtype ({dtype}), not {cache.k.dtype}")
    if cos.dtype != dtype or sin.dtype != dtype:
        raise ValueError(f"the CPU kernel needs the RoPE tables in the model's dtype ({dtype})")
    if any(t.dtype != torch.long for t in (tokens, slots, cache_index, positions)):
        raise ValueError("the CPU kernel needs long tokens and indices")
    b = len(tokens)
    out = torch.empty(b, g.width, dtype=dtype)
    status = load().oxy_decode_step(
        DTYPES[dtype], b, g.width, g.num_heads, g.num_kv_heads, g.head_dim, g.mlp_dim, g.depth, g.rms_eps,
        tokens.data_ptr(), w.embed.data_ptr(), w.embed.shape[0], w.scale, w.layers, w.norm.data_ptr(),
        cache.k.data_ptr(), cache.v.data_ptr(), cache.num_slots, cache.max_len, cache.valid.data_ptr(),
        slots.data_ptr(), cache_index.data_ptr(), positions.data_ptr(), span, cos.data_ptr(), sin.data_ptr(),
        cos.shape[0], out.data_ptr())
    _check_status(status)
    return out


def check_supported(model: torch.nn.Module) -> None:
    """ValueError unless `model` (a Pi05Model) is one the kernel runs: on the CPU, float32 or bfloat16."""
    if model.device.type != "cpu":
        raise ValueError(f"the CPU kernel runs on the CPU, not {model.device}")
    if model.dtype not in DTYPES:
        raise ValueError(f"the CPU kernel runs float32 or bfloat16, not {model.dtype}")
    g = model.config.backbone
    if g.head_dim > 1024 or g.num_heads // g.num_kv_heads > 64:
        raise ValueError("the CPU kernel supports head_dim up to 1024 and up to 64 query heads per K/V head")


def decode_layers(x: Tensor, weights: ctypes.Array, config, cache, slots: Tensor, cache_index: Tensor,
                  cos: Tensor, sin: Tensor, span: int) -> Tensor:
    """Run every backbone layer on the embedded tokens x [B, W] in place (they become the last layer's hidden
    states) for requests in `slots`, writing each fed token's K/V at `cache_index` and marking it valid; cos/sin
    [B, head_dim] are the tokens' RoPE tables in x's dtype. Returns x."""
    g = config.backbone
    tensors = (x, cache.k, cache.v, cache.valid, slots, cache_index, cos, sin)
    if not all(t.is_contiguous() and t.device.type == "cpu" for t in tensors):
        raise ValueError("the CPU kernel needs contiguous CPU tensors")
    if cache.k.dtype != x.dtype:
        raise ValueError(f"the CPU kernel needs the cache in the model's dtype ({x.dtype}), not {cache.k.dtype}")
    if cos.dtype != x.dtype or slots.dtype != torch.long or cache_index.dtype != torch.long:
        raise ValueError("the CPU kernel needs the RoPE tables in the model's dtype and long indices")
    status = load().oxy_decode_layers(
        DTYPES[x.dtype], x.shape[0], g.width, g.num_heads, g.num_kv_heads, g.head_dim, g.mlp_dim, g.depth,
        g.rms_eps, x.data_ptr(), weights, cache.k.data_ptr(), cache.v.data_ptr(), cache.num_slots, cache.max_len,
        cache.valid.data_ptr(), slots.data_ptr(), cache_index.data_ptr(), span, cos.data_ptr(), sin.data_ptr())
    _check_status(status)
    return x


def _check_status(status: int) -> None:
    """ValueError for a nonzero status of `oxy_decode_layers` / `oxy_decode_step` (nothing was written then)."""
    if status != 0:
        raise ValueError({1: "the CPU kernel does not support these shapes",
                          2: "a slot or cache index is out of range for the CPU kernel",
                          3: "a token or a RoPE position is out of range for the CPU kernel"}.get(status, str(status)))


def greedy_tokens(logits: Tensor) -> Tensor:
    """`sampling.greedy_tokens` (the first maximum of each row of NaN-free logits [B, vocab]) in one compiled pass
    per row over the logits' bits; rows whose maximum is not positive are searched as floats."""
    if logits.dim() != 2 or logits.element_size() not in (2, 4) or not logits.is_floating_point() \
            or logits.device.type != "cpu" or logits.stride(-1) != 1:
        raise ValueError("the CPU kernel's greedy choice needs float logits [B, vocab] with contiguous rows on the CPU")
    rows, n = logits.shape
    tokens = torch.empty(rows, dtype=torch.long)
    load().oxy_greedy(logits.element_size(), logits.data_ptr(), rows, n, logits.stride(0), tokens.data_ptr())
    redo = (tokens < 0).nonzero()[:, 0]
    if len(redo):
        tokens[redo] = logits[redo].float().argmax(dim=-1)
    return tokens


@dataclass(frozen=True)
class HeadCopy:
    """What `head_greedy` screens a float32 head with on matrix tiles: its bfloat16 copy (rounded to nearest, half
    the head's memory) and its rows' euclidean norms (rounded up) with their largest."""

    bf16: Tensor
    norms: Tensor
    max_norm: float

    def matches(self, head: Tensor) -> bool:
        return tuple(self.bf16.shape) == tuple(head.shape)


def head_copy(head: Tensor) -> HeadCopy:
    """The HeadCopy of a contiguous float32 CPU head [vocab, W]; made once per head (a full pass over it)."""
    if head.dim() != 2 or head.dtype != torch.float32 or not head.is_contiguous() or head.device.type != "cpu":
        raise ValueError("a head copy is made of a contiguous float32 CPU head [vocab, W]")
    norms = torch.empty(head.shape[0])
    load().oxy_row_norms(head.data_ptr(), head.shape[0], head.shape[1], norms.data_ptr())
    return HeadCopy(head.to(torch.bfloat16), norms, float(norms.max()))


def head_greedy(h: Tensor, head: Tensor, threads: int = 1, amx: bool | None = None,
                copy: HeadCopy | None = None) -> Tensor:
    """The greedy tokens [B] long of final-norm hidden states h [B, W] through the text head [vocab, W] (both
    contiguous CPU tensors in float32 or bfloat16): `sampling.greedy_tokens(h @ head.T)` without the logits, on
    `threads` threads. `amx` (default: where this build and process have it) runs on the CPU's matrix tiles:
    bfloat16 directly, float32 screened with the head's `copy` (`head_copy`) and then chosen in float32, the same
    tokens as its vector lanes. Without tiles a float32 head with its `copy` is screened alike on AVX-512 BF16's
    pair dot products (by default from HEAD_GREEDY_MIN_ROWS requests: fewer take the row path, `has_row_head`);
    False and no copy keeps vector lanes."""
    tensors = (h, head)
    if h.dim() != 2 or head.dim() != 2 or h.shape[1] != head.shape[1] or h.dtype != head.dtype \
            or h.dtype not in DTYPES or not all(t.is_contiguous() and t.device.type == "cpu" for t in tensors):
        raise ValueError("the CPU kernel's head needs contiguous CPU h [B, W] and head [vocab, W] of one float dtype")
    if amx is None:
        amx = tiles_run(h.dtype, h.shape[1]) and (h.dtype == torch.bfloat16 or copy is not None)
        if not amx and (len(h) < HEAD_GREEDY_MIN_ROWS or not screens(h.dtype, h.shape[1])):
            copy = None
    tokens = torch.empty(h.shape[0], dtype=torch.long)
    if h.dtype == torch.float32 and (amx or copy is not None):
        if copy is None or not copy.matches(head):
            raise ValueError("a float32 head screened on bfloat16 needs its head_copy")
        status = load().oxy_head_greedy_screened(int(amx), threads, h.data_ptr(), h.shape[0], h.shape[1],
                                                 head.data_ptr(), copy.bf16.data_ptr(), copy.norms.data_ptr(),
                                                 copy.max_norm, head.shape[0], tokens.data_ptr())
    else:
        status = load().oxy_head_greedy(DTYPES[h.dtype], int(amx), threads, h.data_ptr(), h.shape[0], h.shape[1],
                                        head.data_ptr(), head.shape[0], tokens.data_ptr())
    if status != 0:
        raise ValueError(f"the CPU kernel has no {'matrix tiles' if amx else 'pair dot products'} for this head here")
    return tokens


def has_amx() -> bool:
    """Whether the kernel built here has the bfloat16 matrix-tile path and this process may use the tiles."""
    return bool(load().oxy_has_amx())


def has_row_head(dtype: torch.dtype, width: int) -> bool:
    """Whether the kernel built here runs a head of this dtype and width for fewer than HEAD_GREEDY_MIN_ROWS
    requests row by row (AVX-512: float32 for widths of whole 16s, bfloat16 with AVX-512 BF16 for whole 32s; AVX2:
    float32 for whole 8s, its only head path), the way a matrix-vector product reads the head, instead of on the
    vector lanes' transposed blocks."""
    return dtype in DTYPES and bool(load().oxy_has_row_head(DTYPES[dtype], width))


def has_pair_head() -> bool:
    """Whether the kernel built here has the bfloat16 text head on AVX-512 BF16's pair dot products (even widths;
    a CPU with AVX-512 BF16 and no matrix tiles, such as AMD Zen 4, takes it on vector lanes)."""
    return bool(load().oxy_has_pair_head())


def has_avx2() -> bool:
    """Whether the kernel built here has its paths on AVX2's 8-lane registers (a CPU with AVX2 and FMA but no
    AVX-512, where GCC lowers the 16-lane vectors to register pairs and moves many of them through memory): the
    float32 text head at any batch (`has_row_head`), attention's scores, weights and sums, and the linear layers."""
    return bool(load().oxy_has_avx2())


def tiles_run(dtype: torch.dtype, width: int) -> bool:
    """Whether `head_greedy` can run a head of this dtype and width on matrix tiles here (whole 32-wide pieces of
    the width; float32 with the head's copy)."""
    return dtype in DTYPES and width % 32 == 0 and has_amx()


def screens(dtype: torch.dtype, width: int) -> bool:
    """Whether a head of this dtype and width is screened on a bfloat16 copy here (float32; it needs its
    `head_copy`): on matrix tiles, else on AVX-512 BF16's pair dot products (even widths)."""
    return dtype == torch.float32 and (tiles_run(dtype, width) or (width % 2 == 0 and has_pair_head()))


HEAD_GREEDY_MIN_ROWS = 4  # below this many requests the vector lanes lose to torch's head; the row path takes them


def head_greedy_pays(dtype: torch.dtype, rows: int, width: int) -> bool:
    """Whether a greedy step of `rows` requests takes `head_greedy` rather than torch's head and `greedy_tokens`,
    from one- and two-thread timings at the real vocabulary (docs/benchmarks.md): on matrix tiles at any batch;
    below HEAD_GREEDY_MIN_ROWS requests only where the build runs them row by row (`has_row_head`: on vector
    lanes torch's matrix-vector product reads the head faster; without software prefetches the row path reads
    even one float32 request's head faster than torch's, 2.4 against 3.0 ms on one thread and 1.4 against 3.2 on
    two); from it on vector lanes in float32 (the AVX2 head included), and in bfloat16 only on AVX-512 BF16's pair
    dot products (`has_pair_head`, even widths; widened to float32 it is 1.5-2.5x slower than torch's bfloat16
    head)."""
    if tiles_run(dtype, width):
        return True
    if rows < HEAD_GREEDY_MIN_ROWS:
        return has_row_head(dtype, width)
    return dtype == torch.float32 or (dtype == torch.bfloat16 and width % 2 == 0 and has_pair_head())


CHOICES = ("auto", "on", "off")  # model.cpu_kernel: auto = on where it runs and pays (AVX-512, AVX2 with FMA)


def auto_refusal() -> str | None:
    """Why `auto` leaves the kernel off on this CPU, or None. Its layers and heads are written for 16-lane vectors
    (AVX-512) with 8-lane paths of their own on AVX2 with FMA (`has_avx2`), and were measured faster than the eager
    step on both (docs/benchmarks.md). On a CPU with neither, the 16-lane code would lower to narrower pieces that
    nobody has measured against the eager step, so `auto` keeps the eager step there (`on` still runs the
    kernel)."""
    flags = cpu_flags()
    if "avx512f" in flags or {"avx2", "fma"} <= flags:
        return None
    return "this CPU has neither AVX-512 nor AVX2 with FMA, the vector widths the kernel was measured on"


def apply(model: torch.nn.Module, requested: str) -> str:
    """Turn the kernel on for `model` (a Pi05Model) as `requested` (one of CHOICES); returns what was done and why,
    for the start-up log. `on` raises (CpuKernelUnavailable or ValueError) where `auto` falls back to the eager
    step with the reason."""
    if requested not in CHOICES:
        raise ValueError(f"unknown cpu_kernel choice {requested!r}; choose one of {CHOICES}")
    if requested == "off":
        return "off (as configured)"
    refusal = auto_refusal() if requested == "auto" and model.device.type == "cpu" else None
    if refusal:
        return f"off (auto: {refusal})"
    try:
        model.use_cpu_kernel()
    except (CpuKernelUnavailable, ValueError) as error:
        if requested == "on":
            raise
        return f"off (auto: {str(error).splitlines()[0]})"
    return "on" if requested == "on" else "on (auto)"
