"""The stage-process (omni) and inter-GPU baselines: hop costs, continuous batching, queue policies, and the
measured hand-offs on real tensors."""

import json
import math

import pytest
import torch

from oxygen_ros.commands import fleet_sim
from oxygen_ros.engine.frames import ActionFrame
from oxygen_ros.engine.planners import Stage
from oxygen_ros.evaluation.fleet.ipc import (
    HOPS,
    WAYS,
    hop_seconds,
    hop_tensors,
    kv_bytes_per_request,
    measure_hops,
)
from oxygen_ros.fleet.baselines import InterGpuPlanner, Link, OmniPlanner, attach_hop_costs
from oxygen_ros.fleet.profile_table import ProfileTable
from oxygen_ros.fleet.simulator import SimConfig, simulate
from oxygen_ros.fleet.traffic import RobotSpec
from oxygen_ros.model.config import get_preset

BUCKETS = (1, 2, 4, 8)
VLM_S = {1: 0.010, 2: 0.012, 4: 0.016, 8: 0.024}
ACTION_S = {1: 0.005, 2: 0.006, 4: 0.007, 8: 0.009}
IPC_S = {"input": {b: 0.001 * b for b in BUCKETS}, "kv": {b: 0.002 * b for b in BUCKETS},
         "output": {b: 0.0005 for b in BUCKETS}}
KV_BYTES = 10_000_000
LINK = Link(1e9, 1e-4)  # 10 MB per frame -> 10.1 ms per frame's K/V


def table() -> ProfileTable:
    """Two models; on half the device the VLM stage takes 1.8x, the action stage 1.2x."""
    lut = ProfileTable(meta={"source": "test"})
    for model_id in ("a", "b"):
        for b in BUCKETS:
            lut.add(model_id, Stage.VLM, b, 1.0, VLM_S[b])
            lut.add(model_id, Stage.VLM, b, 0.5, 1.8 * VLM_S[b])
            lut.add(model_id, Stage.ACTION, b, 1.0, ACTION_S[b])
            lut.add(model_id, Stage.ACTION, b, 0.5, 1.2 * ACTION_S[b])
    return attach_hop_costs(lut, IPC_S, "test", KV_BYTES, LINK, "test")


def frame(i, model_id="a", arrival=0.0, slo=1.0):
    return ActionFrame(model_id, None, False, arrival + slo, arrival, f"r{i}", context=i)


def single_frame_latency(design: str) -> float:
    robot = RobotSpec("r0", "a", rate_hz=1.0, slo_s=1.0)
    result = simulate([robot], {"r0": 0}, table(), SimConfig(design=design, duration_s=1.0, jitter=0.0))
    (only,) = result.frames
    assert only.met_deadline and result.attainment == 1.0
    return only.latency


def test_omni_frame_pays_the_stage_times_and_every_hop():
    expected = IPC_S["input"][1] + VLM_S[1] + IPC_S["kv"][1] + ACTION_S[1] + IPC_S["output"][1]
    assert single_frame_latency("omni") == pytest.approx(expected)


def test_intergpu_frame_pays_the_kv_transfer_between_its_stages():
    expected = VLM_S[1] + KV_BYTES / 1e9 + 1e-4 + ACTION_S[1]
    assert single_frame_latency("intergpu") == pytest.approx(expected)
    assert InterGpuPlanner.gpus == 2 and fleet_sim.devices_of("intergpu", 4) == (2, 4)
    assert fleet_sim.devices_of("intergpu", 1) == (1, 2) and fleet_sim.devices_of("omni", 4) == (4, 4)


def test_omni_starts_the_next_batch_when_its_stage_frees_up_and_co_runs_the_stages():
    device = OmniPlanner(table())
    device.submit(frame(0))
    (first,) = device.start(0.0)
    assert first.lane == "vlm" and not first.co_run and first.batches[0].share == 1.0  # alone: the whole device
    for i in (1, 2, 3):
        device.submit(frame(i, arrival=0.001))
    assert device.start(0.001) == []  # the VLM process is busy; nothing for the action process yet
    end = first.duration()
    assert end == pytest.approx(IPC_S["input"][1] + VLM_S[1] + IPC_S["kv"][1])
    device.finish(first, end)
    jobs = {w.lane: w for w in device.start(end)}
    # Continuous batching: the VLM stage takes the three queued frames at once, the action stage the first one,
    # and the two stage processes now share the device (half each here), both inflated by interference.
    assert [f.context for f in jobs["vlm"].batches[0].frames] == [1, 2, 3]
    assert jobs["vlm"].batches[0].bucket == 4
    assert [f.context for f in jobs["action"].batches[0].frames] == [0]
    for job in jobs.values():
        assert job.co_run and job.batches[0].share == 0.5
    assert jobs["vlm"].duration(1.1) == pytest.approx(1.1 * 1.8 * VLM_S[4] + IPC_S["input"][4] + IPC_S["kv"][4])
    assert jobs["action"].duration(1.1) == pytest.approx(1.1 * 1.2 * ACTION_S[1] + IPC_S["output"][1])
    done = device.finish(jobs["action"], end + jobs["action"].duration())
    assert [f.context for f in done] == [0]


def test_intergpu_runs_both_stages_and_the_link_at_once_on_whole_devices():
    device = InterGpuPlanner(table())
    device.submit(frame(0))
    (vlm,) = device.start(0.0)
    device.submit(frame(1, arrival=0.001))
    t = VLM_S[1]
    device.finish(vlm, t)
    started = {w.lane: w for w in device.start(t)}
    assert set(started) == {"link", "vlm"}  # the K/V leaves while the VLM GPU takes the next batch
    assert started["link"].duration() == pytest.approx(KV_BYTES / 1e9 + 1e-4)
    assert [f.context for f in started["link"].payload.frames] == [0]
    device.finish(started["link"], t + started["link"].duration())
    (action,) = device.start(t + started["link"].duration())
    assert action.lane == "action" and device.busy[Stage.VLM]  # both GPUs busy together
    for job in (action, started["vlm"]):
        assert not job.co_run and job.batches[0].share == 1.0


@pytest.mark.parametrize("design", [OmniPlanner, InterGpuPlanner])
def test_the_queue_policy_picks_the_model(design):
    def first_model(policy, frames):
        device = design(table(), policy=policy)
        for f in frames:
            device.submit(f)
        (job,) = device.start(0.0)
        return job.batches[0].model_id

    urgent_b = [frame(0, "a", slo=0.5), frame(1, "a", slo=0.5), frame(2, "b", slo=0.05)]
    assert first_model("esf", urgent_b) == "b"  # least slack first
    assert first_model("lqf", urgent_b) == "a"  # longest queue first
    device = design(table(), policy="rr")
    served = []
    for i in range(4):
        device.submit(frame(2 * i, "a"))
        device.submit(frame(2 * i + 1, "b"))
    for step in range(2):
        vlm = next(w for w in device.start(float(step)) if w.lane == "vlm")
        served.append(vlm.batches[0].model_id)
        device.finish(vlm, float(step) + 0.5)
    assert served == ["a", "b"]  # round-robin alternates


def test_designs_without_hop_costs_say_what_is_missing():
    bare = ProfileTable({k: v for k, v in table().entries.items()}, {"source": "test"})
    with pytest.raises(ValueError, match="ipc_s"):
        OmniPlanner(bare)
    with pytest.raises(ValueError, match=r"'input' hand-off for batch buckets \[16\]"):
        OmniPlanner(table(), max_batch=16)
    with pytest.raises(ValueError, match="kv_bytes_per_request"):
        InterGpuPlanner(bare)


def test_hop_payloads_have_the_model_shapes():
    config = get_preset("tiny")
    kv = hop_tensors(config, "kv", 4, torch.bfloat16)["kv"]
    b = config.backbone
    assert kv.shape == (b.depth, 2, 4, b.num_kv_heads, config.prefix_len, b.head_dim) and kv.dtype == torch.bfloat16
    assert kv.numel() * kv.element_size() == 4 * kv_bytes_per_request(config, torch.bfloat16)
    assert kv_bytes_per_request(get_preset("pi05"), torch.bfloat16) == 18 * 2 * 1 * (3 * 256 + 200) * 256 * 2
    with pytest.raises(ValueError, match="hop"):
        hop_tensors(config, "nope", 1, torch.float32)


def test_measured_hand_offs_on_real_tensors_feed_the_simulator(tmp_path):
    report = measure_hops(get_preset("small"), "small", [1, 2], torch.float32, repeats=3, warmup=1)
    assert set(report["seconds"]) == set(WAYS)
    for way in WAYS:
        assert set(report["seconds"][way]) == set(HOPS)
        for hop in HOPS:
            times = report["seconds"][way][hop]
            assert set(times) == {"1", "2"} and all(0 < s < math.inf for s in times.values())
    for hop in HOPS:
        assert report["bytes"][hop]["2"] > report["bytes"][hop]["1"] > 0
    pipe_kv = report["seconds"]["pipe"]["kv"]
    assert pipe_kv["2"] > 0.5 * pipe_kv["1"]  # twice the bytes is not faster (a generous bound: the machine is shared)
    assert report["meta"]["kv_bytes_per_request"] == kv_bytes_per_request(get_preset("small"), torch.float32)
    assert hop_seconds(report, "pipe")["kv"][2] == pipe_kv["2"]

    path = tmp_path / "ipc.json"
    path.write_text(json.dumps(report))
    out = tmp_path / "sim"
    code = fleet_sim.main(["--out", str(out), "--runs", "omni:esf,intergpu:rr", "--assign", "", "--gpus", "1",
                               "--models", "2", "--seeds", "1", "--max-robots", "8", "--duration", "1",
                               "--max-batch", "2", "--ipc", str(path), "--ipc-way", "pipe"])
    assert code == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert runs["omni:esf"]["gpus_used"] == 1 and runs["intergpu:rr"]["gpus_used"] == 2
    assert runs["intergpu:rr"]["robots_per_gpu_median"] == runs["intergpu:rr"]["robots_median"] / 2
