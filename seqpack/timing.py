"""Old import path of :class:`seqpack.calibrate.MicrobatchTimer` (warns ``DeprecationWarning`` once)."""

from __future__ import annotations

from seqpack._compat import warn_moved

warn_moved("seqpack.timing", "seqpack.calibrate")

from seqpack.calibrate.timer import MicrobatchTimer  # noqa: E402

__all__ = ["MicrobatchTimer"]
