"""What of the CUDA-graph path can be checked without a GPU (the graphs themselves are tested in test_gpu/): a CPU
model refuses graphs and keeps running eagerly, and a bucket's padding repeats the batch's first row."""

import pytest
import torch

from oxygen_ros.model.config import get_preset
from oxygen_ros.model.cuda_graphs import _padded
from oxygen_ros.model.pi05 import build_model


def test_a_cpu_model_refuses_graphs_and_stays_eager():
    model = build_model(get_preset("tiny"), seed=0)
    with pytest.raises(ValueError, match="CUDA device"):
        model.use_cuda_graphs()
    assert model._graphs is None


def test_padding_repeats_the_first_row_along_the_batch_dimension():
    rows = torch.arange(6).reshape(3, 2)
    assert torch.equal(_padded(rows, 3), rows)
    assert _padded(rows, 5).tolist() == [[0, 1], [2, 3], [4, 5], [0, 1], [0, 1]]
    layers = torch.arange(12).reshape(2, 3, 2)  # [depth, batch, ...]: padded along dim 1
    assert torch.equal(_padded(layers, 4, dim=1)[:, 3], layers[:, 0])
