"""The green-context split under two threads, on a stand-in CUDA driver: the fleet's stage workers ask for their
streams at once from their own threads, and a share's pair of green contexts must be made exactly once (a second
pair would leak and give the two stages streams of different splits)."""

import threading
import time
from types import SimpleNamespace

import torch

from oxygen_ros.fleet import sm_partition
from oxygen_ros.fleet.sm_partition import SmGranularity, SmPartitions


class StandInDriver:
    """The driver calls SmPartitions makes, answered in Python: SM groups of the asked size, and green contexts
    that are counted and take a while to create (as the real ones do), so two threads overlap in them."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0)
    CUgreenCtxCreate_flags = SimpleNamespace(CU_GREEN_CTX_DEFAULT_STREAM=1)
    CUstream_flags = SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUdevResourceType = SimpleNamespace(CU_DEV_RESOURCE_TYPE_SM=1)

    def __init__(self, total_sms: int):
        self.total_sms = total_sms
        self.contexts = []

    def cuDevSmResourceSplitByCount(self, groups, resource, flags, wanted):  # noqa: N802 - the driver's names
        group = SimpleNamespace(sm=SimpleNamespace(smCount=wanted))
        return 0, [group], 1, SimpleNamespace(sm=SimpleNamespace(smCount=self.total_sms - wanted))

    def cuDevResourceGenerateDesc(self, groups, count):  # noqa: N802
        return 0, groups[0]

    def cuGreenCtxCreate(self, desc, device, flags):  # noqa: N802
        time.sleep(0.05)
        self.contexts.append(desc)
        return 0, len(self.contexts)

    def cuGreenCtxStreamCreate(self, context, flags, priority):  # noqa: N802
        return 0, 1000 + context

    def cuDeviceGetDevResource(self, device, kind):  # noqa: N802
        return 0, SimpleNamespace(sm=SimpleNamespace(smCount=self.total_sms))


def partitions_on(driver: StandInDriver) -> SmPartitions:
    """SmPartitions of a 132-SM compute capability 9.0 device whose driver calls go to the stand-in (its
    constructor needs a CUDA device, so the fields it sets are set here)."""
    cu = sm_partition._Driver.__new__(sm_partition._Driver)
    cu.driver = driver
    parts = SmPartitions.__new__(SmPartitions)
    parts.device, parts._cu, parts._cu_device = torch.device("cuda", 0), cu, 0
    parts.total_sms, parts.granularity, parts._splits = 132, SmGranularity.for_capability(9), {}
    parts._lock = threading.Lock()  # as the constructor makes it
    return parts


def test_two_stage_threads_asking_at_once_make_one_pair_of_green_contexts(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_stream_from_external", lambda handle, device: ("stream", handle))
    driver = StandInDriver(132)
    parts = partitions_on(driver)
    got = {}
    start = threading.Barrier(2)

    def ask(stage, share):
        start.wait()
        got[stage] = parts.stream(stage, share)

    threads = [threading.Thread(target=ask, args=("vlm", 0.5)), threading.Thread(target=ask, args=("action", 0.5))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(driver.contexts) == 2  # one split at share 0.5: its two groups, once
    assert [int(group.sm.smCount) for group in driver.contexts] == [64, 68]
    assert got == {"vlm": ("stream", 1001), "action": ("stream", 1002)}  # the two streams of that one split
    assert parts.stream("vlm", 0.5) is got["vlm"] and len(driver.contexts) == 2  # kept
