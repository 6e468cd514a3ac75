"""How the ``seqpack`` command ends: every user mistake (a bad flag, file or value) exits with
:attr:`ExitCode.USAGE` and one line naming it; only bugs end in a traceback."""

from __future__ import annotations

from enum import IntEnum

from seqpack.errors import SeqpackError

__all__ = ["CommandError", "ExitCode", "one_line"]


class ExitCode(IntEnum):
    """Exit statuses of ``seqpack`` (documented in docs/errors.md)."""

    OK = 0
    FAILED = 1  # a bug (with its traceback), or a demo rank that crashed or was killed
    USAGE = 2  # a user's mistake: flag, file or value (argparse uses 2 for its errors too)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), the shell's convention
    BROKEN_PIPE = 141  # stdout closed before the output was written (128 + SIGPIPE), e.g. `| head`


class CommandError(SeqpackError):
    """A mistake in the command line that only the command can see (flags that contradict
    each other, an output path that cannot be written); reported in one line, exit 2."""


def one_line(err: BaseException) -> str:
    """The message of ``err`` on one line; an ``OSError`` as ``FILE: reason``."""
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    else:
        text = str(err) or type(err).__name__
    return " ".join(part.strip() for part in text.splitlines() if part.strip())
