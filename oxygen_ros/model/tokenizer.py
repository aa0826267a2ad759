"""SentencePiece tokenizer: the real PaliGemma model from a local file, or a small one trained on the spot.

pi0.5 checkpoints expect PaliGemma's `paligemma_tokenizer.model`; users point us at their copy. Random-init
presets and tests get a stand-in with the same special ids (pad 0, eos 1, bos 2, unk 3) and byte fallback, so
any text encodes and decoding code paths behave as with the real one.
"""

from __future__ import annotations

import io
from pathlib import Path

import sentencepiece as spm

from .config import BOS_ID, EOS_ID, PAD_ID
from .corpus import sentences

UNK_ID = 3


class Tokenizer:
    """Thin wrapper over `SentencePieceProcessor` with the ids the model relies on checked at load time."""

    def __init__(self, processor: spm.SentencePieceProcessor):
        ids = (processor.pad_id(), processor.eos_id(), processor.bos_id())
        if ids != (PAD_ID, EOS_ID, BOS_ID):
            raise ValueError(f"tokenizer must use pad/eos/bos ids {(PAD_ID, EOS_ID, BOS_ID)}, got {ids}")
        self._sp = processor

    @property
    def vocab_size(self) -> int:
        return self._sp.vocab_size()

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._sp.encode(text)
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode([int(i) for i in ids])


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a SentencePiece `.model` file (e.g. PaliGemma's) from a local path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no SentencePiece model at {path}")
    return Tokenizer(spm.SentencePieceProcessor(model_proto=path.read_bytes()))


def train_tokenizer(path: str | Path, vocab_size: int) -> Path:
    """Train a BPE SentencePiece model on the bundled corpus and write it to `path`; returns the path.

    Deterministic (single thread, fixed corpus order, no sampling): the same vocab size gives the same bytes.
    Takes well under a second. Identity normalisation keeps newlines as text, as PaliGemma's tokenizer does.
    """
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences(),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type="bpe",
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
        unk_id=UNK_ID,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        shuffle_input_sentence=False,
        num_threads=1,
        minloglevel=2,
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return path
