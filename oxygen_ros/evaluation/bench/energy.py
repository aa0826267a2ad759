"""GPU energy for the benchmark: NVML's total energy counter, read around each measured window.

`nvmlDeviceGetTotalEnergyConsumption` gives the millijoules a GPU has used since the driver loaded (Volta and
newer), so the energy of a window is the difference of two readings; divided by the window's frames and tokens it
gives joules per frame and per generated token, the figures the OxyGen paper reports. Without a GPU, or without
NVML (the `nvidia-ml-py` package, the `gpu` extra), nothing is measured and the reason says why: a report never
shows a zero it did not measure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EnergyMeter:
    """One GPU's energy counter: `read_j()` is the joules used so far (only differences mean anything)."""

    nvml: Any  # the pynvml module, or an object with the same three calls
    handle: Any

    def read_j(self) -> float:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3


def open_energy_meter(device: str, nvml: Any = None, uuid: str | None = None) -> tuple[EnergyMeter | None, str]:
    """(meter, what it measures) for torch device `device`, or (None, why energy is not measured).

    `uuid`: the GPU's UUID as torch reports it (so the meter reads the same GPU whatever CUDA_VISIBLE_DEVICES
    renumbers); without it the CUDA index is taken as NVML's index. `nvml`: the module to use (default: pynvml)."""
    if not device.startswith("cuda"):
        return None, "energy: not measured (no GPU)"
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, "energy: not measured (no NVML: install nvidia-ml-py, the gpu extra)"
    index = int(device.partition(":")[2] or 0)
    try:
        nvml.nvmlInit()
        if uuid is not None:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        meter = EnergyMeter(nvml, handle)
        meter.read_j()
    except Exception as error:  # NVMLError and its subclasses: no counter on this GPU or driver
        return None, f"energy: not measured (NVML: {error})"
    return meter, f"energy: NVML total energy counter of {device}"


def cuda_uuid(device: str) -> str | None:
    """The UUID torch reports for a CUDA device, or None where it does not."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(torch.device(device)), "uuid", None)
    return None if uuid is None else str(uuid)


def per_unit(joules: float | None, frames: int, tokens: int) -> dict[str, float | None]:
    """Joules per frame and per generated token of a window (None where not measured or nothing was made)."""
    return {
        "energy_j": joules,
        "energy_j_per_frame": joules / frames if joules is not None and frames else None,
        "energy_j_per_token": joules / tokens if joules is not None and tokens else None,
    }
