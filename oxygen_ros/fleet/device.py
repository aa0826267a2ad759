"""The device a fleet server runs on: which torch device, and what a share of it means there.

A stage split runs its two stages side by side on complementary shares of the device: on a CPU a share is a thread
budget (multiples of one core), on a GPU a group of SMs (green-context partitions, `sm_partition.py`, where the
driver and NVIDIA's ``cuda-bindings`` have them; otherwise plain streams, whose shares overlap and are not
enforced, which is said once).
"""

from __future__ import annotations

import warnings

import torch

from ..engine.stage_workers import StageWorkers
from .sm_partition import SmPartitions


def serving_device(device: str, gpu_index: int, cuda_devices: int | None = None) -> str:
    """The torch device a server runs on: ``cuda`` means the assignment's GPU ``cuda:<gpu_index>``; an explicit
    ``cuda:N`` is kept (e.g. a remapped GPU list); ``cpu`` ignores the index. `cuda_devices` (default: what torch
    sees) bounds the index, so a wrong one is an error at start-up, not a crash at the first frame."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return device
    if gpu_index < 0:
        raise ValueError(f"gpu_index must be >= 0, got {gpu_index}")
    chosen = int(index) if index else gpu_index
    count = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if chosen >= count:
        raise ValueError(f"device cuda:{chosen} does not exist ({count} CUDA devices visible)")
    return f"cuda:{chosen}"


def device_partitions(device: torch.device, sm_partitions: bool = True) -> tuple[SmPartitions | None, str]:
    """The SM partitions of a CUDA device (None on a CPU or where green contexts are unavailable, said once) and
    what a share means there."""
    if device.type == "cpu":
        return None, "CPU thread budget"
    if not sm_partitions:
        return None, "plain streams (not enforced)"
    try:
        return SmPartitions(device), "green-context SM partitions"
    except (ImportError, RuntimeError) as error:
        warnings.warn(f"GPU shares are not enforced: SM partitions are unavailable ({error})", stacklevel=2)
        return None, f"plain streams (not enforced: {error})"


def device_shares(workers: StageWorkers, partitions: SmPartitions | None) -> list[float]:
    """The partition choices a device offers: multiples of one core on a CPU; on a GPU the tenths whose SM groups
    the hardware can make (every tenth without partitions)."""
    if workers.device.type == "cpu":
        return workers.cpu_shares()
    if partitions is not None:
        return partitions.shares()
    return [round(0.1 * k, 1) for k in range(1, 11)]
