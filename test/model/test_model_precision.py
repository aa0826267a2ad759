"""`model.dtype: auto`: bfloat16 only on a CPU with native bfloat16 where it measures faster, with its reason."""

import pytest
import torch

from oxygen_ros.model import precision
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.precision import cpu_flags, matmul_ms, probe_shapes, resolve_dtype

CFG = get_preset("fullvocab")


def test_cpu_flags_are_read_from_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: x\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_tile\n")
    assert cpu_flags(info) == {"fpu", "sse2", "avx512f", "avx512_bf16", "amx_tile"}
    assert cpu_flags(tmp_path / "absent") == set()


def test_auto_without_native_bf16_is_float32_without_measuring(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512f"})
    monkeypatch.setattr(precision, "matmul_ms", lambda *a, **k: pytest.fail("nothing to measure"))
    choice = resolve_dtype("auto", "cpu", CFG)
    assert choice.dtype == torch.float32 and "no native bfloat16" in choice.reason


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
@pytest.mark.parametrize("slower", [None, "text head", "expert MLP"])
def test_auto_with_native_bf16_takes_bf16_only_where_it_is_faster_everywhere(monkeypatch, flag, slower):
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx512f", flag})
    shapes = {shape: name for name, shape in probe_shapes(CFG).items()}

    def fake_ms(dtype, *shape):
        if dtype == torch.float32:
            return 10.0
        return 12.0 if shapes[shape] == slower else 4.0

    monkeypatch.setattr(precision, "matmul_ms", fake_ms)
    choice = resolve_dtype("auto", "cpu", CFG)
    assert choice.dtype == (torch.bfloat16 if slower is None else torch.float32)
    assert flag in choice.reason and "10.00 ms in float32" in choice.reason
    assert str(choice).startswith("bfloat16 (" if slower is None else "float32 (")


def test_explicit_and_cuda_choices_need_no_measurement(monkeypatch):
    monkeypatch.setattr(precision, "matmul_ms", lambda *a, **k: pytest.fail("nothing to measure"))
    assert resolve_dtype("float32", "cpu", CFG).dtype == torch.float32
    assert resolve_dtype("bfloat16", "cpu", CFG).dtype == torch.bfloat16
    assert resolve_dtype("auto", "cuda", CFG).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float16", "cpu", CFG)


def test_the_measurement_runs_on_this_cpu():
    assert probe_shapes(CFG)["text head"] == (16, 64, 257_152)
    assert matmul_ms(torch.bfloat16, 16, 64, 1024, repeats=1) > 0
    choice = resolve_dtype("auto", "cpu", get_preset("tiny"))
    assert choice.dtype in (torch.float32, torch.bfloat16) and choice.reason.startswith("auto: ")
