"""A random-init model made on its target device: every parameter and buffer is made there (on the meta device, no
memory at all: the CPU never holds the released shapes), in the asked dtype, and a seed gives the same weights."""

import torch

from oxygen_ros.model.config import get_preset
from oxygen_ros.model.loading import build_on_device
from oxygen_ros.model.pi05 import build_model, parameter_counts


def test_the_released_shapes_are_made_on_the_target_device_in_its_dtype():
    model = build_on_device(get_preset("pi05"), "meta", torch.bfloat16)
    tensors = [*model.parameters(), *model.buffers()]
    assert {t.device.type for t in tensors} == {"meta"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert parameter_counts(model)["total"] > 3_000_000_000 and not model.training


def test_a_seed_gives_the_same_weights_on_the_same_device():
    config = get_preset("tiny")
    first, again, other = (build_on_device(config, "cpu", torch.bfloat16, seed=s) for s in (3, 3, 4))
    state, same, different = first.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(state[k], same[k]) for k in state)
    assert any(not torch.equal(state[k], different[k]) for k in state)
    # on the CPU its initialisers draw what build_model's do: the same weights, cast
    reference = build_model(config, dtype=torch.bfloat16, seed=3).state_dict()
    assert all(torch.equal(state[k], reference[k]) for k in state)
