"""Say once per process, at INFO, that numba is compiling the scheduler kernels.

numba compiles a kernel module on its first use and caches the machine code on disk (in the
module's ``__pycache__``, or under ``NUMBA_CACHE_DIR``): only the first process on a machine
(or after an upgrade) pays. A silent pause of half a minute before the first step looks like a
hang, so when the cache of the kernel module about to be used holds no index (``*.nbi``) file
newer than every kernel source, one line says what compiles and for about how long. Reads
files only: numba is not imported.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from seqpack.schedulers._kernels.sources import newest_source_time

logger = logging.getLogger(__name__)

# Measured: 36 s of CPU on a 2-core machine (docs/scale.md); 0.3 s warm.
COLD_COMPILE_SECONDS = 35

_announced = False


def _places() -> list[Path]:
    """Where numba keeps the cache of this package's modules: ``NUMBA_CACHE_DIR`` (mirroring
    the source directory's path) if set, and ``__pycache__`` beside the sources."""
    here = Path(__file__).resolve().parent
    places = [here / "__pycache__"]
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    if cache_dir:
        places.insert(0, Path(cache_dir) / here.relative_to(here.anchor))
    return places


def cache_is_cold(module_name: str) -> bool:
    """Whether numba's on-disk cache holds no index file of kernel module ``module_name``
    written after the last change to a kernel source (an older one is stale: numba compiles
    again, see :mod:`.jit`)."""
    changed = newest_source_time()
    for place in _places():
        try:
            indexes = [p for p in place.iterdir() if p.name.startswith(f"{module_name}.") and p.suffix == ".nbi"]
            if any(p.stat().st_mtime >= changed for p in indexes):
                return False
        except OSError:
            continue
    return True


def announce(module_name: str) -> None:
    """On a kernel module's first use in this process: one INFO line if its cache is cold
    (at most one line per process)."""
    global _announced
    if _announced or not cache_is_cold(module_name):
        return
    _announced = True
    logger.info(
        "compiling the scheduler kernels with numba (first use on this machine or after an upgrade; "
        "about %d s on 2 cores, once); they are cached on disk afterwards and load in well under a second",
        COLD_COMPILE_SECONDS,
    )
