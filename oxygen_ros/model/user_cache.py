"""Files built once per user and reused: the stand-in tokenizer, the compiled CPU kernel.

They live in `$XDG_CACHE_HOME/oxygen_ros`, else `~/.cache/oxygen_ros`. Each is written under a temporary name and
renamed into place, so processes starting together never read a half-written file (two that build the same file
at once both succeed; the last rename wins with identical contents).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "oxygen_ros"


def cached_file(name: str, write: Callable[[str], None]) -> Path:
    """The cached file `name`, made by `write(path)` on first use (`write` must create the file at `path`)."""
    path = cache_dir() / name
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
