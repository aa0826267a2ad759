"""`model.device`: `auto` is cuda when torch sees a CUDA device and cpu otherwise (the node's parameters make it
concrete), and an explicit `cuda` without a device is one clear error, before any weights are built (the node's
ParameterError, serve's ValueError). torch's view of the machine is set by the test either way."""

import re

import pytest
import torch

from oxygen_ros.commands.serve import Capacity, build_server
from oxygen_ros.nodes.model_setup import load_policy
from oxygen_ros.nodes.parameters import OPTIONAL, REQUIRED, SPECS, ParameterError, read_parameters
from oxygen_ros.serving.params import engine_parameters
from oxygen_ros.serving.server import ServeConfig

NO_CUDA = "model.device is cuda but torch sees no CUDA device (use cpu or auto)"


def params(device: str):
    values = {spec.name: None if spec.default in (REQUIRED, OPTIONAL) else spec.default for spec in SPECS}
    values.update({"cameras.topics": ["cam/a"], "cameras.keys": ["base_0_rgb"], "joints.state_names": ["a"],
                   "joints.action_names": ["a"], "model.device": device})
    return read_parameters(values)


def sees_cuda(monkeypatch, available: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)


def test_auto_is_cuda_where_torch_sees_a_device_else_cpu(monkeypatch):
    assert next(s for s in SPECS if s.name == "model.device").default == "auto"
    for available, device in ((True, "cuda"), (False, "cpu")):
        sees_cuda(monkeypatch, available)
        assert params("auto").device == device
        assert params("cpu").device == "cpu"  # an explicit choice is kept
    sees_cuda(monkeypatch, True)
    assert params("cuda").device == "cuda"
    with pytest.raises(ParameterError, match=re.escape("model.device must be one of auto | cpu | cuda, got 'gpu'")):
        params("gpu")


def test_cuda_without_a_device_is_one_clear_error(monkeypatch):
    sees_cuda(monkeypatch, False)
    cuda = params("cuda")  # read as given: the device is checked where the model would be built
    assert cuda.device == "cuda"
    with pytest.raises(ParameterError) as error:
        load_policy(cuda)
    assert str(error.value) == NO_CUDA
    with pytest.raises(ValueError) as error:
        build_server(engine_parameters([], ["model.device=cuda"]), ServeConfig(port=0), Capacity())
    assert str(error.value) == NO_CUDA
