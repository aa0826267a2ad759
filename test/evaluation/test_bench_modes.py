"""The OxyGen benchmark's five modes on the real tiny model: sharing and batching change speed, never results."""

import threading

import pytest
import torch

from oxygen_ros.engine.cost_models import StepCostModel
from oxygen_ros.engine.kv_pool import KVPool
from oxygen_ros.engine.language import decode_batch, start_request
from oxygen_ros.engine.model_runner import PriorityStreams
from oxygen_ros.evaluation.bench import modes
from oxygen_ros.evaluation.bench.modes import RUNNERS, SETTINGS, Workload
from oxygen_ros.evaluation.bench.part_threads import PartThreads, probe
from oxygen_ros.evaluation.bench.workloads import arrivals, synthetic_frames
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.pi05 import build_model

CONFIG = get_preset("tiny")


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, seed=3)


def isolated_tokens(model, inputs, max_new_tokens):
    """Greedy text of one frame decoded alone in a pool of its own (the reference)."""
    pool = KVPool(CONFIG, 1, max_new_tokens)
    prefill = model.prefill(inputs, pool.cache, torch.tensor([0]), want_logits=True)
    request = start_request(1, 0, 0, 0, CONFIG.prefix_len, int(prefill.num_valid[0]), prefill.logits[0],
                            max_new_tokens, -1)
    while not request.done:
        decode_batch(model, pool.cache, [request])
    return request.tokens


def test_every_setting_gives_the_same_actions_and_text(model):
    frames, noises = synthetic_frames(CONFIG, 7, seed=11)
    workload = Workload(frames, noises, arrivals("every_frame", 7), decode_len=6, num_steps=3, tokens_per_frame=2)
    runs = {s: (RUNNERS[s](model, workload, drain=True) if s == "continuous_batching" else RUNNERS[s](model, workload))
            for s in SETTINGS}
    reference = runs["action_only"]
    for setting, run in runs.items():
        assert sorted(run.actions) == list(range(7)), setting
        for frame in range(7):
            assert torch.equal(run.actions[frame], reference.actions[frame]), (setting, frame)
    expected = {frame: isolated_tokens(model, frames[frame], 6) for frame in range(7)}
    assert len(set(map(tuple, expected.values()))) > 1, "frames should produce different text"
    for setting in ("baseline", "shared_kv", "continuous_batching"):
        assert runs[setting].texts == expected, setting
    assert runs["parallel"].texts, "the parallel language worker finished no request"
    for frame, tokens in runs["parallel"].texts.items():
        assert tokens == expected[frame]


def test_parallel_makes_its_streams_after_the_model_copy_and_the_pools(model, monkeypatch):
    """On a GPU the copy and the zero-filled pools are queued on the default stream, which the workers' streams do
    not wait for; making the streams waits for the device, so they come after everything they read."""
    events = []

    class Streams(PriorityStreams):
        def __init__(self, *args, **kwargs):
            events.append("streams")
            super().__init__(*args, **kwargs)

    def pool(*args, **kwargs):
        events.append("pool")
        return KVPool(*args, **kwargs)

    deepcopy = modes.copy.deepcopy
    monkeypatch.setattr(modes, "PriorityStreams", Streams)
    monkeypatch.setattr(modes, "KVPool", pool)
    def copied(value, memo=None):
        if memo is None:  # the copy itself, not its parts
            events.append("copy")
        return deepcopy(value, memo)

    monkeypatch.setattr(modes.copy, "deepcopy", copied)
    frames, noises = synthetic_frames(CONFIG, 2, seed=13)
    RUNNERS["parallel"](model, Workload(frames, noises, arrivals("every_frame", 2), decode_len=2, num_steps=1))
    assert events == ["copy", "pool", "pool", "streams"]


def test_overlap_gives_the_same_actions_and_text(model):
    """`continuous_batching_overlap`: decode steps beside the denoising change nothing the robot gets."""
    frames, noises = synthetic_frames(CONFIG, 7, seed=12)
    workload = Workload(frames, noises, arrivals("every_frame", 7), decode_len=6, num_steps=3, tokens_per_frame=1)
    gated = RUNNERS["continuous_batching"](model, workload, drain=True)
    overlapped = RUNNERS["continuous_batching_overlap"](model, workload, drain=True)
    assert overlapped.setting == "continuous_batching_overlap"
    assert sorted(overlapped.actions) == list(range(7))
    for frame in range(7):
        assert torch.equal(overlapped.actions[frame], gated.actions[frame]), frame
    assert overlapped.texts == gated.texts == {frame: isolated_tokens(model, frames[frame], 6) for frame in range(7)}


def test_continuous_batching_with_adaptive_k_paces_frames_and_still_finishes_the_text(model):
    frames, noises = synthetic_frames(CONFIG, 6, seed=1)
    workload = Workload(frames, noises, [True] * 6, decode_len=8, num_steps=1, tokens_per_frame=64, adaptive_k=True,
                        control_period_s=0.05, pool_slots=8)
    run = RUNNERS["continuous_batching"](model, workload, drain=True)
    assert run.elapsed_s >= 5 * 0.05  # paced at the control period, as a robot's timer would
    assert run.texts == {frame: isolated_tokens(model, frames[frame], 8) for frame in range(6)}


def test_a_fixed_plus_per_item_cost_fit_predicts_batch_sizes_it_has_not_seen():
    cost = StepCostModel()
    assert cost.predict(4) == 0.0
    cost.observe(4, 0.003)
    assert cost.predict(16) == 0.003  # one batch size seen: the fixed part is assumed to dominate
    for batch in (1, 2, 8, 16):
        cost.observe(batch, 0.002 + 0.0005 * batch)
    assert abs(cost.predict(10) - 0.007) < 1e-3


@pytest.mark.parametrize("setting", ["action_only", "baseline", "shared_kv", "parallel"])
def test_a_sequential_setting_runs_each_part_of_its_action_frame_on_the_threads_it_is_given(model, monkeypatch,
                                                                                             setting):
    """The ceiling (and every sequential setting) may denoise on fewer threads than the process has, as
    continuous batching with overlap does; the caller's count is back afterwards."""
    calls = []
    for name in ("prefill", "sample_actions"):
        original = getattr(model, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            if threading.current_thread() is threading.main_thread():  # not `parallel`'s language worker
                calls.append((_name, torch.get_num_threads()))
            return _original(*args, **kwargs)

        monkeypatch.setattr(model, name, spy)
    frames, noises = synthetic_frames(CONFIG, 3, seed=5)
    caller = torch.get_num_threads()
    workload = Workload(frames, noises, arrivals("every_frame", 3), decode_len=2, num_steps=2,
                        part_threads=PartThreads(prefill=caller + 1, denoise=caller + 2))
    run = RUNNERS[setting](model, workload)
    assert sorted(run.actions) == [0, 1, 2]
    assert [threads for name, threads in calls if name == "sample_actions"] == [caller + 2] * 3
    # the action's own prefill on its count; baseline's second prefill (the text's) keeps the caller's
    prefills = [threads for name, threads in calls if name == "prefill"]
    assert prefills.count(caller + 1) == 3 and set(prefills) <= {caller + 1, caller}
    assert torch.get_num_threads() == caller


def test_the_thread_probe_times_each_part_at_every_count_and_picks_the_fastest(model):
    caller = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        best, medians = probe(model, CONFIG, "cpu", seed=1, num_steps=2, frames=2, rounds=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(caller)
    assert set(medians) == {"prefill", "denoise"}
    for part, chosen in (("prefill", best.prefill), ("denoise", best.denoise)):
        assert set(medians[part]) == {1, 2} and all(ms > 0 for ms in medians[part].values())
        assert medians[part][chosen] == min(medians[part].values())
