"""What every `oxygen-ros` subcommand shares on its command line: help that shows defaults, user mistakes reported
in one line (exit status 2) instead of a traceback, output folders that are never someone else's files, and
progress bars on long work."""

from __future__ import annotations

import argparse
import math
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

OUTPUT_MARKER = ".oxygen-ros-output"


class UsageError(Exception):
    """A mistake in what the user asked for, found after parsing (reported in one line, exit status 2)."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their line breaks; every option with a default shows it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False or action.default == []:
            return action.help or ""
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """`oxygen-ros <command>`'s parser: a bad option is one line on stderr and exit status 2."""

    def __init__(self, command: str, description: str, **kwargs):
        super().__init__(prog=f"oxygen-ros {command}", description=description, formatter_class=HelpFormatter,
                         **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_device_options(p: argparse.ArgumentParser) -> None:
    """--device and --cuda-graphs, as the commands that serve or time the fleet's stages take them;
    `check_device_options` after parsing."""
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda or cuda:N")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay CUDA graphs per (model, stage, bucket, partition) (a CUDA device only)")


def check_device_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.cuda_graphs and not args.device.startswith("cuda"):
        parser.error(f"--cuda-graphs needs a CUDA device, not {args.device}: on a CPU every stage runs eagerly")


def existing_file(text: str) -> str:
    """argparse type: a path that must name an existing file."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return text


def positive_float(text: str) -> float:
    """argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:  # also false for NaN
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 0 to 65535, got {text}")
    return value


def progress(iterable: Iterable[T], total: int | None = None, desc: str = "") -> Iterable[T]:
    """A progress bar on stderr while a person watches (a terminal); silent in logs, pipes and tests."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, disable=None, leave=False, dynamic_ncols=True)


def claim_output_dir(path: Path) -> Path:
    """Make `path` the output folder of this run.

    A missing or empty folder is used; a folder an earlier oxygen-ros run made (it holds the marker file) is
    emptied and reused; any other non-empty folder (or a file) is refused with a UsageError, never deleted.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {path} is a file, not a folder")
    if path.is_dir() and any(path.iterdir()):
        if not (path / OUTPUT_MARKER).is_file():
            raise UsageError(f"--out {path} is not empty and was not made by oxygen-ros; "
                             "choose a new folder or empty this one")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / OUTPUT_MARKER).write_text("made by oxygen-ros: a later run given this folder as --out replaces it\n")
    return path
