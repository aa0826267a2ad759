"""Disjoint SM partitions of one GPU for the two stages of a lockstep, through CUDA green contexts.

A lockstep gives the VLM stage share ``s`` of the device and the action stage ``1 - s``. On a GPU the shares are
SM counts: the device's SMs are split once per ``s`` into a first group of about ``s`` of them (rounded down to what
the hardware can partition) and the remaining group, each becomes a green context with its own stream, and the
VLM stage issues on the first group's stream, the action stage on the remaining group's. The two groups never
share an SM, so a co-running stage cannot take SMs from the other. Share 1.0 is the whole device (a plain stream).

The group asked for is only a request: the driver rounds it to its own granularity (on compute capability 9.x to
multiples of 8 SMs, whatever alignment a newer driver reports), so the shares offered and every SM count reported
are those of the groups the driver actually makes (``cuDevSmResourceSplitByCount`` without a context is cheap).

Green contexts are created with CUDA's driver API through the ``cuda-bindings`` package (``cuda.bindings.driver``),
not with ``torch.cuda.green_contexts``: torch's ``GreenContext.create(num_sms)`` always takes the first group of a
fresh split, so two of them overlap instead of dividing the device.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..engine.planners import Stage


@dataclass(frozen=True)
class SmGranularity:
    """The smallest SM group the driver makes and the multiple group sizes come in, per compute capability
    (CUDA driver API, green contexts: 6.x 1/1, 7.x 2/2, 8.x 4/2, 9.0 and later 8/8)."""

    min_count: int
    alignment: int

    @classmethod
    def for_capability(cls, major: int) -> SmGranularity:
        if major >= 9:
            return cls(8, 8)
        if major == 8:
            return cls(4, 2)
        if major == 7:
            return cls(2, 2)
        return cls(1, 1)


def vlm_group_size(total_sms: int, vlm_share: float, granularity: SmGranularity) -> int:
    """SMs asked for the VLM stage's group at share ``vlm_share`` (0 < share < 1): the share of the device rounded
    down to the alignment, at least the minimum, and leaving at least the minimum for the action group."""
    if not 0 < vlm_share < 1:
        raise ValueError(f"a split needs 0 < share < 1, got {vlm_share}")
    step = granularity.alignment
    count = max(granularity.min_count, math.floor(vlm_share * total_sms / step) * step)
    if total_sms - count < granularity.min_count:
        raise ValueError(
            f"share {vlm_share} of {total_sms} SMs leaves fewer than {granularity.min_count} SMs for the other stage"
        )
    return count


def split_shares(total_sms: int, group_of: Callable[[float], int], candidates: int = 10) -> list[float]:
    """Shares to profile on a GPU: of the tenths (``1/candidates``) whose first group has the same size, the one
    closest to that group's true fraction; only those whose complement is there too (a lockstep splits into pairs);
    and 1.0. ``group_of(share)``: the SMs of the first group made at ``share`` (ValueError where none can be)."""
    best: dict[int, float] = {}
    for k in range(1, candidates):
        share = round(k / candidates, 6)
        try:
            count = group_of(share)
        except ValueError:
            continue
        if count not in best or abs(share - count / total_sms) < abs(best[count] - count / total_sms):
            best[count] = share
    kept = set(best.values())
    return sorted(s for s in kept if round(1 - s, 6) in kept) + [1.0]


class _Driver:
    """The few driver calls green contexts need; every call's status is checked."""

    def __init__(self):
        from cuda.bindings import driver  # the cuda-bindings package (NVIDIA's CUDA Python)

        self.driver = driver

    def check(self, result):
        status, *values = result if isinstance(result, tuple) else (result,)
        if status != self.driver.CUresult.CUDA_SUCCESS:
            _, name = self.driver.cuGetErrorName(status)
            raise RuntimeError(f"CUDA driver call failed: {name!r}")
        return values[0] if len(values) == 1 else values


@dataclass
class _Split:
    vlm_stream: torch.cuda.Stream
    action_stream: torch.cuda.Stream
    contexts: tuple  # the green contexts, kept alive with their streams


class SmPartitions:
    """Green-context stream pairs of one CUDA device, made on first use per VLM share and kept."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError("SM partitions need a CUDA device")
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self._cu = _Driver()
        torch.zeros(1, device=self.device)  # initialise CUDA and make the device's primary context exist
        self._cu_device = self._cu.check(self._cu.driver.cuDeviceGet(index))
        properties = torch.cuda.get_device_properties(index)
        sm = self._device_resource().sm
        self.total_sms = int(sm.smCount) or properties.multi_processor_count
        # groups are asked for in the coarser of the table and what a newer driver reports (on 9.x it still rounds
        # to multiples of 8 where it reports a finer co-scheduling alignment); what it makes is read back anyway
        table = SmGranularity.for_capability(properties.major)
        self.granularity = SmGranularity(max(table.min_count, int(getattr(sm, "minSmPartitionSize", 0))),
                                         max(table.alignment, int(getattr(sm, "smCoscheduledAlignment", 0))))
        self._splits: dict[float, _Split] = {}
        # stage workers ask for their streams from their own threads: one lock, so a share's green contexts are
        # made once (two threads making them at once would leak a pair and hand the stages different streams)
        self._lock = threading.Lock()

    def _device_resource(self):
        drv = self._cu.driver
        return self._cu.check(drv.cuDeviceGetDevResource(self._cu_device, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))

    def shares(self) -> list[float]:
        return split_shares(self.total_sms, lambda share: self.group_sizes(share)[0])

    def group_sizes(self, vlm_share: float) -> tuple[int, int]:
        """The SMs of the VLM group and of the remaining group that the driver makes at ``vlm_share`` (no context
        is created); ValueError where it makes no split of two groups."""
        first, remaining = self._driver_split(round(vlm_share, 6))
        return int(first.sm.smCount), int(remaining.sm.smCount)

    def _driver_split(self, vlm_share: float):
        """The driver's split at ``vlm_share``: (the VLM group, the remaining group) as resources; ValueError
        where it makes no split of two groups."""
        wanted = vlm_group_size(self.total_sms, vlm_share, self.granularity)
        groups, count, remaining = self._cu.check(
            self._cu.driver.cuDevSmResourceSplitByCount(1, self._device_resource(), 0, wanted))
        if count != 1 or min(int(groups[0].sm.smCount), int(remaining.sm.smCount)) < self.granularity.min_count:
            raise ValueError(f"share {vlm_share} of {self.total_sms} SMs: the driver made no two groups "
                             f"({count} of {wanted} asked)")
        return groups[0], remaining

    def _split(self, vlm_share: float) -> _Split:
        key = round(vlm_share, 6)
        with self._lock:
            if key not in self._splits:
                self._splits[key] = self._make_split(key)
            return self._splits[key]

    def _make_split(self, vlm_share: float) -> _Split:
        """The two green contexts of the driver's split at ``vlm_share``, each with its stream."""
        drv, check = self._cu.driver, self._cu.check
        first, remaining = self._driver_split(vlm_share)
        streams, contexts = [], []
        for group in (first, remaining):
            desc = check(drv.cuDevResourceGenerateDesc([group], 1))
            context = check(drv.cuGreenCtxCreate(desc, self._cu_device,
                                                 drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
            handle = check(drv.cuGreenCtxStreamCreate(context, drv.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
            contexts.append(context)
            streams.append(torch.cuda.get_stream_from_external(int(handle), self.device))
        return _Split(streams[0], streams[1], tuple(contexts))

    def stream(self, stage: Stage, share: float) -> torch.cuda.Stream | None:
        """The stream a stage issues on at ``share`` (None: the whole device, any plain stream will do)."""
        if share >= 1.0:
            return None
        if Stage(stage) is Stage.VLM:
            return self._split(share).vlm_stream
        return self._split(round(1 - share, 6)).action_stream

    def sm_count(self, stage: Stage, share: float) -> int:
        """The SMs a stage really gets at ``share`` (what the driver made, after rounding; no context is made)."""
        if share >= 1.0:
            return self.total_sms
        if Stage(stage) is Stage.VLM:
            return self.group_sizes(share)[0]
        return self.group_sizes(round(1 - share, 6))[1]
