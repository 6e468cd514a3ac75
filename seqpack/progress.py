"""Moved to :mod:`seqpack.cli.progress` (progress bars belong to the command line); this
module keeps the old import path working."""

from seqpack._compat import warn_moved
from seqpack.cli.progress import Progress

warn_moved(__name__, "seqpack.cli.progress", stacklevel=2)

__all__ = ["Progress"]
