"""The engine's model runner: its two stages, run apart on the stage workers, give what one `act` call gives
(tiny model, CPU, real tensors)."""

import contextlib
import threading

import pytest
import torch

from oxygen_ros.engine.model_runner import HIGHEST_PRIORITY, LOWEST_PRIORITY, ModelRunner, PriorityStreams
from oxygen_ros.engine.stage_workers import Stage, StageWorkers
from oxygen_ros.evaluation.bench.workloads import synthetic_frames
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.pi05 import Pi05Model, build_model
from oxygen_ros.model.rtc import Committed, GuidedSampler, RtcConfig
from oxygen_ros.rtc_mask import Schedule

TINY = get_preset("tiny")


def test_stage_prefill_then_stage_denoise_equals_one_act_call():
    model = build_model(TINY, seed=0)
    runner = ModelRunner(model, language_slots=2, max_new_tokens=4, max_batch=4, frame_slots=8, stage_split=True)
    frames, noises = synthetic_frames(TINY, 3, seed=3)
    narrate = [True, False, True]
    whole = runner.act(frames, noises, 4, narrate)
    workers = StageWorkers("cpu", cpu_threads=2)
    try:
        # the VLM stage of the three frames on one worker, then their action stage in two batches (any grouping of
        # prefilled slots), each padded to its bucket, on the other worker
        prefilled = workers.submit(Stage.VLM, 0.5, runner.prefill_stage, frames, 4, narrate).result(timeout=60)
        first = workers.submit(Stage.ACTION, 0.5, runner.denoise_stage, prefilled.slots[:2], noises[:2], 2)
        second = workers.submit(Stage.ACTION, 1.0, runner.denoise_stage, prefilled.slots[2:], noises[2:], 1)
        staged = torch.cat([first.result(timeout=60), second.result(timeout=60)])
    finally:
        workers.close()
    torch.testing.assert_close(staged, whole.actions, rtol=1e-4, atol=1e-5)
    assert prefilled.num_valid == whole.num_valid
    for a, b in zip(prefilled.first_hidden, whole.first_hidden):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # both calls left their frames' slots allocated for the caller to hand over or free
    assert runner.slots_in_use == 6
    runner.free(whole.slots + prefilled.slots)
    assert runner.slots_in_use == 0


def test_a_full_frame_pool_is_an_error_and_gives_back_what_it_took():
    runner = ModelRunner(build_model(TINY, seed=0), 0, 0, max_batch=2, frame_slots=2, stage_split=True)
    frames, _ = synthetic_frames(TINY, 2, seed=1)
    held = runner.prefill_stage(frames, 2)
    try:
        runner.prefill_stage(frames[:1], 1)
    except RuntimeError as error:
        assert "frame slots" in str(error)
    else:
        raise AssertionError("a third frame found a slot in a pool of two")
    assert runner.slots_in_use == 2
    runner.free(held.slots)


def test_stage_workers_hold_their_own_thread_budgets():
    workers = StageWorkers("cpu", cpu_threads=2)
    barrier = threading.Barrier(2, timeout=10)

    def budget():
        barrier.wait()  # both stages are running at this point
        return torch.get_num_threads()

    try:
        vlm = workers.submit(Stage.VLM, 0.5, budget)
        action = workers.submit(Stage.ACTION, 1.0, budget)
        assert (vlm.result(timeout=10), action.result(timeout=10)) == (1, 2)
        assert workers.cpu_shares() == [0.5, 1.0]
    finally:
        workers.close()


def test_padding_noise_is_made_on_the_models_device_and_an_empty_prefix_is_refused():
    """A bucket's padding rows start from zeros made on the model's device: the meta device stands in for a
    GPU, beside which a host tensor cannot be concatenated. A frame without a valid prefix token is refused from
    the valid lengths the runner reads back (the model's prefill reads nothing back), its slot given back."""
    with torch.device("meta"):
        meta = Pi05Model(TINY).eval()
    runner = ModelRunner(meta, language_slots=0, max_new_tokens=0, max_batch=4, stage_split=True)
    noise = torch.zeros(1, TINY.action_horizon, TINY.action_dim, device="meta")
    assert runner.denoise_stage([runner.pool.allocate("frame")], [noise], 4).shape == noise.shape
    runner = ModelRunner(build_model(TINY, seed=0), language_slots=0, max_new_tokens=0, max_batch=2)
    (frame,), (noise,) = synthetic_frames(TINY, 1, seed=1)
    frame.image_masks[:] = False
    frame.token_masks[:] = False
    with pytest.raises(ValueError, match="at least one valid token"):
        runner.act([frame], [noise], 1, [False])
    assert runner.slots_in_use == 0


def test_priority_streams_wait_for_the_device_once_both_are_made(monkeypatch):
    """torch's streams do not wait for what the default stream queued (weights, zero-filled pools): making the
    streams synchronizes the device after both exist, so nothing issued on them can read before that work is done.
    torch's CUDA calls are stand-ins that record the order; on a CPU neither is called."""
    calls = []

    class Stream:
        def __init__(self, device, priority):
            calls.append(("stream", device, priority))

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("synchronize", device)))
    cuda = torch.device("cuda", 0)
    streams = PriorityStreams(cuda)
    assert calls == [("stream", cuda, HIGHEST_PRIORITY), ("stream", cuda, LOWEST_PRIORITY), ("synchronize", cuda)]
    assert isinstance(streams.control_stream, Stream) and isinstance(streams.language_stream, Stream)
    calls.clear()
    PriorityStreams("cuda:0", prioritized=False)  # two workers of equal priority: the same wait
    assert calls == [("stream", cuda, LOWEST_PRIORITY), ("stream", cuda, LOWEST_PRIORITY), ("synchronize", cuda)]
    calls.clear()
    cpu = PriorityStreams("cpu")
    assert calls == [] and cpu.control_stream is None and cpu.language_stream is None


def test_a_stage_job_on_a_cuda_worker_waits_for_what_its_submitter_had_queued(monkeypatch):
    """A stage worker issues on a stream of its own, which does not wait for the submitting thread's stream (the
    frames' upload, a pool's zero-fill): each job's stream waits on an event the submitter recorded on its own
    stream when it submitted, before the job's first call. torch's CUDA calls are stand-ins that record the order."""
    calls, lock = [], threading.Lock()

    def note(*entry):
        with lock:
            calls.append(entry)

    class Stream:
        def __init__(self, device=None, priority=0):
            self.name = "worker" if device is not None else "submitter"

        def wait_event(self, event):
            note("wait", self.name, event.recorded_on)

        def synchronize(self):
            note("synchronize", self.name)

    submitter = Stream()

    class Event:
        def __init__(self):
            self.recorded_on = None

        def record(self, stream):
            self.recorded_on = stream.name
            note("record", stream.name)

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: submitter)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    workers = StageWorkers("cuda:0")
    try:
        job = workers.submit(Stage.VLM, 0.5, lambda: note("job"))
        job.result(timeout=30)
    finally:
        workers.close()
    assert calls == [("record", "submitter"), ("wait", "worker", "submitter"), ("job",), ("synchronize", "worker")]


def test_frames_that_bring_their_previous_chunk_are_denoised_with_guidance_beside_plain_ones():
    model = build_model(TINY, seed=0)
    rtc = RtcConfig(execution_horizon=6, schedule=Schedule.LINEAR)
    runner = ModelRunner(model, 0, 0, max_batch=4, frame_slots=8, stage_split=True, rtc=rtc)
    frames, noises = synthetic_frames(TINY, 3, seed=3)
    plain = runner.act(frames, noises, 4, [False] * 3)
    left_over = plain.actions[0, 2:]
    committed = [Committed(left_over, 2), None, Committed(left_over[:, :5], 1)]  # the last one too narrow
    guided = runner.act(frames, noises, 4, [False] * 3, committed=committed)
    # what the guided sampler gives for these slots, padding row aside; the plain frame is untouched
    want = GuidedSampler(rtc).sample(model, runner.pool.cache, torch.tensor(guided.slots), torch.cat(noises), committed)
    torch.testing.assert_close(guided.actions, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(guided.actions[1:], plain.actions[1:], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(guided.actions[0], plain.actions[0], atol=1e-3)
    assert runner.rtc_fallbacks == {"width": 1}
    # the action stage alone, on the same prefixes
    staged = runner.denoise_stage(guided.slots, noises, 4, committed=committed)
    torch.testing.assert_close(staged, guided.actions, rtol=1e-4, atol=1e-5)
    runner.free(plain.slots + guided.slots)
    # a runner without real-time chunking settings refuses such frames before touching its pool
    bare = ModelRunner(model, 0, 0, max_batch=4)
    with pytest.raises(ValueError, match="no real-time chunking settings"):
        bare.act(frames, noises, 4, [False] * 3, committed=committed)
    assert bare.slots_in_use == 0
