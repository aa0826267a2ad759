"""The fleet server without ROS: which robots, models and device a server takes from its parameters and the
assignment file, and deadlines anchored at the camera stamp (real tiny models on CPU)."""

import time

import pytest
import torch

from oxygen_ros.engine.runtime import RuntimeConfig
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.fleet.device import serving_device
from oxygen_ros.fleet.lockstep import choose_partition
from oxygen_ros.fleet.models import ModelSpec, models_to_load
from oxygen_ros.fleet.profile_table import SyntheticLatencyModel, synthetic_table
from oxygen_ros.fleet.server import FleetServer, RobotCounts, ServedRobot, served_robots
from oxygen_ros.model.cpu_kernel import auto_refusal

from engine_fixtures import observation, tokenizer  # noqa: F401 - pytest fixture

ASSIGNMENT = {
    "gpu_of": {"r1": 0, "r2": 1, "r3": 0, "r4": 1},
    "model_of": {"r1": "a", "r2": "b", "r3": "c", "r4": "a"},
    "slo_of": {"r1": 0.05, "r2": 0.2, "r3": 0.1},
}


def test_without_an_assignment_every_listed_robot_is_served_with_the_one_slo():
    robots = served_robots(["/r1", "r2"], ["a", "b"], 0.2)
    assert robots == [ServedRobot("r1", "a", 0.2), ServedRobot("r2", "b", 0.2)]
    with pytest.raises(ValueError, match="same length"):
        served_robots(["r1"], [], 0.2)


def test_an_assignment_gives_each_gpu_its_robots_with_their_models_and_slos():
    assert served_robots([], [], 0.3, ASSIGNMENT, gpu_index=0) == [ServedRobot("r1", "a", 0.05),
                                                                   ServedRobot("r3", "c", 0.1)]
    # r4 has no SLO in the file: the node's default
    assert served_robots([], [], 0.3, ASSIGNMENT, gpu_index=1) == [ServedRobot("r2", "b", 0.2),
                                                                   ServedRobot("r4", "a", 0.3)]
    assert served_robots([], [], 0.3, ASSIGNMENT, gpu_index=2) == []
    # an old assignment without model_of: models come from robots/robot_models, and a robot in neither is an error
    old = {"gpu_of": {"r1": 0, "r2": 0}}
    assert served_robots(["r1", "r2"], ["a", "b"], 0.1, old) == [ServedRobot("r1", "a", 0.1),
                                                                 ServedRobot("r2", "b", 0.1)]
    with pytest.raises(ValueError, match="no model for robots"):
        served_robots(["r1"], ["a"], 0.1, old)


def test_a_server_loads_only_the_models_its_robots_use():
    specs = [ModelSpec.parse(t) for t in ("a=tiny:0", "b=tiny:1", "c=tiny:2")]
    robots = served_robots([], [], 0.3, ASSIGNMENT, gpu_index=1)
    assert [s.model_id for s in models_to_load(specs, robots)] == ["a", "b"]
    with pytest.raises(ValueError, match="not served"):
        models_to_load(specs[:1], robots)
    with pytest.raises(ValueError, match="unique"):
        models_to_load(specs + specs[:1], robots)


def test_gpu_index_selects_the_cuda_device():
    assert serving_device("cuda", 3, cuda_devices=4) == "cuda:3"
    assert serving_device("cuda", 0, cuda_devices=1) == "cuda:0"
    assert serving_device("cuda:1", 3, cuda_devices=2) == "cuda:1"  # an explicit device is kept
    assert serving_device("cpu", 3) == "cpu"  # the index still picks the robots, the CPU has no index
    with pytest.raises(ValueError, match="does not exist"):
        serving_device("cuda", 2, cuda_devices=2)
    with pytest.raises(ValueError, match=">= 0"):
        serving_device("cuda", -1, cuda_devices=2)


def test_attainment_counts_every_kind_of_miss():
    counts = RobotCounts(on_time=6, late_on_arrival=2, late_done=1, failed=1)
    assert counts.missed == 4 and counts.attainment == pytest.approx(0.6)
    assert RobotCounts().attainment == 1.0


def _server(tokenizer, robots, publish_late, on_chunk):  # noqa: F811 - the fixture's value
    specs = [ModelSpec.parse("a=tiny:0"), ModelSpec.parse("b=tiny:1")]
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=4)
    torch.set_num_threads(1)
    return FleetServer(specs, robots, config, lambda model: tokenizer, on_chunk=on_chunk, publish_late=publish_late)


@pytest.mark.parametrize("publish_late", [False, True])
def test_deadlines_run_from_the_camera_stamp(tokenizer, publish_late):  # noqa: F811
    """A frame past its deadline on arrival is never queued; one computed in time to start but finished after
    its deadline is late: dropped (or handed on marked missed with publish_late); a fresh one is on time. All
    counted."""
    robots = [ServedRobot("loose", "a", 30.0), ServedRobot("tight", "a", 0.15)]
    chunks = []
    server = _server(tokenizer, robots, publish_late, chunks.append)
    assert server.model_ids == ["a"]  # "b" has no robot here: not loaded
    model = server.runtime.runners["a"].model
    denoise = model.sample_actions

    def slow(*args, **kwargs):  # every chunk takes longer than the tight robot's SLO
        time.sleep(0.3)
        return denoise(*args, **kwargs)

    model.sample_actions = slow
    server.start()
    try:
        assert server.submit("tight", observation(0), False, stamp_ns=1, age_s=0.2) is False  # old stamp
        assert server.submit("tight", observation(1), False, stamp_ns=2, age_s=0.0) is True
        assert server.submit("loose", observation(2), False, stamp_ns=3, age_s=0.01) is True
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.robot_counts("tight").late_done + \
                server.robot_counts("loose").on_time < 2:
            time.sleep(0.01)
    finally:
        server.close()
    tight, loose = server.robot_counts("tight"), server.robot_counts("loose")
    assert (tight.late_on_arrival, tight.late_done, tight.on_time) == (1, 1, 0)
    assert (loose.late_on_arrival, loose.late_done, loose.on_time) == (0, 0, 1)
    assert tight.attainment == 0.0 and loose.attainment == 1.0
    published = {c.stamp_ns: c.missed for c in chunks}
    assert published == ({2: True, 3: False} if publish_late else {3: False})
    assert server.stats("tight").deadline_misses == 1  # the engine's own count agrees for the queued one


def serve_three_narrating_frames_each(server, chunks, texts) -> None:
    """Robots r1 and r2 submit three narrating frames each; every chunk (finite) and every narration's final text
    comes back (through `chunks` and `texts`, the server's callbacks), and every slot is free again."""
    server.start()
    try:
        for i in range(3):
            for robot in ("r1", "r2"):
                assert server.submit(robot, observation(i), True, stamp_ns=10 * i + 1, age_s=0.0, context=i)
        assert server.runtime.drain(120)
    finally:
        server.close()
    assert server.runtime.worker_error is None
    counts = {r: server.robot_counts(r) for r in ("r1", "r2")}  # (says why, should a frame be missing)
    assert sorted((c.robot_id, c.context) for c in chunks) == [(r, i) for r in ("r1", "r2") for i in range(3)], counts
    assert all(c.error is None and torch.isfinite(c.actions).all() for c in chunks)
    finals = [t for t in texts if t.final]
    assert sorted((t.robot_id, t.context) for t in finals) == [(r, i) for r in ("r1", "r2") for i in range(3)]
    assert all(t.num_tokens >= 1 for t in finals)
    assert all(r.slots_in_use == 0 for r in server.runtime.runners.values())


@pytest.mark.parametrize("design", ["robion", "disaggregated"])
def test_a_stage_split_serves_actions_and_narration_from_the_same_slots(tokenizer, design):  # noqa: F811
    """Two robots on two models, every frame narrating: each gets its chunks and its narration's final text;
    the frame slots all come back; the plan came from a table profiled on the served runners at start-up."""
    robots = [ServedRobot("r1", "a", 600.0), ServedRobot("r2", "b", 600.0)]
    chunks, texts = [], []
    specs = [ModelSpec.parse("a=tiny:0"), ModelSpec.parse("b=tiny:1")]
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=12, frame_slots=8)
    torch.set_num_threads(1)
    server = FleetServer(specs, robots, config, lambda model: tokenizer, on_chunk=chunks.append,
                         on_text=texts.append, design=design, cpu_threads=2, profile_repeats=1)
    assert server.lut.models() == ["a", "b"] and server.lut.meta["source"] == "measured"
    # the two stages were also timed side by side, and the guard is at least that slowdown
    slowdown = server.lut.meta["co_run_slowdown"]
    assert slowdown >= 1.0 and server.guard == max(1.1, slowdown) == server.runtime.scheduler.planner.guard
    serve_three_narrating_frames_each(server, chunks, texts)
    assert server.robot_counts("r1").on_time == 3


def test_monolithic_with_overlap_serves_actions_and_narration(tokenizer):  # noqa: F811
    """`overlap_threads` on the whole-device path of a fleet: two robots on two models, every frame narrating,
    decode steps beside the denoising: every chunk and every narration's final text arrive, every slot comes back."""
    robots = [ServedRobot("r1", "a", 600.0), ServedRobot("r2", "b", 600.0)]
    chunks, texts = [], []
    specs = [ModelSpec.parse("a=tiny:0"), ModelSpec.parse("b=tiny:1")]
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=6,
                           overlap_threads=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    server = FleetServer(specs, robots, config, lambda model: tokenizer, on_chunk=chunks.append,
                         on_text=texts.append)
    try:
        serve_three_narrating_frames_each(server, chunks, texts)
    finally:
        torch.set_num_threads(threads)


def test_a_given_tables_co_run_slowdown_raises_the_guard(tokenizer):  # noqa: F811
    """A table that measured its stages 2.5x slower side by side makes the lockstep plan with guard 2.5, so it
    splits the device only where a split beats the back-to-back run by that much; a lower slowdown leaves the
    guard given."""
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=6, frame_slots=4)
    for slowdown, guard in ((2.5, 2.5), (1.05, 1.3)):
        table = synthetic_table({"a": 1.0}, buckets=(1, 2), shares=(0.5, 1.0))
        table.meta["co_run_slowdown"] = slowdown
        server = FleetServer([ModelSpec.parse("a=tiny:0")], [ServedRobot("r1", "a", 1.0)], config,
                             lambda model: tokenizer, design="robion", profile=table, guard=1.3, cpu_threads=2)
        try:
            assert server.guard == guard == server.runtime.scheduler.planner.guard
        finally:
            server.close()


def test_a_frame_whose_deadline_passes_in_the_queue_is_dropped_unserved_and_counted(tokenizer):  # noqa: F811
    robots = [ServedRobot("r1", "a", 0.3)]
    chunks = []
    server = _server(tokenizer, robots, False, chunks.append)
    model = server.runtime.runners["a"].model
    calls = []
    model.prefill = lambda *args, **kwargs: calls.append(args)  # no compute may be spent on the frame
    # the server is not started: the frame waits in the queue past its deadline, then the control path runs once
    assert server.submit("r1", observation(0), True, stamp_ns=1, age_s=0.0)
    time.sleep(0.35)
    assert server.runtime.run_control()  # the control path runs once: the frame expired in the queue
    server.close()
    counts = server.robot_counts("r1")
    assert (counts.expired_in_queue, counts.on_time, counts.late_done) == (1, 0, 0) and counts.attainment == 0.0
    assert chunks == [] and calls == [] and server.runtime.scheduler.language_requests() == 0
    assert server.stats("r1").deadline_misses == 1


def test_frames_wait_for_frame_slots_instead_of_failing(tokenizer):  # noqa: F811
    """One model keeping a single batch of frame slots, six frames at once: a VLM batch waits until the previous
    batch's action stage gave its slots back; every frame gets its chunk."""
    chunks = []
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=3, frame_slots=2)
    server = FleetServer([ModelSpec.parse("a=tiny:0")], [ServedRobot("r1", "a", 600.0)], config,
                         lambda model: tokenizer, on_chunk=chunks.append, design="robion", cpu_threads=2,
                         profile_repeats=1)
    server.start()
    try:
        for i in range(6):
            assert server.submit("r1", observation(i), False, stamp_ns=i + 1, age_s=0.0, context=i)
        assert server.runtime.drain(120)
    finally:
        server.close()
    assert sorted(c.context for c in chunks) == list(range(6)) and all(c.error is None for c in chunks), \
        server.robot_counts("r1")


def test_the_control_thread_waits_while_a_lockstep_runs_its_two_stages_side_by_side(tokenizer):  # noqa: F811
    """A lockstep whose VLM batch ends before the action batch beside it: the control thread waits for the action
    batch instead of asking the planner again and again until it ends (that spin took the interpreter lock from the
    stage workers between their operators: a 15 ms denoising took seconds and frames expired in the queue). While a
    lockstep runs, the planner is asked at most once per lockstep; every frame is served."""
    table = synthetic_table({"a": 1.0, "b": 1.0}, buckets=(1, 2), shares=(0.5, 1.0),
                            latency_model=SyntheticLatencyModel(vlm_share_exponent=0.1))
    assert choose_partition(table, ("a", 1), ("b", 1), 1.1).mode == "split"  # both stages side by side
    robots = [ServedRobot("r1", "a", 600.0), ServedRobot("r2", "b", 600.0)]
    chunks = []
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=12, frame_slots=8)
    torch.set_num_threads(1)
    server = FleetServer([ModelSpec.parse("a=tiny:0"), ModelSpec.parse("b=tiny:1")], robots, config,
                         lambda model: tokenizer, on_chunk=chunks.append, design="robion", profile=table,
                         cpu_threads=2)
    device = server.runtime.scheduler.planner
    start, asked = device.start, {"jobs": 0, "side by side": 0, "while running": 0}

    def counted(now):
        running = device.busy
        jobs = start(now)
        asked["while running"] += running
        asked["jobs"] += len(jobs)
        asked["side by side"] += sum(job.co_run for job in jobs)
        return jobs

    device.start = counted
    for i in range(3):
        for robot in ("r1", "r2"):
            assert server.submit(robot, observation(i), False, stamp_ns=10 * i + 1, age_s=0.0, context=(robot, i))
    server.start()
    try:
        assert server.runtime.drain(120)
    finally:
        server.close()
    assert sorted(c.context for c in chunks) == [(r, i) for r in ("r1", "r2") for i in range(3)]
    assert asked["side by side"] >= 1, asked
    assert asked["while running"] <= asked["jobs"], asked


def test_cpu_kernel_choice_reaches_every_served_model(tokenizer):  # noqa: F811
    """`cpu_kernel`: auto (the default) puts every model's decode step through the compiled kernel here, off keeps
    the eager step; what each model got is on the server, and narration is served either way."""
    robots = [ServedRobot("r1", "a", 600.0), ServedRobot("r2", "b", 600.0)]
    specs = [ModelSpec.parse("a=tiny:0"), ModelSpec.parse("b=tiny:1")]
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=6)
    auto = "on (auto)" if auto_refusal() is None else f"off (auto: {auto_refusal()})"
    for choice, said in (("auto", auto), ("off", "off (as configured)")):
        chunks, texts = [], []
        kwargs = {} if choice == "auto" else {"cpu_kernel": choice}
        server = FleetServer(specs, robots, config, lambda model: tokenizer, on_chunk=chunks.append,
                             on_text=texts.append, **kwargs)
        assert server.cpu_kernel == {"a": said, "b": said}
        assert all(s.model.uses_cpu_kernel == (not said.startswith("off")) for s in server.runtime.served.values())
        serve_three_narrating_frames_each(server, chunks, texts)
