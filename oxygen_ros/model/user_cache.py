"""Files built once per user and reused: the stand-in tokenizer, the compiled CPU kernel.

They live in `$XDG_CACHE_HOME/oxygen_ros`, else `~/.cache/oxygen_ros`. Each is written under a temporary name and
renamed into place, so no process ever reads a half-written file. One process makes it at a time (a lock file
beside it while it is made): processes that start together on a fresh machine wait for the first one's file
instead of each making their own (a kernel build takes a CPU-minute there).
"""

from __future__ import annotations

import fcntl
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
    lock_path = path.parent / f"{name}.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.is_file():  # made while this process waited
            return path
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
            # Whoever waits on this lock finds the file once it has it; a process that comes later finds the file
            # before it looks for the lock.
            lock_path.unlink(missing_ok=True)
    return path
