"""Output paths, checked before a command does any work: a typo in ``-o`` or ``--plot`` is
one line at once, not a traceback after a long run."""

from __future__ import annotations

import os

from seqpack.cli.exit import CommandError

__all__ = ["check_output_file"]


def check_output_file(flag: str, path: str) -> None:
    """Refuse an output ``path`` that cannot become the file asked for: a directory, a file
    in a directory that does not exist or is not writable.

    Raises:
        CommandError: Naming ``flag`` and ``path``.
    """
    if not path.strip():
        raise CommandError(f"{flag} needs a file name, got {path!r}")
    if os.path.isdir(path):
        raise CommandError(f"{flag} {path!r} is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CommandError(f"{flag} {path!r}: directory {parent!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise CommandError(f"{flag} {path!r}: directory {parent!r} is not writable")
