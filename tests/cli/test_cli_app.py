"""The dispatcher: one registry of commands, exit codes, the module entry point."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

import seqpack.cli.app as cli_app
from seqpack.cli import COMMANDS, ExitCode, build_parser, main
from seqpack.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_registered_command_has_a_parser_and_runs():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == ["mock", "stats", "simulate", "demo", "doctor"]
    for command in COMMANDS:
        assert callable(command.add_parser) and callable(command.run)


class _Hello:
    """A command module stand-in, as the doctor command will be."""

    @staticmethod
    def add_parser(subparsers):
        p = subparsers.add_parser("hello", help="say hello")
        p.add_argument("--fail", action="store_true")
        return p

    @staticmethod
    def run(args):
        if args.fail:
            raise ConfigError("--fail given")
        print("hello")
        return 0


def test_a_command_is_added_in_one_place(monkeypatch, capsys):
    monkeypatch.setattr(cli_app, "COMMANDS", (*COMMANDS, _Hello))
    assert main(["hello"]) == 0 and capsys.readouterr().out == "hello\n"
    assert main(["hello", "--fail"]) == ExitCode.USAGE
    assert capsys.readouterr().err == "seqpack hello: error: --fail given\n"


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "usage: seqpack" in out and "Exit status" in out


def test_os_errors_are_one_line_naming_the_file(monkeypatch, capsys, tmp_path):
    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "lens.csv"))

    import seqpack.mock_data

    monkeypatch.setattr(seqpack.mock_data, "lengths_from_file", unreadable)
    assert main(["stats", str(tmp_path / "lens.csv")]) == 2
    assert capsys.readouterr().err == f"seqpack stats: error: {tmp_path / 'lens.csv'}: Permission denied\n"


def test_interrupt_is_130(monkeypatch, capsys):
    monkeypatch.setattr(cli_app, "COMMANDS", (_Hello,))

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(_Hello, "run", staticmethod(interrupted))
    assert main(["hello"]) == 130 and "interrupted" in capsys.readouterr().err


@pytest.mark.processes
def test_module_entry_point():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = ["demo", "--help"]
    proc = subprocess.run(
        [sys.executable, "-m", "seqpack.cli", *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "--max-tokens-per-rank" in proc.stdout and "--pattern" in proc.stdout and "torchrun" in proc.stdout


@pytest.mark.processes
def test_closed_stdout_is_not_an_error(tmp_path):
    """`seqpack ... | head -1`: exit quietly (141), no error message, no traceback."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = (
        "import sys, seqpack.cli.app as m\n"
        "class Closed:\n"
        "    def write(self, s): raise BrokenPipeError(32, 'Broken pipe')\n"
        "    def flush(self): pass\n"
        "    def fileno(self): return sys.__stdout__.fileno()\n"
        "sys.stdout = Closed()\n"
        "sys.exit(m.main(['simulate', '--dp', '2', '--steps', '1', '--no-progress']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    # The first kernel compile of a cold cache (a fresh clone) is announced on stderr: not an error.
    stderr = "".join(line for line in proc.stderr.splitlines(True) if not line.startswith("numba is compiling"))
    assert proc.returncode == ExitCode.BROKEN_PIPE and stderr == ""
