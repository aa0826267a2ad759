"""The task text a robot is given: a default until one arrives, cut to a length and to the model's prompt.

Every front end that takes instructions (the VLA node's latched `instruction` topic, the fleet node's per robot)
keeps one `Instruction` per robot; the robot's session (`robots.session`) fits it to the prompt before each frame.
"""

from __future__ import annotations

import unicodedata

import numpy as np

from oxygen_ros.model.preprocess import normalized_state
from oxygen_ros.model.prompt import tokenize_prompt

_ZWJ = "\u200d"


def cut_text(text: str, length: int) -> str:
    """`text[:length]`, moved back so that no character loses a combining mark, emoji modifier or ZWJ sequence."""

    def extends(char: str) -> bool:  # belongs to the character before it
        return unicodedata.category(char) in ("Mn", "Mc", "Me") or char == _ZWJ or "\U0001f3fb" <= char <= "\U0001f3ff"

    while 0 < length < len(text) and (extends(text[length]) or text[length - 1] == _ZWJ):
        length -= 1
    return text[:length].rstrip()


class Instruction:
    """The task text: a default until a message arrives; empty ones ignored, long ones cut, both counted.

    Cutting never leaves an empty task: a text cut to nothing keeps its first character (`set`), and a prompt that
    fits no prefix of the new text falls back to the previous task (`fit_prompt`).
    """

    def __init__(self, default: str, max_chars: int):
        self.max_chars = max_chars
        self.text = cut_text(default, max_chars) or default[:max_chars]
        self._received = self.text  # the last accepted text before any prompt fitting
        self._previous = self.text  # the task in use before the last accepted change
        self.version = 0  # bumped on every accepted change (on_instruction_change narrates once per version)
        self.ignored = 0
        self.truncated = 0

    def set(self, text: str) -> str:
        """Apply a received instruction; returns "ignored", "truncated" or "accepted"."""
        text = text.strip()
        if not text:
            self.ignored += 1
            return "ignored"
        outcome = "accepted"
        if len(text) > self.max_chars:
            text = cut_text(text, self.max_chars) or text[: self.max_chars]
            self.truncated += 1
            outcome = "truncated"
        if text != self._received:
            self._previous, self.text, self._received = self.text, text, text
            self.version += 1
        return outcome

    def fit_prompt(self, tokenizer, state: np.ndarray, config, norm_stats) -> str | None:
        """Shorten the text until the model's prompt fits max_token_len with this state.

        Drops words from the end; when not even the first word fits, cuts characters (`cut_text`); when no
        prefix fits, goes back to the previous task. Returns "cut" or "previous" (the text changed, same version:
        it is the same task), or None when the text already fits or no shortening helps (then the prompt error
        has another cause).
        """
        try:
            normalized = normalized_state(state, config, norm_stats)
        except ValueError:
            return None  # the state itself is the problem, not the text

        def fits(text: str) -> bool:
            try:
                tokenize_prompt(tokenizer, text, normalized, config.max_token_len)
            except ValueError:
                return False
            return True

        def longest(count: int, prefix) -> int:  # the largest n in [0, count] whose prefix(n) fits
            low, high = 0, count + 1  # prefix(low) fits, prefix(high) does not
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if fits(prefix(middle)) else (low, middle)
            return low

        if fits(self.text) or not fits(""):
            return None
        words = self.text.split()
        shorter = " ".join(words[: longest(len(words), lambda n: " ".join(words[:n]))])
        if not shorter:
            shorter = cut_text(self.text, longest(len(self.text), lambda n: self.text[:n]))
        if shorter and fits(shorter):
            self.text = shorter
            self.truncated += 1
            return "cut"
        if self._previous != self.text and fits(self._previous):
            self.text = self._previous
            return "previous"
        return None
