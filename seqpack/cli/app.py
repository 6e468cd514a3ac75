"""The ``seqpack`` command: its parser, the one registry of subcommands, and exit codes.

To add a command, write a module with ``add_parser(subparsers)`` and ``run(args) -> int``
(see :mod:`seqpack.cli.commands`) and list it in :data:`COMMANDS`; nothing else changes.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Protocol

from seqpack._version import __version__
from seqpack.cli.commands import demo, doctor, mock, simulate, stats
from seqpack.cli.exit import ExitCode, one_line
from seqpack.errors import SeqpackError

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


class Command(Protocol):
    """What a subcommand module provides."""

    def add_parser(self, subparsers: argparse._SubParsersAction, /) -> argparse.ArgumentParser: ...

    def run(self, args: argparse.Namespace, /) -> int: ...


# The subcommands, in the order ``seqpack --help`` lists them.
COMMANDS: tuple[Command, ...] = (mock, stats, simulate, demo, doctor)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seqpack",
        description="Sequence packing and load balancing for distributed LLM training.",
        epilog="Exit status: 0 ok, 1 a bug or a crashed demo rank, 2 a mistake in the command line or its files "
        "(docs/errors.md).",
    )
    parser.add_argument("--version", action="version", version=f"seqpack {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subparsers).set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``seqpack`` with ``argv`` (default ``sys.argv[1:]``) and return its exit status.

    A user's mistake (a :class:`~seqpack.errors.SeqpackError`, or an ``OSError`` such as an
    unreadable file) prints one line, ``seqpack COMMAND: error: ...``, and returns 2;
    anything else is a bug and propagates with its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return ExitCode.OK
    try:
        return int(args._run(args))
    except BrokenPipeError:  # stdout closed early (`seqpack ... | head`): not an error to report
        try:  # point stdout at /dev/null, or Python's flush at exit reports the same error again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout without a file descriptor (captured): nothing to flush
            pass
        return ExitCode.BROKEN_PIPE
    except (SeqpackError, OSError) as err:
        print(f"seqpack {args.command}: error: {one_line(err)}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print(f"seqpack {args.command}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
