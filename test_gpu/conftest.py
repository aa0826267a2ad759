"""The checks that need a CUDA GPU (`make test-gpu`). Without one the run fails at once rather than skipping:
these tests are the only proof of the CUDA paths, so a green run must mean they ran."""

import pytest
import torch


def pytest_configure(config):
    if not torch.cuda.is_available():
        raise pytest.UsageError("test_gpu needs a CUDA device; run it on a GPU machine (make test-gpu)")
