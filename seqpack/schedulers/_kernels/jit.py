"""``njit`` for seqpack's kernels, with a disk cache that goes stale when any kernel source does.

numba keys a cached function by its own source file (its content hash in recent numba, the
file's time stamp in older ones). seqpack's kernels inline helpers from other files (``home_swaps``
compiles ``home_book`` and ``home_tree`` into itself; ``grid_lpt`` the heaps of ``heaps``), so
a change to a helper's file alone left the cached machine code of every kernel using it in
place: an editable install ran the old helper, and an upgrade that changed only a helper's
file could leave the old code in ``__pycache__`` (pip removes the files it installed, not
numba's). Importing this module puts a locator first in numba's list that, for seqpack's
numba modules only, keeps numba's own choice of place and stamp and adds a digest of every
seqpack source file that numba compiles (:data:`KERNEL_SOURCES`): any change to any of them
recompiles all of them, once. Other packages' functions are located as numba always does.

The locator list is numba's private ``CacheImpl._locator_classes`` (numba's public switch,
``NUMBA_CACHE_LOCATOR_CLASSES``, applies to every package in the process); if a numba
release drops it, the kernels keep numba's per-file stamps and a DEBUG line says so.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from numba import njit

from seqpack.schedulers._kernels.sources import KERNEL_SOURCES, kernel_sources, sources_digest

__all__ = ["KERNEL_SOURCES", "install", "kernel_sources", "njit", "sources_digest"]

logger = logging.getLogger(__name__)


@functools.cache
def _digest_at_import() -> str:
    """:func:`sources_digest` once per process: numba compiles the functions as they were
    imported, so the digest of that moment is the one that describes them (and numba asks
    for a stamp at every decorated function, ~80 of them)."""
    return sources_digest()


@functools.cache
def _kernel_files() -> frozenset[Path]:
    return frozenset(kernel_sources())


def _is_kernel_file(py_file: str) -> bool:
    try:
        return Path(py_file).resolve() in _kernel_files()
    except OSError:
        return False


def _make_locator(base: Any) -> Any:
    """The locator class over numba's abstract ``base``."""

    class KernelSourcesLocator(base):
        """numba's own locator for a seqpack kernel, its stamp joined with
        :func:`sources_digest`."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def ensure_cache_path(self) -> None:
            self._inner.ensure_cache_path()

        def get_cache_path(self) -> str:
            return str(self._inner.get_cache_path())

        def get_source_stamp(self) -> Any:
            return (self._inner.get_source_stamp(), _digest_at_import())

        def get_disambiguator(self) -> str:
            return str(self._inner.get_disambiguator())

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if not _is_kernel_file(py_file):
                return None
            for other in _locator_classes():
                if other is cls:
                    continue
                inner = other.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner)
            return None

    return KernelSourcesLocator


def _locator_classes() -> list[Any]:
    """numba's list of cache locator classes, tried in order (``CacheImpl._locator_classes``;
    ``_CacheImpl`` in older numba)."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")  # noqa: B009
    classes: list[Any] = impl._locator_classes
    return classes


@functools.cache
def install() -> bool:
    """Put the kernel-sources locator first in numba's list (once per process). Returns
    whether it is in place."""
    try:
        from numba.core import caching

        _locator_classes().insert(0, _make_locator(caching._CacheLocator))
    except (ImportError, AttributeError) as err:
        logger.debug("numba's cache locators are out of reach (%s): kernels keep per-file stamps", err)
        return False
    return True


install()
