"""The model's tokenizer: PaliGemma's SentencePiece model or its `tokenizer.json`, or a small one trained on the spot.

pi0.5 checkpoints expect PaliGemma's vocabulary. It comes as a SentencePiece `.model` file (openpi's
`paligemma_tokenizer.model`, the hub repo's `tokenizer.model`) or as the `tokenizer.json` that transformers' Gemma
tokenizer (what LeRobot loads through `AutoTokenizer`) reads with the `tokenizers` library; both carry the same
pieces and ids. Random-init presets and tests get a stand-in with the same special ids (pad 0, eos 1, bos 2,
unk 3) and byte fallback, so any text encodes and decoding code paths behave as with the real one.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import sentencepiece as spm

from .config import BOS_ID, EOS_ID, PAD_ID
from .corpus import sentences

UNK_ID = 3
JSON_SUFFIX = ".json"  # a `tokenizers` file; anything else is read as a SentencePiece model
# The special tokens at pad / eos / bos ids in a `tokenizers` file: Gemma's names, or SentencePiece's defaults.
_SPECIAL_NAMES = ({"<pad>"}, {"<eos>", "</s>"}, {"<bos>", "<s>"})


class Tokenizer:
    """Text <-> token ids with the ids the model relies on (pad 0, eos 1, bos 2) checked at load time."""

    def __init__(self, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], vocab_size: int):
        self._encode, self._decode, self._vocab_size = encode, decode, vocab_size

    @classmethod
    def from_sentencepiece(cls, processor: spm.SentencePieceProcessor) -> Tokenizer:
        ids = (processor.pad_id(), processor.eos_id(), processor.bos_id())
        if ids != (PAD_ID, EOS_ID, BOS_ID):
            raise ValueError(f"tokenizer must use pad/eos/bos ids {(PAD_ID, EOS_ID, BOS_ID)}, got {ids}")
        return cls(processor.encode, processor.decode, processor.vocab_size())

    @classmethod
    def from_tokenizers(cls, tokenizer) -> Tokenizer:
        """A `tokenizers.Tokenizer` (a `tokenizer.json`); special tokens are never produced from text nor shown,
        as SentencePiece treats its control pieces."""
        names = tuple(tokenizer.id_to_token(i) for i in (PAD_ID, EOS_ID, BOS_ID))
        if not all(name in allowed for name, allowed in zip(names, _SPECIAL_NAMES, strict=True)):
            raise ValueError(f"tokenizer must have pad/eos/bos at ids {(PAD_ID, EOS_ID, BOS_ID)}, has {names}")
        return cls(lambda text: tokenizer.encode(text, add_special_tokens=False).ids,
                   lambda ids: tokenizer.decode(ids, skip_special_tokens=True), tokenizer.get_vocab_size())

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(self._encode(text))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        return self._decode([int(i) for i in ids])


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer file from a local path: `*.json` with `tokenizers`, anything else as a SentencePiece
    model (e.g. PaliGemma's)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer file at {path}")
    if path.suffix == JSON_SUFFIX:
        from tokenizers import Tokenizer as JsonTokenizer  # installed with transformers

        try:
            return Tokenizer.from_tokenizers(JsonTokenizer.from_file(str(path)))
        except Exception as err:  # the library raises a bare Exception for a malformed file
            raise ValueError(f"{path} is not a tokenizers file: {err}") from None
    return Tokenizer.from_sentencepiece(spm.SentencePieceProcessor(model_proto=path.read_bytes()))


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
