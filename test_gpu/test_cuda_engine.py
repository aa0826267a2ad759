"""The OxyGen engine on a GPU: the same results as on one stream, with the control path on the high-priority one."""

import threading
import time

import numpy as np
import torch

from oxygen_ros.engine.frame_scheduler import FrameScheduler, SchedulerConfig
from oxygen_ros.engine.kv_pool import KVPool
from oxygen_ros.engine.runtime import OxygenRuntime, RuntimeConfig
from oxygen_ros.engine.settings import RUNNERS, SETTINGS, Workload
from oxygen_ros.engine.workloads import arrivals, synthetic_frames
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.preprocess import prepare_inputs, robot_actions

from engine_fixtures import TINY as CONFIG
from engine_fixtures import observation

DEVICE = torch.device("cuda")


def test_every_setting_gives_the_same_actions_and_text_on_cuda():
    model = build_model(CONFIG, device=DEVICE, seed=3)
    frames, noises = synthetic_frames(CONFIG, 7, seed=11, device=DEVICE)
    workload = Workload(frames, noises, arrivals("every_frame", 7), decode_len=6, num_steps=3, tokens_per_frame=2)
    runs = {s: (RUNNERS[s](model, workload, drain=True) if s == "continuous_batching" else RUNNERS[s](model, workload))
            for s in SETTINGS}
    reference = runs["action_only"]
    for setting, run in runs.items():
        for frame in range(7):
            torch.testing.assert_close(run.actions[frame], reference.actions[frame], rtol=1e-5, atol=1e-5,
                                       msg=f"{setting}, frame {frame}")
    texts = {f: r.tokens for f, r in runs["baseline"].requests.items()}
    assert len(texts) == 7 and len(set(map(tuple, texts.values()))) > 1
    for setting in ("shared_kv", "continuous_batching"):
        assert {f: r.tokens for f, r in runs[setting].requests.items()} == texts, setting


def test_threaded_runtime_on_two_streams_matches_the_single_threaded_schedule(tokenizer):
    model = build_model(CONFIG, device=DEVICE, seed=1)
    scheduler = SchedulerConfig(num_steps=3, max_new_tokens=10, control_period_s=0.02, ignore_eos=True)
    config = RuntimeConfig(scheduler=scheduler, pool_slots=8, stream_every=0)
    finals, lock = {}, threading.Lock()

    def on_text(update):
        if update.final:
            with lock:
                finals[update.frame_id] = update.text

    runtime = OxygenRuntime(model, tokenizer, config, robot_action_dim=3, on_text=on_text).start()
    streams = runtime.streams
    assert streams.enabled and streams.control_stream.priority < streams.language_stream.priority
    try:
        chunks = [runtime.act(observation(i), stamp_ns=i, narrate=i % 2 == 0) for i in range(16)]
        deadline = time.perf_counter() + 20
        while len(finals) < 8 and time.perf_counter() < deadline:
            time.sleep(0.02)
    finally:
        runtime.close()
    assert runtime.worker_error is None and len(finals) == 8

    # the same frames, noise and weights through the single-threaded scheduler on the default stream
    reference = FrameScheduler(model, KVPool(CONFIG, 8, 10, model.dtype, DEVICE), scheduler)
    noise = torch.Generator().manual_seed(config.seed)
    texts = {}
    for i, chunk in enumerate(chunks):
        inputs = prepare_inputs([observation(i)], CONFIG, tokenizer, None).to(DEVICE, model.dtype)
        draw = torch.randn(1, CONFIG.action_horizon, CONFIG.action_dim, generator=noise).to(DEVICE)
        result = reference.run_frame(inputs, draw, narrate=i % 2 == 0)
        np.testing.assert_allclose(chunk.actions, robot_actions(result.actions[None], 3)[0], rtol=1e-5, atol=1e-5)
        texts.update({r.frame_id: tokenizer.decode(r.tokens) for r in result.finished})
    texts.update({r.frame_id: tokenizer.decode(r.tokens) for r in reference.drain()})
    assert finals == texts

