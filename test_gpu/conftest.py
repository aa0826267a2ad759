"""The checks that need a CUDA GPU (`make test-gpu`). Without one the run fails at once rather than skipping:
these tests are the only proof of the CUDA paths, so a green run must mean they ran. Collecting them
(`pytest --collect-only test_gpu`) needs no GPU: nothing touches CUDA at import."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "test"))  # the shared engine_fixtures

from engine_fixtures import tokenizer  # noqa: E402, F401 - the fixture, for every test here


def pytest_configure(config):
    config.addinivalue_line("markers", "sm_partitions: needs green-context SM partitions (gpu_check.sh leaves "
                            "these out, said in its log, where the driver makes none)")
    if not torch.cuda.is_available() and not config.option.collectonly:
        raise pytest.UsageError("test_gpu needs a CUDA device; run it on a GPU machine (make test-gpu)")
