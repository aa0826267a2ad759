"""The oxygen-ros command lists every subcommand and each one resolves to a real main()."""

import argparse
import importlib
import subprocess
import sys

import pytest

import oxygen_ros
from oxygen_ros.commands.cli import SUBCOMMANDS, main


def test_every_subcommand_has_a_main():
    for name, (module, _) in SUBCOMMANDS.items():
        assert callable(getattr(importlib.import_module(module), "main", None)), name


def test_help_and_unknown_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SUBCOMMANDS)
    assert main(["no-such-command"]) == 2


def test_command_runs_as_a_module():
    result = subprocess.run([sys.executable, "-m", "oxygen_ros.commands.cli", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "bench" in result.stdout


class _Parsed(Exception):
    pass


def subcommand_parsers(monkeypatch) -> dict[str, argparse.ArgumentParser]:
    """The parser each subcommand builds, caught when it starts parsing."""
    parsers = {}

    def catch(self, args=None, namespace=None):
        parsers[self.prog.removeprefix("oxygen-ros ")] = self
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    for module, _ in SUBCOMMANDS.values():
        with pytest.raises(_Parsed):
            importlib.import_module(module).main(["--help"])
    assert sorted(parsers) == sorted(SUBCOMMANDS)
    return parsers


def test_every_subcommand_names_itself_describes_itself_and_every_option(monkeypatch):
    for name, parser in subcommand_parsers(monkeypatch).items():
        module = importlib.import_module(SUBCOMMANDS[name][0])
        assert parser.prog == f"oxygen-ros {name}"
        assert parser.description == module.__doc__  # whole, not cut after its first line
        for action in parser._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        text = parser.format_help()
        defaults = [a for a in parser._actions if a.default not in (None, False, [], argparse.SUPPRESS)]
        for action in defaults:
            assert f"(default: {action.default})" in " ".join(text.split()) or "%(default)" in action.help, \
                (name, action.dest)


def test_version():
    result = subprocess.run([sys.executable, "-m", "oxygen_ros.commands.cli", "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"oxygen-ros {oxygen_ros.__version__}"


def exit_status(args: list[str]) -> int:
    """The exit status of `oxygen-ros ARGS` from the command's own main, in this process, as `python -m
    oxygen_ros.commands.cli` exits with it (above): an argparse error exits, any other exception escaping main would fail
    the test, as it would print a traceback there."""
    try:
        return main(args)
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize("args, status, words", [
    (["bench", "--preset", "huge", "--out", "x"], 2, "invalid choice: 'huge'"),
    (["model-bench", "--presets", "tiny", "huge"], 2, "invalid choice: 'huge'"),
    (["fleet-assign", "--fleet", "no_such_fleet.json", "--profile", "no_such_lut.json", "--gpus", "2", "--out",
      "a.json"], 2, "no such file: no_such_fleet.json"),
    (["convert", "aloha", "no_such_episode.hdf5", "out_bag"], 1, "no_such_episode.hdf5"),
    (["sim-demo", "--policy-param", "horizon=4"], 2, "expected NAME:=VALUE"),
    (["serve", "--embodiment", "libero"], 1, "embodiment 'libero' is neither a shipped profile"),
    (["fleet-ray", "--models", "a=tiny:0,a=tiny:1"], 1, "--models must name distinct models, got ['a', 'a']"),
    (["fleet-ray", "--models", "a=tiny", "--replicas", "0"], 1, "--replicas, --max-robots-per-replica and"),
    (["fleet-ray", "--models", "a=tiny", "--embodiment", "libero"], 1, "embodiment 'libero' is neither"),
    (["no-such-command"], 2, "unknown command"),
])
def test_user_mistakes_are_one_line_errors_not_tracebacks(tmp_path, monkeypatch, capfd, args, status, words):
    monkeypatch.chdir(tmp_path)
    assert exit_status(args) == status
    err = capfd.readouterr().err
    assert words in err, err
    if args[0] != "no-such-command":  # that one also prints the command list
        assert err.count("\n") == 1, err


def test_fleet_assign_reports_a_malformed_file_in_one_line(tmp_path, capfd):
    fleet = tmp_path / "fleet.json"
    fleet.write_text("{not json")
    lut = tmp_path / "lut.json"
    lut.write_text("{}")
    assert exit_status(["fleet-assign", "--fleet", str(fleet), "--profile", str(lut), "--gpus", "1", "--out",
                        str(tmp_path / "a.json")]) == 1
    err = capfd.readouterr().err
    assert err.startswith("oxygen-ros fleet-assign: error:") and err.count("\n") == 1, err
