"""Inputs the engine tests share (CPU and GPU suites): robot observations and a tokenizer for the tiny preset."""

import numpy as np
import pytest

from oxygen_ros.model.config import get_preset
from oxygen_ros.model.preprocess import Observation
from oxygen_ros.model.tokenizer import load_tokenizer, train_tokenizer

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(train_tokenizer(tmp_path_factory.mktemp("tok") / "tiny.model", TINY.vocab_size))


def observation(i: int) -> Observation:
    """A seeded raw observation for the tiny preset: small camera images, a 3-joint state and a task."""
    rng = np.random.default_rng(i)
    images = {name: rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for name in TINY.camera_names}
    return Observation(images=images, state=rng.uniform(-1, 1, 3), task="pick up the cube")
