"""Energy accounting of the benchmark through NVML's total energy counter, with a stand-in NVML module (the real
one needs an NVIDIA driver): the reading code is the benchmark's own, the counter is ours, so every figure is known."""

import pytest

from oxygen_ros.evaluation.bench.energy import open_energy_meter, per_unit
from oxygen_ros.evaluation.bench.modes import RUNNERS, Workload
from oxygen_ros.evaluation.bench.oxygen_bench import summarize
from oxygen_ros.evaluation.bench.workloads import arrivals, synthetic_frames
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.pi05 import build_model

CONFIG = get_preset("tiny")


class NVMLError(Exception):
    pass


class FakeNVML:
    """pynvml's calls the meter makes; the counter advances `step_mj` millijoules per reading."""

    NVMLError = NVMLError

    def __init__(self, step_mj: int = 250, fail: str | None = None):
        self.counter_mj = 10_000
        self.step_mj = step_mj
        self.fail = fail
        self.handles = []

    def nvmlInit(self):
        if self.fail == "init":
            raise NVMLError("Driver Not Loaded")

    def nvmlDeviceGetHandleByIndex(self, index):
        self.handles.append(("index", index))
        return ("gpu", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handles.append(("uuid", uuid))
        return ("gpu", uuid)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if self.fail == "energy":
            raise NVMLError("Not Supported")
        self.counter_mj += self.step_mj
        return self.counter_mj


def test_meter_reads_the_counter_of_the_right_gpu_in_joules():
    nvml = FakeNVML(step_mj=1500)
    meter, note = open_energy_meter("cuda:1", nvml=nvml)
    assert meter is not None and "NVML total energy counter of cuda:1" in note
    assert nvml.handles == [("index", 1)]
    assert meter.read_j() - meter.read_j() == pytest.approx(-1.5)
    _, _ = open_energy_meter("cuda", nvml=nvml, uuid="1234-abcd")
    assert nvml.handles[-1] == ("uuid", "GPU-1234-abcd")


@pytest.mark.parametrize("device,fail,reason", [
    ("cpu", None, "energy: not measured (no GPU)"),
    ("cuda", "init", "energy: not measured (NVML: Driver Not Loaded)"),
    ("cuda", "energy", "energy: not measured (NVML: Not Supported)"),
])
def test_no_gpu_or_no_counter_is_reported_not_zeroed(device, fail, reason):
    meter, note = open_energy_meter(device, nvml=FakeNVML(fail=fail))
    assert meter is None and note == reason
    assert per_unit(None, 10, 500) == {"energy_j": None, "energy_j_per_frame": None, "energy_j_per_token": None}


def test_without_the_nvml_package_the_reason_says_so(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    meter, note = open_energy_meter("cuda:0")
    assert meter is None and note == "energy: not measured (no NVML: install nvidia-ml-py, the gpu extra)"


def test_window_energy_becomes_per_frame_and_per_token_figures():
    """Real runs of the tiny model through two settings, the counter read at the measured window's start and end
    only: 0.25 J per reading pair, 2 rounds, so 0.5 J over the frames and tokens the rounds measured."""
    model = build_model(CONFIG, seed=3)
    nvml = FakeNVML(step_mj=250)
    meter, _ = open_energy_meter("cuda", nvml=nvml)
    frames, noises = synthetic_frames(CONFIG, 6, seed=2)
    workload = Workload(frames, noises, arrivals("every_frame", 6), decode_len=4, num_steps=2, warmup_frames=2,
                        energy_j=meter.read_j)
    for setting in ("action_only", "baseline"):
        runs = [RUNNERS[setting](model, workload) for _ in range(2)]
        assert [run.energy_j for run in runs] == pytest.approx([0.25, 0.25])
        record = summarize(runs, workload, model_bytes=1)
        assert record["frames"] == 8 and record["energy_j"] == pytest.approx(0.5)
        assert record["energy_j_per_frame"] == pytest.approx(0.5 / 8)
        tokens = sum(run.tokens_generated for run in runs)
        if setting == "action_only":
            assert tokens == 0 and record["energy_j_per_token"] is None
        else:
            assert tokens == 8 * 4 and record["energy_j_per_token"] == pytest.approx(0.5 / 32)
