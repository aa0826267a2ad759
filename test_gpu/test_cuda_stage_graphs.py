"""CUDA graphs in the fleet's stage split: on every partition a stage uses, the action stage replayed from its
graph gives the eager actions, the graph was captured on that partition's stream and replays there, stages side
by side on complementary partitions stay equal to eager (within the tolerance of the profiler's dtype, bfloat16 on
CUDA), and the fleet server serves with graphs on."""

import torch

from oxygen_ros.engine.frames import bucket_for
from oxygen_ros.engine.planners import Stage
from oxygen_ros.engine.runtime import RuntimeConfig
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.evaluation.bench.workloads import synthetic_frames
from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.profiler import StageProfiler
from oxygen_ros.fleet.server import FleetServer, ServedRobot
from oxygen_ros.model.cuda_graphs import stream_key

from engine_fixtures import TINY, observation
from gpu_precision import tolerance

DEVICE = torch.device("cuda")


def frames(count: int, first: int = 0) -> list:
    made, _ = synthetic_frames(TINY, 4, seed=21, device=DEVICE)  # made here: collecting needs no GPU
    return [made[(first + i) % len(made)] for i in range(count)]


def noises(count: int, first: int = 0) -> list[torch.Tensor]:
    """The same noise for the same frames in every run (eager and graphed)."""
    generator = torch.Generator().manual_seed(first)
    return [torch.randn(1, TINY.action_horizon, TINY.action_dim, generator=generator) for _ in range(count)]


def vlm(profiler: StageProfiler, batch: list, share: float):
    """Start a batch's VLM stage on its worker at `share`; the future holds its slots."""
    return profiler.workers.submit(Stage.VLM, share, profiler.runners["a"].prefill_stage, batch,
                                   bucket_for(len(batch), 4))


def action(profiler: StageProfiler, slots: list[int], noise: list, share: float):
    """Start the action stage of prefilled slots on its worker at `share`; the future holds the actions."""
    runner = profiler.runners["a"]
    return profiler.workers.submit(Stage.ACTION, share, lambda: runner.denoise_stage(slots, noise,
                                                                                      bucket_for(len(slots), 4)).cpu())


def both_stages(profiler: StageProfiler, batch: list, first: int, vlm_share: float, action_share: float):
    slots = vlm(profiler, batch, vlm_share).result().slots
    actions = action(profiler, slots, noises(len(batch), first), action_share).result()
    profiler.runners["a"].free(slots)
    return actions


def test_stage_graphs_replay_the_eager_actions_on_every_partition():
    specs = [ModelSpec("a", "tiny", 3)]
    eager = StageProfiler(specs, DEVICE, max_batch=4)
    graphed = StageProfiler(specs, DEVICE, max_batch=4, cuda_graphs=True)
    try:
        shares = graphed.shares()
        splits = sorted({shares[0], shares[len(shares) // 2 - 1]} - {1.0})
        used = splits + [1.0]
        for share in used:  # the action stage on share: its own SM partition (or the whole device)
            for count in (1, 3, 3):  # bucket 1, bucket 4 with a padding row, bucket 4 replayed
                expected = both_stages(eager, frames(count), 0, 1.0, share)
                actions = both_stages(graphed, frames(count), 0, 1.0, share)
                torch.testing.assert_close(actions, expected, **tolerance(eager.dtype), msg=f"share {share}")
        graphs = graphed.runners["a"].model._graphs
        worker = graphed.workers[Stage.ACTION]
        streams = {stream_key(worker._stream_for(s)) for s in used}
        assert set(graphs._by_stream) == streams  # one set of graphs per partition stream, captured there
        assert graphs.captures == 2 * len(streams)  # buckets 1 and 4 on each
        for key, per_stream in graphs._by_stream.items():
            assert stream_key(per_stream._streams["denoise"]) == key
        # a VLM batch and an action batch side by side on complementary partitions, graphs replayed
        share = splits[0]
        captures = graphs.captures
        results = []
        for profiler in (eager, graphed):
            # two batches of two between their stages: the profiler's 4 frame slots (max_batch) hold both
            prev = vlm(profiler, frames(2, first=1), 1.0 - share).result().slots
            new_vlm = vlm(profiler, frames(2), share)
            prev_actions = action(profiler, prev, noises(2, 1), round(1 - share, 6)).result()
            new = new_vlm.result().slots
            new_actions = action(profiler, new, noises(2), round(1 - share, 6)).result()
            profiler.runners["a"].free(prev + new)
            results.append((prev_actions, new_actions))
        for got, want in zip(results[1], results[0]):
            torch.testing.assert_close(got, want, **tolerance(eager.dtype))
        assert stream_key(worker._stream_for(round(1 - share, 6))) in graphs._by_stream
        assert graphs.captures > captures  # bucket 2 is new there
    finally:
        eager.close()
        graphed.close()


def test_fleet_server_serves_with_stage_graphs(tokenizer):
    robots = [ServedRobot("r1", "a", 30.0), ServedRobot("r2", "a", 30.0)]
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=12, frame_slots=8)
    chunks = []
    server = FleetServer([ModelSpec("a", "tiny")], robots, config, lambda model: tokenizer, device="cuda",
                         on_chunk=chunks.append, design="robion", profile_repeats=1, cuda_graphs=True)
    server.start()
    try:
        for i in range(3):
            for robot in ("r1", "r2"):
                assert server.submit(robot, observation(i), i == 0, stamp_ns=10 * i + 1, age_s=0.0, context=i)
        assert server.runtime.drain(120)
    finally:
        server.close()
    assert sorted((c.robot_id, c.context) for c in chunks) == [(r, i) for r in ("r1", "r2") for i in range(3)]
    assert all(c.error is None and torch.isfinite(c.actions).all() for c in chunks)
    assert server.runtime.runners["a"].model._graphs.captures >= 1
