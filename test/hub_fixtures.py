"""A huggingface_hub cache laid out by the test, offline: what hub ids resolve against here (no network).

`hub_cache` points `HF_HUB_CACHE` at an empty folder and sets `HF_HUB_OFFLINE=1`, both in the environment (child
processes read them when huggingface_hub is imported) and in the already imported library's constants (this
process); `cache_repo` adds one snapshot of a repo the way huggingface_hub writes it: the files as blobs, the
snapshot's files as relative symlinks to them, refs naming the commit.
"""

import hashlib
import os
from pathlib import Path

import pytest
from huggingface_hub import constants
from tokenizers import Tokenizer, models, pre_tokenizers

from oxygen_ros.model.corpus import sentences


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    for name, value in (("HF_HUB_CACHE", str(cache)), ("HF_HUB_OFFLINE", True)):
        monkeypatch.setenv(name, "1" if value is True else value)
        monkeypatch.setattr(constants, name, value)
    return cache


def cache_repo(cache: Path, repo_id: str, files: dict[str, Path | bytes], commit: str,
               refs: tuple[str, ...] = ("main",)) -> Path:
    """Put `files` (name in the repo -> a file to copy, or bytes) into `cache` as snapshot `commit` of `repo_id`,
    with each of `refs` pointing at it; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for name, content in files.items():
        data = content if isinstance(content, bytes) else Path(content).read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Every file of a checkpoint folder by its relative name, for `cache_repo`."""
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}


def word_tokenizer_json(path: Path, vocab_size: int) -> Path:
    """A `tokenizers` file (what transformers' fast tokenizers save as `tokenizer.json`) with exactly `vocab_size`
    tokens: Gemma's special tokens at ids 0-3, the bundled corpus's words, then fillers."""
    words = sorted({w for s in sentences() for w in s.split()})
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", *words]
    tokens += [f"<unused{i}>" for i in range(vocab_size - len(tokens))]
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(tokens[:4])
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path
