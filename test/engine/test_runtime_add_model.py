"""A model added to a running runtime: on a GPU its pool is zero-filled on the adding thread's stream, which the
control and language streams do not wait for, so add_model waits for the device after making the pool and before
the threads can see the model. torch's CUDA calls are stand-ins that record what the runtime held when called."""

import torch

from oxygen_ros.engine.runtime import Runtime, RuntimeConfig, Served
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.model.pi05 import build_model

from engine_fixtures import TINY


def test_add_model_waits_for_the_new_pool_before_the_threads_see_it(monkeypatch, tokenizer):
    calls = []

    class Stream:
        def __init__(self, device, priority):
            self.priority = priority

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    made, held = [], {}
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda device=None: calls.append((device, dict(held.get("runners", {})), list(made))))
    runtime = Runtime({}, RuntimeConfig(SchedulerConfig(max_new_tokens=4), pool_slots=4),
                      device=torch.device("cuda", 0))
    assert runtime.streams.enabled and len(calls) == 1  # the streams waited once when made
    calls.clear()
    held["runners"] = runtime.runners
    original = runtime._runner
    monkeypatch.setattr(runtime, "_runner", lambda model: made.append(original(model)) or made[-1])
    runtime.add_model("a", Served(build_model(TINY, seed=0), tokenizer))
    assert len(calls) == 1
    device, visible, pools = calls[0]
    assert device == torch.device("cuda", 0)
    assert visible == {} and len(pools) == 1  # after the pool was made, before the model was served
    assert runtime.runners == {"a": pools[0]}
