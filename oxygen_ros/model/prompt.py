"""The pi0.5 text prompt: task and discretised robot state, tokenized and right-padded for the prefix.

pi0.5 has no continuous state input; the normalised state is written into the prompt as 256-bin integers,
`"Task: {task}, State: {bins};\\nAction: "`, exactly as openpi and LeRobot format it, so a checkpoint sees
the text it was trained on.
"""

from __future__ import annotations

import numpy as np

from .config import PAD_ID
from .tokenizer import Tokenizer

NUM_STATE_BINS = 256


def clean_prompt(text: str) -> str:
    """Strip, and replace underscores and newlines by spaces (dataset task names often use underscores)."""
    return text.strip().replace("_", " ").replace("\n", " ")


def discretize_state(state: np.ndarray) -> np.ndarray:
    """Normalised state in [-1, 1] -> bin indices 0..255, the pi0.5 convention.

    Values outside [-1, 1] are clipped first: the reference formula would map them to -1 or past 255.
    """
    state = np.clip(np.asarray(state, dtype=np.float64), -1.0, 1.0)
    edges = np.linspace(-1.0, 1.0, NUM_STATE_BINS + 1)[:-1]
    return np.digitize(state, bins=edges) - 1


def format_prompt(task: str, state_bins: np.ndarray) -> str:
    bins = " ".join(str(int(b)) for b in state_bins)
    return f"Task: {clean_prompt(task)}, State: {bins};\nAction: "


def tokenize_prompt(
    tokenizer: Tokenizer, task: str, state: np.ndarray, max_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [max_len] int64 (BOS first, right-padded with PAD) and their mask [max_len] bool.

    A prompt longer than `max_len` is an error rather than silently truncated: cutting it would drop the
    `Action:` cue the model was trained to continue from.
    """
    ids = tokenizer.encode(format_prompt(task, discretize_state(state)), add_bos=True)
    if len(ids) > max_len:
        raise ValueError(f"prompt needs {len(ids)} tokens, more than max_token_len={max_len}")
    tokens = np.full(max_len, PAD_ID, dtype=np.int64)
    tokens[: len(ids)] = ids
    mask = np.zeros(max_len, dtype=bool)
    mask[: len(ids)] = True
    return tokens, mask
