"""A fleet server whose robots come and go (what a replica of the Ray pool runs; real tiny models on
CPU): it starts with no robot, loads a model on its first robot, serves it, stops taking a removed robot's frames
while those in flight still finish, and lets a model go once no robot needs it and none of its frames is left."""

import threading
import time

import pytest
import torch

from oxygen_ros.engine.runtime import RuntimeConfig
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.fleet.models import ModelSpec
from oxygen_ros.fleet.server import FleetServer, NotServed, ServedRobot

from engine_fixtures import observation, tokenizer  # noqa: F401 - pytest fixture

SPECS = [ModelSpec.parse("a=tiny:0"), ModelSpec.parse("b=tiny:1")]


def wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def submit(server, robot_id, i):
    assert server.submit(robot_id, observation(i), False, stamp_ns=i, age_s=0.0, context=i)


def test_robots_come_and_go_and_models_follow_them(tokenizer):  # noqa: F811
    chunks = []
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=6)
    torch.set_num_threads(1)
    server = FleetServer(SPECS, [], config, lambda model: tokenizer, on_chunk=chunks.append, dynamic=True).start()
    try:
        assert server.model_ids == []
        assert server.add_robot(ServedRobot("r1", "a", 60.0))  # its model is loaded for it
        assert not server.add_robot(ServedRobot("r2", "a", 60.0))  # already loaded
        assert server.add_robot(ServedRobot("r3", "b", 60.0)) and server.model_ids == ["a", "b"]
        with pytest.raises(ValueError, match="already served"):
            server.add_robot(ServedRobot("r1", "a", 60.0))
        with pytest.raises(ValueError, match="not served here"):
            server.add_robot(ServedRobot("r4", "zzz", 60.0))
        for i, robot in enumerate(("r1", "r2", "r3")):
            submit(server, robot, i)
        wait_for(lambda: len(chunks) == 3)
        assert {c.robot_id for c in chunks} == {"r1", "r2", "r3"} and all(c.error is None for c in chunks)

        # r3 leaves while one of its frames is in flight: the frame still finishes, then b can go
        started, release = threading.Event(), threading.Event()
        runner = server.runtime.runners["b"]
        prefill = runner.model.prefill

        def held(*args, **kwargs):
            started.set()
            release.wait(30)
            return prefill(*args, **kwargs)

        runner.model.prefill = held
        submit(server, "r3", 10)
        assert started.wait(30)
        server.remove_robot("r3")
        with pytest.raises(NotServed):
            submit(server, "r3", 11)
        assert server.in_flight("r3") == 1 and server.unload_idle_models() == []  # its frame still runs
        release.set()
        wait_for(lambda: server.in_flight("r3") == 0)
        assert chunks[-1].robot_id == "r3" and chunks[-1].error is None
        assert server.unload_idle_models() == ["b"] and server.model_ids == ["a"]
        server.forget_robot("r3")
        with pytest.raises(ValueError, match="still served"):
            server.forget_robot("r1")
        # a is still in use; a robot on b loads it again
        assert server.unload_idle_models() == []
        assert server.add_robot(ServedRobot("r5", "b", 60.0)) and server.model_ids == ["a", "b"]
        submit(server, "r5", 20)
        wait_for(lambda: chunks[-1].robot_id == "r5")
        assert server.robot_counts("r5").on_time == 1
        assert server.runtime.busy_s > 0  # the node's measured load comes from this
    finally:
        server.close()


def test_a_model_with_narration_still_decoding_stays_loaded(tokenizer):  # noqa: F811
    config = RuntimeConfig(SchedulerConfig(max_new_tokens=4, queue="esf", max_batch=2), pool_slots=6)
    server = FleetServer(SPECS, [], config, lambda model: tokenizer, dynamic=True).start()
    try:
        server.add_robot(ServedRobot("r1", "a", 60.0))
        runner = server.runtime.runners["a"]
        decode, started, release = runner.decode, threading.Event(), threading.Event()

        def held(requests):
            started.set()
            release.wait(30)
            return decode(requests)

        runner.decode = held
        assert server.submit("r1", observation(0), True, stamp_ns=0, age_s=0.0, context=0)  # narrating
        assert started.wait(30)  # its chunk is out, its narration decodes
        server.remove_robot("r1")
        wait_for(lambda: server.in_flight("r1") == 0)
        assert server.unload_idle_models() == [] and server.model_ids == ["a"]
        release.set()
        wait_for(lambda: not server.runtime.scheduler.has_language_requests())
        assert server.unload_idle_models() == ["a"] and server.model_ids == []
    finally:
        release.set()
        server.close()


def test_a_dynamic_stage_split_needs_its_table_and_a_static_server_its_robots(tokenizer):  # noqa: F811
    config = RuntimeConfig(SchedulerConfig(max_batch=2), pool_slots=6, frame_slots=4)
    with pytest.raises(ValueError, match="plans from a profile table"):
        FleetServer(SPECS, [], config, lambda model: tokenizer, design="robion", dynamic=True)
    with pytest.raises(ValueError, match="no robots to serve"):
        FleetServer(SPECS, [], config, lambda model: tokenizer)
