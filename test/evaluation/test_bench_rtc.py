"""The guidance cost benchmark runs in the dtype and on the device it is given (the GPU run is the lead's: pi05 in
bfloat16 on CUDA), and its guided rounds are guided (a fallback would time the plain sampler twice)."""

import torch

from oxygen_ros.evaluation.bench import rtc_bench


def test_bench_times_plain_and_guided_in_bfloat16(capsys, monkeypatch):
    built = []
    build = rtc_bench.build_on_device

    def spy(config, device, dtype, seed=0):
        built.append((str(device), dtype))
        return build(config, device, dtype, seed)

    monkeypatch.setattr(rtc_bench, "build_on_device", spy)
    rtc_bench.main(["--presets", "tiny", "--batches", "2", "--repeats", "1", "--threads", "1",
                    "--device", "cpu", "--dtype", "bfloat16"])
    assert built == [("cpu", torch.bfloat16)]
    lines = capsys.readouterr().out.splitlines()
    assert "bfloat16" in lines[0] and "CPU" in lines[0]
    preset, batch, steps, plain, guided, ratio = lines[-1].split()
    assert (preset, batch) == ("tiny", "2") and float(plain) > 0 and float(guided) > 0
    assert abs(float(ratio) - float(guided) / float(plain)) < 0.01 * float(ratio) + 0.01


def test_guided_rows_are_guided_in_bfloat16():
    row = rtc_bench.time_guidance("tiny", 1, 1, "cpu", torch.bfloat16)  # raises if any row fell back
    assert row["steps"] > 0 and row["guided_ms"] > 0
