"""Moved to :mod:`seqpack.cli.progress` (progress bars belong to the command line); this
module keeps the old import path working."""

from seqpack.cli.progress import Progress

__all__ = ["Progress"]
