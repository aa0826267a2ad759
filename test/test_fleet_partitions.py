"""How lockstep shares become SM groups on a GPU (the arithmetic; the driver calls run in test_gpu/)."""

import pytest
import torch

from oxygen_ros.fleet.model_runner import ModelRunner, ModelSpec
from oxygen_ros.fleet.requests import Stage
from oxygen_ros.fleet.sm_partition import SmGranularity, SmPartitions, split_shares, vlm_group_size

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


def test_profiled_shares_are_distinct_groups_in_complementary_pairs():
    assert split_shares(132, HOPPER) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert split_shares(16, HOPPER) == [0.5, 1.0]  # 8 + 8 is the only split; 0.5 is its true fraction
    assert split_shares(24, HOPPER) == [0.3, 0.7, 1.0]
    assert split_shares(8, HOPPER) == [1.0]  # too small to split: the whole device only
    for total in (16, 24, 40, 66, 132):
        shares = split_shares(total, HOPPER)
        assert all(round(1 - s, 6) in shares for s in shares[:-1])


def test_a_cpu_runner_uses_thread_budgets_and_no_sm_partitions():
    runner = ModelRunner([ModelSpec("a", "tiny")], "cpu", max_batch=2, max_inflight=4, cpu_threads=2)
    try:
        assert runner.partitions is None and runner.partition_mode == "CPU thread budget"
        assert runner.shares() == [0.5, 1.0] and runner.sm_count(Stage.VLM, 0.5) is None
    finally:
        runner.close()
    with pytest.raises(ValueError, match="CUDA device"):
        SmPartitions(torch.device("cpu"))
