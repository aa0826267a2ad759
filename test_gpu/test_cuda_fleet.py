"""Robion on a GPU: disjoint SM partitions through green contexts, used by the stage workers and the profiler."""

import json
import time

import pytest
import torch

from oxygen_ros.commands.fleet_profile import main as profile_main
from oxygen_ros.engine.model_runner import zero_inputs
from oxygen_ros.engine.planners import Stage
from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.profiler import StageProfiler
from oxygen_ros.fleet.sm_partition import SmPartitions

DEVICE = torch.device("cuda")
pytestmark = pytest.mark.sm_partitions  # every test here asserts green-context partitions


def matmul_seconds(stream, a, b, repeats=20) -> float:
    with torch.cuda.stream(stream):
        a @ b  # warm-up
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        stream.synchronize()
    return time.perf_counter() - start


def test_green_context_groups_are_disjoint_and_limit_the_sms():
    """Shares come from the groups the driver made (it rounds what it is asked for), and a partition computes what
    the whole device does within bfloat16's rounding (cuBLAS may pick another kernel, another order of sums, for
    fewer SMs). How much longer a product takes on the smallest group is printed (`gpu_check.sh` shows it), not
    asserted: a test's verdict must not depend on the GPU's speed or what else it runs."""
    partitions = SmPartitions(DEVICE)
    total = partitions.total_sms
    assert total == torch.cuda.get_device_properties(DEVICE).multi_processor_count
    shares = partitions.shares()
    assert shares[-1] == 1.0 and len(shares) >= 3, shares
    groups = [partitions.group_sizes(s) for s in shares[:-1]]
    assert all(vlm + action <= total for vlm, action in groups)
    assert [vlm for vlm, _ in groups] == sorted({vlm for vlm, _ in groups})  # distinct, growing with the share
    share = shares[0]
    vlm, action = partitions.sm_count(Stage.VLM, share), partitions.sm_count(Stage.ACTION, round(1 - share, 6))
    assert (vlm, action) == groups[0] and vlm >= partitions.granularity.min_count
    assert partitions.stream(Stage.VLM, 1.0) is None  # the whole device: any plain stream
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    torch.cuda.synchronize()  # made on the default stream; the streams below are non-blocking and do not wait for it
    whole = matmul_seconds(torch.cuda.Stream(DEVICE), a, b)
    small = matmul_seconds(partitions.stream(Stage.VLM, share), a, b)
    # a compute-bound product on vlm/total of the SMs should take about total/vlm times as long
    print(f"bfloat16 8192^3 product on {vlm} of {total} SMs: {small / whole:.2f}x the whole device's time "
          f"({total / vlm:.2f}x if it scaled with the SMs)")
    reference = a.float() @ b.float()
    on_whole = a @ b
    part = partitions.stream(Stage.ACTION, round(1 - share, 6))
    with torch.cuda.stream(part):
        on_part = a @ b
    part.synchronize()  # the partition's own stream, rather than rely on a device-wide wait reaching a green context
    torch.cuda.synchronize()
    scale = float(reference.abs().max())
    for result in (on_whole, on_part):  # a few bfloat16 rounding steps at the largest entry
        assert float((result.float() - reference).abs().max()) <= 2**-6 * scale


def test_the_stage_workers_run_both_stages_on_their_partitions():
    profiler = StageProfiler([ModelSpec("a", "tiny")], DEVICE, max_batch=4)
    try:
        assert profiler.partition_mode == "green-context SM partitions"
        assert profiler.shares()[-1] == 1.0 and 0.5 in profiler.shares()
        runner, workers = profiler.runners["a"], profiler.workers
        config = runner.model.config
        frames = [zero_inputs(config, 1, DEVICE, runner.model.dtype) for _ in range(3)]
        torch.cuda.synchronize()  # made on the default stream, read on the workers' non-blocking ones
        done = workers.submit(Stage.VLM, 0.5, runner.prefill_stage, frames, 4).result()
        noises = [torch.randn(1, config.action_horizon, config.action_dim) for _ in frames]
        actions = workers.submit(Stage.ACTION, 0.5, runner.denoise_stage, done.slots, noises, 4).result()
        runner.free(done.slots)
        assert actions.shape[0] == 3 and torch.isfinite(actions).all() and runner.slots_in_use == 0
    finally:
        profiler.close()


def test_fleet_profile_on_cuda_records_the_sm_groups(tmp_path):
    out = tmp_path / "lut.json"
    argv = ["--models", "a=tiny:0,b=tiny:1", "--device", "cuda", "--max-batch", "4", "--shares", "0.5,1.0",
            "--repeats", "3", "--warmup", "1", "--out", str(out)]
    assert profile_main(argv) == 0
    meta = json.loads(out.read_text())["meta"]
    assert meta["share_meaning"] == "green-context SM partitions"
    counts = meta["sm_counts"]
    assert counts["vlm@0.5"] + counts["action@0.5"] <= torch.cuda.get_device_properties(DEVICE).multi_processor_count
    assert counts["vlm@1.0"] == counts["action@1.0"] == torch.cuda.get_device_properties(DEVICE).multi_processor_count
