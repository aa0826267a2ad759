"""Write outputs under a temporary name and move them into place only when complete.

A crash or a bad input half way through a conversion must not leave a file or bag directory that looks valid;
renaming within one directory is atomic, so readers see either nothing or the finished result.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .episode import DataError


@contextmanager
def atomic_output(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a path (not yet existing) to write to; it becomes `final` if the block succeeds.

    The staging directory sits next to `final` so the rename never crosses filesystems; on any exception it is
    removed, and `final` is never created.
    """
    final = Path(final)
    if final.exists():
        raise DataError(f"{final}: output already exists; refusing to overwrite")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    target = staging / final.name
    try:
        yield target
        if not target.exists():
            raise DataError(f"{final}: nothing was written")
        os.rename(target, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def output_folder(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a folder to write files into: `final` itself if it already is a folder, else a staging folder that
    becomes `final` only if the block succeeds (so a failure leaves no new, empty or half-written folder)."""
    final = Path(final)
    if final.is_dir():
        yield final
        return
    with atomic_output(final) as staging:
        staging.mkdir()
        yield staging
