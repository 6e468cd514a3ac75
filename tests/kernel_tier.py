"""The kernels' checked tier: which one this run is, and that it really checks.

``./dev test-kernels`` runs the tests marked ``kernels`` twice: once with numba's bounds
checks compiled in (``NUMBA_BOUNDSCHECK=1``, ``SEQPACK_KERNEL_TIER=boundscheck``) and once
as plain Python (``NUMBA_DISABLE_JIT=1``, ``SEQPACK_KERNEL_TIER=python``), where an index
past an array's end raises ``IndexError`` instead of corrupting memory. Two traps make such
a run check nothing, so :func:`check` refuses them:

* numba keys its disk cache by source and signature, not by ``NUMBA_BOUNDSCHECK``: a cache
  compiled without checks is loaded as it is. The bounds-checked run needs a cache
  directory of its own (``NUMBA_CACHE_DIR``).
* Negative indices wrap (``a[-1]`` is the last element) under both, as in Python: the tier
  finds indices past the end, not below zero.
"""

from __future__ import annotations

import os

import pytest

TIER = os.environ.get("SEQPACK_KERNEL_TIER", "")
TIERS = ("", "boundscheck", "python")

large = pytest.mark.skipif(TIER == "python", reason="too large to run as plain Python (the checked build runs it)")
"""Marks a kernel test whose shapes take more than a few seconds as plain Python."""


def small() -> bool:
    """Whether the kernels run as plain Python (keep shapes small)."""
    return TIER == "python"


def check() -> None:
    """Raise if the environment does not give the checks its tier promises."""
    if TIER not in TIERS:
        raise RuntimeError(f"SEQPACK_KERNEL_TIER={TIER!r}: expected one of {TIERS}")
    if not TIER:
        return
    from numba.core import config

    if TIER == "boundscheck":
        if not config.BOUNDSCHECK:
            raise RuntimeError("SEQPACK_KERNEL_TIER=boundscheck needs NUMBA_BOUNDSCHECK=1")
        if not os.environ.get("NUMBA_CACHE_DIR"):
            raise RuntimeError(
                "SEQPACK_KERNEL_TIER=boundscheck needs a NUMBA_CACHE_DIR of its own: numba would load kernels "
                "cached without bounds checks"
            )
        if config.DISABLE_JIT:
            raise RuntimeError("SEQPACK_KERNEL_TIER=boundscheck with NUMBA_DISABLE_JIT=1 compiles nothing")
    if TIER == "python" and not config.DISABLE_JIT:
        raise RuntimeError("SEQPACK_KERNEL_TIER=python needs NUMBA_DISABLE_JIT=1")
