"""`decode_batch` keeps a batch's index tensors on the device and advances them in place while the batch keeps its
members: the tokens are exactly those of rebuilding every index from the requests each step, in float32 and
bfloat16, while requests join, finish, sample, are preempted and resume in another slot."""

import functools

import pytest
import torch

from oxygen_ros.engine.language import decode_batch, start_request
from oxygen_ros.engine.model_runner import ModelRunner
from oxygen_ros.evaluation.bench.model_bench import random_inputs
from oxygen_ros.model.config import get_preset
from oxygen_ros.model.kv_cache import DecodeIndex
from oxygen_ros.model.pi05 import build_model

CFG = get_preset("tiny")
MAX_NEW = 9


def rebuilt_step(model, cache, requests):
    """The reference: every index built from the requests' lists, as a step did before indexes were kept."""
    active = sorted((r for r in requests if not r.done), key=lambda r: r.slot)
    offsets = torch.tensor([len(r.tokens) - 1 for r in active])
    chosen = model.decode_next(cache, torch.tensor([r.slot for r in active]), torch.tensor([r.tokens[-1] for r in active]),
                               torch.tensor([r.prefix_len for r in active]) + offsets,
                               torch.tensor([r.num_valid_prefix for r in active]) + offsets,
                               [r.sampler() for r in active])
    for request, token in zip(active, chosen.tolist()):
        request.accept(token, 0.0)


class World:
    """One model runner (its pool) and the requests it serves; `step` is how it decodes."""

    def __init__(self, model, step):
        self.runner = ModelRunner(model, language_slots=6, max_new_tokens=MAX_NEW)
        self.model, self.step, self.requests, self.inputs = model, step, {}, {}

    def start(self, name, seed, max_new_tokens, temperature=0.0):
        inputs = random_inputs(CFG, 1, seed=seed).to(self.model.device, self.model.dtype)
        slot = self.runner.pool.allocate(name)
        prefill = self.model.prefill(inputs, self.runner.pool.cache, torch.tensor([slot]), want_logits=True)
        self.requests[name] = start_request(seed, slot, seed, 0, CFG.prefix_len, int(prefill.num_valid[0]),
                                            prefill.logits[0], max_new_tokens, eos_id=-1, temperature=temperature,
                                            seed=seed)
        self.inputs[name] = inputs

    def decode(self, *names):
        self.step(self.model, self.runner.pool.cache, [self.requests[n] for n in names])

    def preempt(self, name):
        self.runner.free([self.requests[name].slot])

    def resume(self, name):
        self.runner.resume(self.requests[name], self.inputs[name])

    def finish(self, name):
        self.runner.free([self.requests.pop(name).slot])


def play(world):
    world.start("a", 1, MAX_NEW)
    world.start("b", 2, MAX_NEW)
    world.start("c", 3, 4, temperature=0.8)  # samples from its own stream; has its 4 tokens after 3 steps
    for _ in range(3):
        world.decode("a", "b", "c")  # one batch, slots 0..2: built once, then advanced
    world.start("d", 4, MAX_NEW)
    world.decode("a", "b", "c", "d")  # d joins as c has finished
    world.finish("c")
    world.preempt("b")  # slot 1 free: a and d are no longer one range of slots
    world.decode("a", "d")
    world.decode("a", "d")
    world.start("e", 5, MAX_NEW)  # takes slot 1
    world.resume("b")  # its prefix again and its tokens replayed, in slot 4
    while any(not r.done for r in world.requests.values()):
        world.decode(*world.requests)  # a, b, d, e until each reaches its length
    return {name: r.tokens for name, r in world.requests.items()}, world.runner.pool.cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kept_indexes_give_the_tokens_of_rebuilt_ones(dtype, monkeypatch):
    advances = []
    advance = DecodeIndex.advance

    def counted(index):
        advances.append(len(index))
        advance(index)

    monkeypatch.setattr(DecodeIndex, "advance", counted)
    model = build_model(CFG, dtype=dtype, seed=7)
    kept_tokens, kept_cache = play(World(model, decode_batch))
    kept_advances, advances[:] = list(advances), []
    rebuilt_tokens, rebuilt_cache = play(World(model, rebuilt_step))
    assert kept_tokens == rebuilt_tokens
    assert all(len(t) == MAX_NEW for t in kept_tokens.values())
    assert torch.equal(kept_cache.k, rebuilt_cache.k) and torch.equal(kept_cache.valid, rebuilt_cache.valid)
    assert not advances  # the reference never kept an index
    # advanced in place: the 2nd and 3rd steps of (a, b, c), the 2nd of (a, d), then (a, b, d, e), (b, d, e) and
    # e alone after their first steps until a member finishes; every other step built a new index
    assert kept_advances == [3, 3, 2, 4, 3, 1, 1]


def test_an_index_is_checked_once_and_advances_up_to_the_slots_end():
    model = build_model(CFG, seed=0)
    cache = ModelRunner(model, language_slots=2, max_new_tokens=2).pool.cache
    with pytest.raises(ValueError, match="cache_index must lie in"):
        DecodeIndex(cache, torch.tensor([0]), torch.tensor([CFG.prefix_len + 2]), torch.tensor([0]))
    with pytest.raises(ValueError, match="distinct"):
        DecodeIndex(cache, torch.tensor([1, 1]), torch.full((2,), CFG.prefix_len), torch.zeros(2))
    index_list = [CFG.prefix_len]
    given = torch.tensor(index_list)
    index = DecodeIndex(cache, torch.tensor([1]), given, torch.tensor([5]))
    index.advance()
    assert index.cache_index.tolist() == [CFG.prefix_len + 1] and index.positions.tolist() == [6]
    assert given.tolist() == index_list  # the caller's tensor is not the index's
    with pytest.raises(ValueError, match="full"):
        index.advance()
    with pytest.raises(ValueError, match=r"tokens must have shape \(1,\)"):
        model.decode_tokens(cache, index, torch.tensor([3, 4]))


def test_an_index_from_host_lists_is_the_index_from_tensors():
    """What `decode_batch` builds when a batch changes: the same slots, cache indices, positions, slot range and span
    as the tensor-built index, checked alike, and advancing alike (its three tensors are rows of one)."""
    model = build_model(CFG, seed=0)
    cache = ModelRunner(model, language_slots=4, max_new_tokens=4).pool.cache
    for slots in ([1, 2, 3], [3, 1]):  # one range (views of the cache) and not (a gather)
        at = [CFG.prefix_len + i for i in range(len(slots))]
        positions = [7 + i for i in range(len(slots))]
        built = DecodeIndex(cache, torch.tensor(slots), torch.tensor(at), torch.tensor(positions))
        listed = DecodeIndex.from_lists(cache, slots, at, positions)
        for index in (built, listed):
            index.advance()
        assert listed.idx == built.idx if isinstance(built.idx, slice) else torch.equal(listed.idx, built.idx)
        for name in ("slots", "cache_index", "positions"):
            mine, theirs = getattr(listed, name), getattr(built, name)
            assert mine.dtype == theirs.dtype == torch.long and mine.is_contiguous() and torch.equal(mine, theirs)
        assert listed.span == built.span and len(listed) == len(built)
    with pytest.raises(ValueError, match="cache_index must lie in"):
        DecodeIndex.from_lists(cache, [0], [CFG.prefix_len - 1], [0])
    with pytest.raises(ValueError, match="distinct"):
        DecodeIndex.from_lists(cache, [1, 1], [CFG.prefix_len] * 2, [0, 0])
    with pytest.raises(ValueError, match="out of range"):
        DecodeIndex.from_lists(cache, [9], [CFG.prefix_len], [0])
    with pytest.raises(ValueError, match=r"positions must have shape \(2,\)"):
        DecodeIndex.from_lists(cache, [1, 2], [CFG.prefix_len] * 2, [0])
    with pytest.raises(ValueError, match="non-empty"):
        DecodeIndex.from_lists(cache, [], [], [])


def start_from_hidden(world, name, seed, max_new_tokens, temperature=0.0):
    """`World.start` keeping the prefix's last-layer output instead of its logits (as the runtime does)."""
    inputs = random_inputs(CFG, 1, seed=seed).to(world.model.device, world.model.dtype)
    slot = world.runner.pool.allocate(name)
    prefill = world.model.prefill(inputs, world.runner.pool.cache, torch.tensor([slot]), want_hidden=True)
    assert prefill.logits is None
    world.requests[name] = start_request(seed, slot, seed, 0, CFG.prefix_len, int(prefill.num_valid[0]), None,
                                         max_new_tokens, eos_id=-1, temperature=temperature, seed=seed,
                                         first_hidden=prefill.hidden[0])
    assert not world.requests[name].tokens and not world.requests[name].done
    world.inputs[name] = inputs


@pytest.mark.parametrize("kernel", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_request_started_from_its_last_layer_output_gets_the_text_of_one_started_from_logits(dtype, kernel):
    """Requests whose first token is chosen by their first decode step (greedy and sampled), alone in a step and
    in the same head pass as requests already decoding, preempted before their first token and resumed: the same
    text as requests started from the prefill's logits, step for step one token later."""
    model = build_model(CFG, dtype=dtype, seed=7)
    if kernel:
        model.use_cpu_kernel()
    texts = []
    for from_hidden in (False, True):
        world = World(model, decode_batch)
        start = functools.partial(start_from_hidden, world) if from_hidden else world.start
        start("a", 1, MAX_NEW)
        start("b", 2, MAX_NEW, temperature=0.8)
        world.decode("a", "b")  # from hidden: a step of first tokens only
        world.start("c", 3, MAX_NEW)
        start("d", 4, MAX_NEW)
        start("e", 5, MAX_NEW, temperature=0.8)
        world.preempt("e")
        world.decode("a", "b", "c", "d")  # d's first token in the same pass as a, b and c's next ones
        world.resume("e")
        while any(not r.done for r in world.requests.values()):
            world.decode(*world.requests)
        texts.append({name: r.tokens for name, r in world.requests.items()})
    assert texts[1] == texts[0]
    assert all(len(t) == MAX_NEW for t in texts[0].values())


def test_a_request_starts_from_its_logits_or_its_last_layer_output():
    for first in ((None, None), (torch.zeros(8), torch.zeros(4))):
        with pytest.raises(ValueError, match="one of them"):
            start_request(1, 0, 0, 0, CFG.prefix_len, 3, first[0], 4, eos_id=-1, first_hidden=first[1])
    assert start_request(1, 0, 0, 0, CFG.prefix_len, 3, None, 0, eos_id=-1, first_hidden=torch.zeros(4)).done


@pytest.mark.parametrize("kernel", [False, True])
def test_a_text_head_that_overflows_ends_its_requests_as_model_errors(kernel):
    """Non-finite logits are no token: requests decoding, starting from their last-layer output or from the
    prefill's logits all end with finish_reason "nonfinite" (eager step, and the CPU kernel's fused head)."""
    model = build_model(CFG, seed=7)
    if kernel:
        model.use_cpu_kernel()
    world = World(model, decode_batch)
    world.start("a", 1, MAX_NEW)
    start_from_hidden(world, "b", 2, MAX_NEW)
    world.decode("a", "b")
    assert len(world.requests["a"].tokens) == 2 and len(world.requests["b"].tokens) == 1  # a healthy head
    with torch.no_grad():
        model.backbone.text_head.fill_(3e38)  # finite weights whose products overflow
    world.decode("a", "b")
    start_from_hidden(world, "c", 3, MAX_NEW)
    world.decode("c")
    world.start("d", 4, MAX_NEW)
    assert {n: (r.finish_reason, len(r.tokens)) for n, r in world.requests.items()} == {
        "a": ("nonfinite", 2), "b": ("nonfinite", 1), "c": ("nonfinite", 0), "d": ("nonfinite", 0)}
