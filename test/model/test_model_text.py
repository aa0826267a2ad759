"""Tokenizer training/loading and the pi0.5 prompt with its 256-bin state discretisation."""

import numpy as np
import pytest

from oxygen_ros.model.config import BOS_ID, PAD_ID, get_preset
from oxygen_ros.model.prompt import clean_prompt, discretize_state, format_prompt, tokenize_prompt
from oxygen_ros.model.tokenizer import load_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tiny.model", get_preset("tiny").vocab_size)


def test_training_is_deterministic_and_sized_to_the_preset(tmp_path, tokenizer_path):
    for preset in ("tiny", "small"):
        vocab = get_preset(preset).vocab_size
        path = train_tokenizer(tmp_path / f"{preset}.model", vocab)
        assert load_tokenizer(path).vocab_size == vocab
    again = train_tokenizer(tmp_path / "again.model", get_preset("tiny").vocab_size)
    assert again.read_bytes() == tokenizer_path.read_bytes()


def test_loaded_tokenizer_round_trips_any_text(tokenizer_path):
    tok = load_tokenizer(tokenizer_path)
    for text in ("pick up the red cube", "Task: fold, State: 0 255;\nAction: ", "zébra 机器人 ☃"):
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
    assert tok.encode("hi", add_bos=True)[0] == BOS_ID


def test_load_tokenizer_rejects_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nope.model")


def test_state_discretisation_matches_pi05_formula():
    state = np.array([-1.0, -0.99, -0.5, 0.0, 0.003, 0.5, 0.999, 1.0])
    reference = np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1
    assert discretize_state(state).tolist() == reference.tolist() == [0, 1, 64, 128, 128, 192, 255, 255]
    # Out of range values are clipped instead of producing -1 or 256.
    assert discretize_state(np.array([-3.0, 7.0])).tolist() == [0, 255]


def test_prompt_text_and_cleaning():
    assert clean_prompt("  pick_up the\ncube \n") == "pick up the cube"
    assert (
        format_prompt(" open_drawer\n", np.array([0, 128, 255]))
        == "Task: open drawer, State: 0 128 255;\nAction: "
    )


def test_tokenize_prompt_pads_and_masks(tokenizer_path):
    tok = load_tokenizer(tokenizer_path)
    tokens, mask = tokenize_prompt(tok, "pick up the cube", np.array([0.0, -1.0]), max_len=32)
    expected = [BOS_ID, *tok.encode("Task: pick up the cube, State: 128 0;\nAction: ")]
    n = len(expected)
    assert tokens[:n].tolist() == expected and mask[:n].all()
    assert (tokens[n:] == PAD_ID).all() and not mask[n:].any()
    with pytest.raises(ValueError, match="max_token_len"):
        tokenize_prompt(tok, "a very long task " * 20, np.zeros(4), max_len=32)
