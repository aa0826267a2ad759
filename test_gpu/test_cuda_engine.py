"""The OxyGen engine on a GPU: the same results as on one stream, with the control path on the high-priority one."""

import threading

import torch

from oxygen_ros.engine.kv_pool import KVPool
from oxygen_ros.engine.language import decode_batch, start_request
from oxygen_ros.engine.runtime import Runtime, RuntimeConfig, Served
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.evaluation.bench.modes import RUNNERS, SETTINGS, Workload
from oxygen_ros.evaluation.bench.workloads import arrivals, synthetic_frames
from oxygen_ros.model.pi05 import build_model

from engine_fixtures import TINY as CONFIG
from engine_fixtures import observation
from gpu_precision import assert_texts_agree

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
    texts = runs["baseline"].texts
    assert len(texts) == 7 and len(set(map(tuple, texts.values()))) > 1
    for setting in ("shared_kv", "continuous_batching"):  # other batch sizes: float32's agreement rate
        assert_texts_agree(runs[setting].texts, texts, model.dtype)


def test_threaded_runtime_on_two_streams_matches_isolated_execution(tokenizer):
    """Control path on the high-priority stream, language worker on the low one, three robots batched together:
    every chunk and every greedy text as if each frame ran alone on the default stream."""
    model = build_model(CONFIG, device=DEVICE, seed=1)
    scheduler = SchedulerConfig(num_steps=3, max_new_tokens=10, tokens_per_frame=2, ignore_eos=True,
                                admission="preempt", max_batch=4, control_period_s=1.0)
    finals, chunks, lock = {}, {}, threading.Lock()

    def on_text(update):
        if update.final:
            with lock:
                finals[update.context] = list(update.token_ids)

    def on_chunk(chunk):
        with lock:
            chunks[chunk.context] = chunk.actions

    runtime = Runtime(Served(model, tokenizer), RuntimeConfig(scheduler, pool_slots=8, stream_every=0),
                      on_text=on_text, on_chunk=on_chunk)
    streams = runtime.streams
    assert streams.enabled and streams.control_stream.priority < streams.language_stream.priority
    inputs = {i: runtime.prepare(observation(i)) for i in range(12)}
    noises = {i: torch.randn(1, CONFIG.action_horizon, CONFIG.action_dim, generator=torch.Generator().manual_seed(i))
              for i in range(12)}
    try:
        for i in range(12):
            runtime.submit(runtime.frame(inputs[i], narrate=True, robot_id=f"robot{i % 3}", noise=noises[i],
                                         context=i))
        runtime.start(control_thread=True)
        assert runtime.drain(60)
    finally:
        runtime.close()
    assert runtime.worker_error is None and sorted(chunks) == sorted(finals) == list(range(12))
    alone = {}
    for i in range(12):
        pool = KVPool(CONFIG, 1, 10, model.dtype, DEVICE)
        slot = torch.tensor([0])
        prefill = model.prefill(inputs[i].to(DEVICE, model.dtype), pool.cache, slot, want_logits=True)
        actions = model.sample_actions(pool.cache, slot, noises[i].to(DEVICE), 3)[0].float().cpu()
        torch.testing.assert_close(chunks[i], actions, rtol=1e-4, atol=1e-4)
        request = start_request(1, 0, 0, 0, CONFIG.prefix_len, int(prefill.num_valid[0]), prefill.logits[0], 10, -1)
        while not request.done:
            decode_batch(model, pool.cache, [request])
        alone[i] = request.tokens
    assert_texts_agree(finals, alone, model.dtype)
