"""The threaded runtime on the real tiny model: the same chunks and greedy text as isolated execution, for one
robot and for three robots sharing one model, and language work that never overlaps the control path's."""

import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from oxygen_ros.engine.runtime import Runtime, RuntimeConfig, Served
from oxygen_ros.engine.scheduler import SchedulerConfig
from oxygen_ros.model import cpu_kernel
from oxygen_ros.model.generate import greedy_decode
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.model.rtc import Committed, GuidedSampler, RtcConfig

from engine_fixtures import TINY as CONFIG
from engine_fixtures import observation


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, seed=3)


def isolated(model, inputs, noise, num_steps, max_new_tokens):
    """The reference: this frame alone in a cache of its own: prefill + denoise, then plain greedy decoding."""
    cache = KVCache(CONFIG, 1, CONFIG.prefix_len + max_new_tokens)
    slot = torch.tensor([0])
    prefill = model.prefill(inputs, cache, slot, want_logits=True)
    actions = model.sample_actions(cache, slot, noise, num_steps)[0]
    (tokens,) = greedy_decode(model, cache, slot, prefill, max_new_tokens, eos_id=-1)
    return actions, tokens


class Collector:
    def __init__(self):
        self.lock = threading.Lock()
        self.chunks, self.finals, self.updates = {}, {}, []

    def on_chunk(self, chunk):
        with self.lock:
            self.chunks[chunk.context] = chunk

    def on_text(self, update):
        with self.lock:
            self.updates.append((threading.get_ident(), update))
            if update.final:
                assert update.context not in self.finals, "two final updates for one frame"
                self.finals[update.context] = update


def prepared(runtime, i):
    return runtime.prepare(observation(i))


@contextmanager
def spied(model, names, before=None, after=None):
    """Every call of `model`'s methods `names` is recorded as (thread name, method, start, end) in the list this
    yields; `before(method)` runs as a call starts, `after(method)` as it ends (before it is recorded). The model's
    own methods are back afterwards."""
    calls, lock = [], threading.Lock()

    def wrap(name):
        original = getattr(model, name)

        def wrapped(*args, **kwargs):
            start = time.perf_counter()
            if before is not None:
                before(name)
            try:
                return original(*args, **kwargs)
            finally:
                if after is not None:
                    after(name)
                with lock:
                    calls.append((threading.current_thread().name, name, start, time.perf_counter()))
        setattr(model, name, wrapped)

    for name in names:
        wrap(name)
    try:
        yield calls
    finally:
        for name in names:
            delattr(model, name)


def narrate_every_frame(runtime, count):
    """`count` seeded frames acted on one after the other, each starting a narration, then every request decoded
    to its end; closes the runtime. Returns the frames' inputs, their noises and their chunks."""
    noises = [torch.randn(1, CONFIG.action_horizon, CONFIG.action_dim, generator=torch.Generator().manual_seed(i))
              for i in range(count)]
    try:
        inputs = [prepared(runtime, i) for i in range(count)]
        chunks = [runtime.act(runtime.frame(inputs[i], narrate=True, noise=noises[i], context=i))
                  for i in range(count)]
        assert runtime.drain(30)
    finally:
        runtime.close()
    assert runtime.worker_error is None
    return inputs, noises, chunks


@pytest.mark.parametrize("overlap_threads", [0, 1])
def test_one_robot_gets_the_isolated_chunks_and_text_through_preemption_and_resumption(model, tokenizer,
                                                                                       overlap_threads):
    """Also with decode steps beside the denoising (`overlap_threads`): nothing changes any result."""
    collect = Collector()
    config = SchedulerConfig(num_steps=2, tokens_per_frame=1, max_new_tokens=6, ignore_eos=True,
                             admission="preempt", max_preempted=16)
    runtime = Runtime(Served(model, tokenizer), RuntimeConfig(config, pool_slots=3, stream_every=2,
                                                              overlap_threads=overlap_threads),
                      on_text=collect.on_text).start()
    inputs, noises, chunks = narrate_every_frame(runtime, 8)
    assert runtime.scheduler.requests_preempted > 0 and runtime.scheduler.requests_resumed > 0
    assert runtime.scheduler.requests_dropped == 0
    for i, chunk in enumerate(chunks):
        actions, tokens = isolated(model, inputs[i], noises[i], 2, 6)
        assert torch.equal(chunk.actions, actions), i
        assert list(collect.finals[i].token_ids) == tokens, i
        assert collect.finals[i].text == tokenizer.decode(tokens)
    # every update left from one thread, and a request's final update is its last
    assert len({thread for thread, _ in collect.updates}) == 1
    last = {}
    for _, update in collect.updates:
        assert not last.get(update.request_id, False), "an update followed its request's final one"
        last[update.request_id] = update.final
    assert any(not u.final for _, u in collect.updates)
    stats = runtime.stats(window_s=60)
    assert stats.actions == 8 and stats.active_requests == 0 and stats.slots_used == 0


@pytest.mark.parametrize("kernel", [False, True])
def test_the_control_path_never_runs_the_text_head(tokenizer, kernel, monkeypatch):
    """A narrating frame's first token is chosen by the language worker's first step for it (through the text head
    in the same pass as the batch's other requests), never by the control path that prefilled it: every use of the
    head, torch's or the CPU kernel's fused one, is on the worker's thread; the text is still isolated execution's."""
    model = build_model(CONFIG, seed=5)
    if kernel:
        model.use_cpu_kernel()
    threads = []

    def on_thread(fn):
        def wrapped(*args, **kwargs):
            threads.append(threading.current_thread().name)
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(model.backbone, "head_logits", on_thread(model.backbone.head_logits))
    monkeypatch.setattr(cpu_kernel, "head_greedy", on_thread(cpu_kernel.head_greedy))
    collect = Collector()
    config = SchedulerConfig(num_steps=2, tokens_per_frame=1, max_new_tokens=4, ignore_eos=True)
    runtime = Runtime(Served(model, tokenizer), RuntimeConfig(config, pool_slots=6, overlap_threads=1),
                      on_text=collect.on_text).start()
    inputs, noises, chunks = narrate_every_frame(runtime, 4)
    assert len(threads) >= 4 and set(threads) == {"oxygen-language"}
    for i in range(4):
        assert list(collect.finals[i].token_ids) == isolated(model, inputs[i], noises[i], 2, 4)[1], i


def test_three_robots_on_one_model_get_the_isolated_chunks_and_text(model, tokenizer):
    """Robots submit from their own threads; the control thread batches their frames (bucket padding with zero
    rows), requests are preempted and resumed along the way, and nothing changes any result."""
    collect = Collector()
    config = SchedulerConfig(num_steps=2, tokens_per_frame=1, max_new_tokens=5, ignore_eos=True,
                             admission="preempt", max_preempted=64, max_batch=4, queue="esf",
                             control_period_s=5.0)
    batches = []
    prefill = model.prefill

    def counting_prefill(inputs, cache, slots, **wanted):
        batches.append(len(slots))
        return prefill(inputs, cache, slots, **wanted)

    model.prefill = counting_prefill
    # 4 language slots: a whole batch can narrate, and requests of later batches preempt earlier ones
    runtime = Runtime(Served(model, tokenizer), RuntimeConfig(config, pool_slots=8),
                      on_text=collect.on_text, on_chunk=collect.on_chunk)
    frames = {(r, i): runtime.prepare(observation(10 * r + i)) for r in range(3) for i in range(5)}
    noises = {key: torch.randn(1, CONFIG.action_horizon, CONFIG.action_dim,
                               generator=torch.Generator().manual_seed(100 + 10 * key[0] + key[1])) for key in frames}

    def robot(r):
        for i in range(5):
            runtime.submit(runtime.frame(frames[r, i], narrate=True, robot_id=f"robot{r}", noise=noises[r, i],
                                         context=(r, i)))
            time.sleep(0.01)

    try:
        robots = [threading.Thread(target=robot, args=(r,)) for r in range(3)]
        for thread in robots:
            thread.start()
        runtime.start(control_thread=True)
        for thread in robots:
            thread.join()
        deadline = time.perf_counter() + 30
        while len(collect.chunks) < 15 and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert runtime.drain(30)
    finally:
        runtime.close()
        del model.prefill
    assert runtime.worker_error is None
    assert max(batches) > 1, "frames of several robots should share a prefill"
    assert runtime.scheduler.requests_preempted > 0 and runtime.scheduler.requests_resumed > 0
    assert sorted(collect.chunks) == sorted(frames) and sorted(collect.finals) == sorted(frames)
    for key, chunk in collect.chunks.items():
        actions, tokens = isolated(model, frames[key], noises[key], 2, 5)
        assert chunk.robot_id == f"robot{key[0]}"
        torch.testing.assert_close(chunk.actions, actions, rtol=1e-4, atol=1e-5)
        assert list(collect.finals[key].token_ids) == tokens, key


def test_language_work_never_overlaps_the_control_paths_model_calls(tokenizer):
    """Spies on the model itself: every model call is recorded with its thread, and no call of the language
    worker overlaps a prefill or denoising of the control path."""
    model = build_model(CONFIG, seed=1)
    period = 0.03
    config = SchedulerConfig(num_steps=2, max_new_tokens=12, control_period_s=period, ignore_eos=True,
                             adaptive_k=True, tokens_per_frame=12)
    with spied(model, ("prefill", "sample_actions", "decode_step", "decode_next", "decode_tokens", "next_tokens")
               ) as calls:
        # room for all 15 requests: however far a busy machine lets the worker fall behind, none is evicted
        runtime = Runtime(Served(model, tokenizer), RuntimeConfig(config, pool_slots=16)).start()
        try:
            next_tick = time.perf_counter()
            for i in range(30):
                next_tick += period
                chunk = runtime.act(runtime.frame(runtime.prepare(observation(i)), narrate=i % 2 == 0))
                assert np.isfinite(runtime.robot_actions(chunk, 3)).all()
                time.sleep(max(0.0, next_tick - time.perf_counter()))
            assert runtime.drain(30)
        finally:
            runtime.close()
    assert runtime.worker_error is None
    control = [(s, e) for thread, _, s, e in calls if thread != "oxygen-language"]
    language = [(s, e) for thread, name, s, e in calls if thread == "oxygen-language"]
    # 15 narrations of 12 tokens: at least 11 batched decode steps, and some ran between control calls
    assert len(control) == 60 and len(language) >= 11
    assert any(l_start < control[-1][0] for l_start, _ in language), "no language work between control calls"
    for c_start, c_end in control:
        for l_start, l_end in language:
            assert l_end <= c_start or l_start >= c_end, "a language call overlapped the control path"


def test_with_overlap_decode_steps_run_beside_the_denoising_and_never_beside_a_prefill(tokenizer):
    """`overlap_threads`: the steps a frame owes may run while it denoises. The spy holds every denoising until a
    decode step has started since the frame's prefill ended (or 5 s passed), so the test sees the overlap however
    loaded the machine is; no decode call may overlap a prefill, and the chunks and text are those of isolated
    execution."""
    model = build_model(CONFIG, seed=5)
    progress = threading.Condition()
    decode_starts, since = [0], [0]  # decode steps started so far; how many had when the last prefill ended
    held = []

    def before(name):
        with progress:
            if name in ("decode_tokens", "next_tokens"):  # a step (next_tokens alone: only first tokens)
                decode_starts[0] += 1
                progress.notify_all()
            elif name == "sample_actions" and runtime.scheduler.has_language_requests():
                held.append(progress.wait_for(lambda: decode_starts[0] > since[0], timeout=5.0))

    def after(name):
        if name == "prefill":
            with progress:
                since[0] = decode_starts[0]

    config = SchedulerConfig(num_steps=3, tokens_per_frame=1, max_new_tokens=5, ignore_eos=True)
    collect = Collector()
    with spied(model, ("prefill", "sample_actions", "decode_tokens", "next_tokens"), before, after) as calls:
        runtime = Runtime(Served(model, tokenizer), RuntimeConfig(config, pool_slots=8, overlap_threads=1),
                          on_text=collect.on_text).start()
        inputs, noises, chunks = narrate_every_frame(runtime, 6)
    assert len(held) == 5 and all(held), "a frame with language work owed did not see a decode step beside it"
    prefills = [(s, e) for thread, name, s, e in calls if name == "prefill" and thread != "oxygen-language"]
    denoises = [(s, e) for _, name, s, e in calls if name == "sample_actions"]
    steps = [(s, e) for thread, name, s, e in calls if thread == "oxygen-language"]
    assert len(prefills) == 6 and len(denoises) == 6
    for p_start, p_end in prefills:
        for d_start, d_end in steps:
            assert d_end <= p_start or d_start >= p_end, "a decode step overlapped a prefill"
    # a step beside a frame's denoising: it started after the frame's prefill ended and before its denoising did
    beside = [any(p_end <= d_start < n_end for (_, p_end), (_, n_end) in zip(prefills, denoises)) for d_start, _ in steps]
    assert sum(beside) >= 5
    for i, chunk in enumerate(chunks):
        actions, tokens = isolated(model, inputs[i], noises[i], 3, 5)
        assert torch.equal(chunk.actions, actions), i
        assert list(collect.finals[i].token_ids) == tokens, i


def test_overlap_threads_is_refused_with_a_stage_split_and_when_negative(model):
    with pytest.raises(ValueError, match="overlap_threads"):
        RuntimeConfig(SchedulerConfig(), overlap_threads=-1)
    with pytest.raises(ValueError, match="stage split"):
        Runtime(Served(model), RuntimeConfig(SchedulerConfig(), overlap_threads=1), stage_workers=object())


def test_bad_observation_raises_and_leaves_the_runtime_usable(model, tokenizer):
    runtime = Runtime(Served(model, tokenizer), RuntimeConfig(SchedulerConfig(num_steps=1, max_new_tokens=4))).start()
    try:
        bad = observation(0)
        bad.state = np.array([0.1, np.nan, 0.2])
        with pytest.raises(ValueError, match="NaN"):
            runtime.prepare(bad)
        chunk = runtime.act(runtime.frame(runtime.prepare(observation(1)), narrate=False))
        assert runtime.robot_actions(chunk, 3).shape == (CONFIG.action_horizon, 3)
        assert runtime.stats().slots_used == 0
    finally:
        runtime.close()


@pytest.mark.parametrize("floor", [0, 2])
def test_adaptive_k_floor_gives_the_text_its_steps_when_no_slack_is_left_and_counts_what_it_cost(model, tokenizer,
                                                                                              floor):
    """A control period of 0.1 ms leaves no slack at all, and frames come back to back: the floor alone makes the
    control path wait for `floor` decode steps after every frame, and every one of them is counted as action time
    given up (it ran past the tick it delayed). Without a floor nothing is counted."""
    config = SchedulerConfig(num_steps=2, max_new_tokens=40, control_period_s=1e-4, ignore_eos=True,
                             adaptive_k=True, tokens_per_frame=40, min_steps_per_frame=floor)
    with spied(model, ("prefill", "sample_actions", "decode_tokens", "next_tokens")) as calls:
        runtime = Runtime(Served(model, tokenizer), RuntimeConfig(config, pool_slots=10)).start()
        try:
            inputs = runtime.prepare(observation(0))
            for _ in range(6):
                runtime.act(runtime.frame(inputs, narrate=True))
            assert runtime.wait_owed(30) and runtime.gate.owed == 0  # the last frame's floor steps ran too
            owed_done = time.perf_counter()
            stats = runtime.stats(window_s=60)
        finally:
            runtime.close()
    assert runtime.worker_error is None
    control = [(s, e) for thread, _, s, e in calls if thread != "oxygen-language"]
    decode = [(s, e) for thread, _, s, e in calls if thread == "oxygen-language"]
    frames = [control[i:i + 2] for i in range(0, len(control), 2)]  # (prefill, sample_actions) per frame
    assert len(frames) == 6
    if floor == 0:
        assert stats.floor_steps == 0 and stats.floor_action_s == 0.0
        return
    for before, after in zip(frames, frames[1:]):
        between = [s for s, e in decode if s >= before[-1][1] and e <= after[0][0]]
        assert len(between) >= floor, "the next frame started before the floor's decode steps"
    assert len([s for s, e in decode if s >= frames[-1][-1][1]]) >= floor
    assert stats.floor_steps >= floor * 6
    # The floor's steps run only while the control path waits for them: between one frame's denoising and the next
    # frame's prefill, and after the last frame until its owed steps are done. What they are counted to have cost
    # the arm is at most that waiting (each step's own span, as the worker clocks it, lies inside it).
    waited_s = sum(after[0][0] - before[-1][1] for before, after in zip(frames, frames[1:]))
    waited_s += owed_done - frames[-1][-1][1]
    assert 0.0 < stats.floor_action_s <= waited_s


def test_a_frame_slot_no_request_takes_is_freed_only_after_its_chunk_is_read_back(model, tokenizer):
    """On a GPU the denoising may still read a frame's slot until its chunk reaches the host; a slot freed before
    that could be prefilled meanwhile by a resume on the language stream. Frames whose slot goes to no request (no
    narration, or a text budget of 0) free it only after the read-back."""
    runtime = Runtime(Served(model, tokenizer), RuntimeConfig(SchedulerConfig(num_steps=1, max_batch=2)))
    runner = runtime.runners["default"]
    events, act, free = [], runner.act, runner.free

    class ReadBack:  # the chunk's tensor as the control path reads it: float(), then cpu()
        def __init__(self, actions):
            self.actions = actions

        def float(self):
            return self

        def cpu(self):
            events.append(("read back",))
            return self.actions.float()

    def spied_act(*args, **kwargs):
        out = act(*args, **kwargs)
        out.actions = ReadBack(out.actions)
        return out

    runner.act = spied_act
    runner.free = lambda slots: (events.append(("free", *slots)), free(slots))
    inputs = prepared(runtime, 0)
    runtime.submit(runtime.frame(inputs, narrate=False, context=0))
    runtime.submit(runtime.frame(inputs, narrate=True, max_new_tokens=0, context=1))
    chunks = []
    assert runtime.run_control(chunks.append)
    assert [c.context for c in chunks] == [0, 1] and all(c.error is None for c in chunks)
    assert events[0] == ("read back",) and sorted(events[1][1:]) == [0, 1] and len(events) == 2
    assert runtime.stats().slots_used == 0


def test_guided_and_plain_frames_with_different_delays_share_a_batch_beside_narration(model, tokenizer):
    """Real-time chunking through the runtime: four robots' frames in one batch, two guided with different delays,
    one plain and one whose previous chunk is too narrow (sampled plainly, counted), two of them narrating. Each
    chunk is what its frame alone gives with the guided sampler (or the plain one), and each narration is the
    isolated greedy text: guidance on the control path changes nothing on the language path."""
    rtc = RtcConfig(execution_horizon=6)
    config = SchedulerConfig(num_steps=3, tokens_per_frame=1, max_new_tokens=4, ignore_eos=True, max_batch=4,
                             control_period_s=60.0)
    collect = Collector()
    runtime = Runtime(Served(model, tokenizer), RuntimeConfig(config, pool_slots=8, rtc=rtc),
                      on_text=collect.on_text, on_chunk=collect.on_chunk)
    generator = torch.Generator().manual_seed(7)
    noises = [torch.randn(1, CONFIG.action_horizon, CONFIG.action_dim, generator=generator) for _ in range(4)]
    left_over = torch.randn(CONFIG.action_horizon - 1, CONFIG.action_dim, generator=generator)
    committed = [Committed(left_over, 1), None, Committed(left_over[:5], 4), Committed(left_over[:, :3], 2)]
    narrate = [True, False, False, True]
    inputs = [prepared(runtime, 40 + i) for i in range(4)]
    try:
        for i in range(4):
            runtime.submit(runtime.frame(inputs[i], narrate[i], robot_id=f"robot{i}", noise=noises[i], context=i,
                                         committed=committed[i]))
        runtime.start()
        with spied(model, ["prefill"]) as calls:
            assert runtime.run_control()
        assert runtime.drain(30)
    finally:
        runtime.close()
    assert runtime.worker_error is None
    assert len([c for c in calls if c[1] == "prefill"]) == 1, "the four frames should be one batch"
    assert sorted(collect.chunks) == [0, 1, 2, 3] and sorted(collect.finals) == [0, 3]
    assert runtime.runners["default"].rtc_fallbacks == {"width": 1}
    for i in range(4):
        cache = KVCache(CONFIG, 1, CONFIG.prefix_len + 4)
        slot = torch.tensor([0])
        prefill = model.prefill(inputs[i], cache, slot, want_logits=True)
        alone = committed[i] if i != 3 else None  # the narrow one: plain
        want = GuidedSampler(rtc).sample(model, cache, slot, noises[i], [alone], 3)[0]
        torch.testing.assert_close(collect.chunks[i].actions, want, rtol=1e-4, atol=1e-5)
        if narrate[i]:
            (tokens,) = greedy_decode(model, cache, slot, prefill, 4, eos_id=-1)
            assert list(collect.finals[i].token_ids) == tokens
    plain = GuidedSampler(rtc)
    cache = KVCache(CONFIG, 1, CONFIG.prefix_len + 4)
    model.prefill(inputs[0], cache, torch.tensor([0]))
    unguided = plain.sample(model, cache, torch.tensor([0]), noises[0], [None], 3)[0]
    assert not torch.allclose(collect.chunks[0].actions, unguided, atol=1e-3)  # guidance did act on robot0


def test_a_frame_with_a_previous_chunk_needs_a_runtime_with_real_time_chunking(model, tokenizer):
    runtime = Runtime(Served(model, tokenizer), RuntimeConfig(SchedulerConfig(num_steps=2), pool_slots=4))
    chunk = Committed(torch.zeros(CONFIG.action_horizon, CONFIG.action_dim), 1)
    with pytest.raises(ValueError, match="no real-time chunking settings"):
        runtime.frame(prepared(runtime, 0), False, committed=chunk)
    runtime.close()
