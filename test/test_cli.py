"""The oxygen-ros command lists every subcommand and each one resolves to a real main()."""

import importlib
import subprocess
import sys

from oxygen_ros.cli import SUBCOMMANDS, main


def test_every_subcommand_has_a_main():
    for name, (module, _) in SUBCOMMANDS.items():
        assert callable(getattr(importlib.import_module(module), "main", None)), name


def test_help_and_unknown_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SUBCOMMANDS)
    assert main(["no-such-command"]) == 2


def test_command_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "oxygen_ros.cli", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "bench" in result.stdout
