"""`model.dtype: auto`: bfloat16 only on a CPU with native bfloat16 where it measures faster, with its reason."""

import pytest
import torch

from oxygen_ros.model import precision
from oxygen_ros.model.precision import cpu_flags, head_matmul_ms, resolve_dtype


def test_cpu_flags_are_read_from_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: x\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_tile\n")
    assert cpu_flags(info) == {"fpu", "sse2", "avx512f", "avx512_bf16", "amx_tile"}
    assert cpu_flags(tmp_path / "absent") == set()


def test_auto_without_native_bf16_is_float32_without_measuring(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512f"})
    monkeypatch.setattr(precision, "head_matmul_ms", lambda *a, **k: pytest.fail("nothing to measure"))
    choice = resolve_dtype("auto", "cpu", 64, 1024)
    assert choice.dtype == torch.float32 and "no native bfloat16" in choice.reason


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
@pytest.mark.parametrize("bf16_faster", [True, False])
def test_auto_with_native_bf16_takes_the_faster_dtype(monkeypatch, flag, bf16_faster):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512f", flag})
    timings = {torch.float32: 10.0, torch.bfloat16: 4.0 if bf16_faster else 12.0}
    monkeypatch.setattr(precision, "head_matmul_ms", lambda dtype, width, vocab: timings[dtype])
    choice = resolve_dtype("auto", "cpu", 64, 257_152)
    assert choice.dtype == (torch.bfloat16 if bf16_faster else torch.float32)
    assert flag in choice.reason and "10.00 ms in float32" in choice.reason
    assert str(choice).startswith("bfloat16 (" if bf16_faster else "float32 (")


def test_explicit_and_cuda_choices_need_no_measurement(monkeypatch):
    monkeypatch.setattr(precision, "head_matmul_ms", lambda *a, **k: pytest.fail("nothing to measure"))
    assert resolve_dtype("float32", "cpu", 64, 1024).dtype == torch.float32
    assert resolve_dtype("bfloat16", "cpu", 64, 1024).dtype == torch.bfloat16
    assert resolve_dtype("auto", "cuda", 64, 1024).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float16", "cpu", 64, 1024)


def test_the_measurement_runs_on_this_cpu():
    assert head_matmul_ms(torch.float32, 64, 1024, repeats=1) > 0
    assert head_matmul_ms(torch.bfloat16, 64, 1024, repeats=1) > 0
    choice = resolve_dtype("auto", "cpu", 64, 1024)
    assert choice.dtype in (torch.float32, torch.bfloat16) and choice.reason.startswith("auto: ")
