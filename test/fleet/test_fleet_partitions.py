"""How lockstep shares become SM groups on a GPU (the arithmetic; the driver calls run in test_gpu/)."""

import math

import pytest
import torch

from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.profiler import StageProfiler
from oxygen_ros.fleet.sm_partition import SmGranularity, SmPartitions, split_shares, vlm_group_size
from oxygen_ros.model.precision import default_dtype

HOPPER = SmGranularity.for_capability(9)


def test_granularity_follows_the_compute_capability():
    assert HOPPER == SmGranularity(8, 8)
    assert SmGranularity.for_capability(8) == SmGranularity(4, 2)
    assert SmGranularity.for_capability(7) == SmGranularity(2, 2)
    assert SmGranularity.for_capability(6) == SmGranularity(1, 1)


def test_vlm_group_rounds_down_to_the_alignment_and_leaves_the_other_stage_enough():
    # an H200 / H100 SXM has 132 SMs
    assert [vlm_group_size(132, s, HOPPER) for s in (0.1, 0.25, 0.5, 0.9)] == [8, 32, 64, 112]
    assert vlm_group_size(16, 0.5, HOPPER) == 8
    assert vlm_group_size(108, 0.5, SmGranularity.for_capability(8)) == 54  # an A100: multiples of 2
    with pytest.raises(ValueError, match="fewer than 8"):
        vlm_group_size(12, 0.5, HOPPER)
    for share in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="0 < share < 1"):
            vlm_group_size(132, share, HOPPER)


def asked(total: int, granularity: SmGranularity = HOPPER):
    """The first group's size as asked (a driver that makes what it is asked for)."""
    return lambda share: vlm_group_size(total, share, granularity)


def test_profiled_shares_are_distinct_groups_in_complementary_pairs():
    assert split_shares(132, asked(132)) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert split_shares(16, asked(16)) == [0.5, 1.0]  # 8 + 8 is the only split; 0.5 is its true fraction
    assert split_shares(24, asked(24)) == [0.3, 0.7, 1.0]
    assert split_shares(8, asked(8)) == [1.0]  # too small to split: the whole device only
    for total in (16, 24, 40, 66, 132):
        shares = split_shares(total, asked(total))
        assert all(round(1 - s, 6) in shares for s in shares[:-1])


def test_shares_follow_the_groups_the_driver_makes_not_the_ones_asked_for():
    """A 9.x device under a driver that reports a co-scheduling alignment of 2 still makes groups of multiples of
    8 (and none that leaves the other group fewer than 8). On 66 SMs the tenths asked in multiples of 2 would all
    differ; made, 0.4 and 0.5 both get 32 SMs (0.5 is the nearer fraction, so 0.4 goes, and 0.6 with it), and 0.9's
    64 would leave 2 (so 0.9 goes, and 0.1 with it)."""
    fine = asked(66, SmGranularity(8, 2))

    def made(share):
        count = 8 * math.ceil(fine(share) / 8)
        if 66 - count < 8:
            raise ValueError("no split")
        return count

    assert split_shares(66, fine) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    shares = split_shares(66, made)
    assert shares == [0.2, 0.3, 0.5, 0.7, 0.8, 1.0]
    assert [made(s) for s in shares[:-1]] == [16, 24, 32, 48, 56]


def test_a_cpu_device_offers_thread_budgets_and_no_sm_partitions():
    profiler = StageProfiler([ModelSpec("a", "tiny")], "cpu", max_batch=2, cpu_threads=2)
    try:
        assert profiler.partitions is None and profiler.partition_mode == "CPU thread budget"
        assert profiler.shares() == [0.5, 1.0] and profiler.workers.threads_for(0.5) == 1
        assert profiler.dtype == profiler.runners["a"].model.dtype == torch.float32
    finally:
        profiler.close()
    # the fleet's default precision: bfloat16 on CUDA (its profile table in what a GPU deployment serves)
    assert [default_dtype(d) for d in ("cuda", "cuda:1", "cpu")] == [torch.bfloat16, torch.bfloat16, torch.float32]
    with pytest.raises(ValueError, match="CUDA device"):
        SmPartitions(torch.device("cpu"))
