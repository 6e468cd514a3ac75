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
import hashlib
import logging
from pathlib import Path
from typing import Any

from numba import njit

__all__ = ["KERNEL_SOURCES", "install", "kernel_sources", "njit", "sources_digest"]

logger = logging.getLogger(__name__)

_PACKAGE = Path(__file__).resolve().parents[2]  # the seqpack directory

# Every seqpack file numba compiles, relative to the package: a glob or a path.
KERNEL_SOURCES = (
    "schedulers/_kernels/*.py",
    "schedulers/balanced/_bin_completion.py",
    "schedulers/balanced/_exact_search.py",
    "schedulers/balanced/_replica_first.py",
    "schedulers/dynamic_cp/_kernels.py",
)


def kernel_sources(package: Path = _PACKAGE) -> list[Path]:
    """The files of :data:`KERNEL_SOURCES` under ``package``, sorted."""
    found: set[Path] = set()
    for pattern in KERNEL_SOURCES:
        found.update(package.glob(pattern))
    return sorted(found)


def sources_digest(package: Path = _PACKAGE) -> str:
    """A digest of the contents of every kernel source under ``package`` (recomputed when a
    file's size or time stamp changes)."""
    files = kernel_sources(package)
    stamps = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    return _digest(package, stamps)


@functools.lru_cache(maxsize=8)
def _digest(package: Path, stamps: tuple[tuple[str, int, int], ...]) -> str:
    sha = hashlib.sha256()
    for name, _, _ in stamps:
        path = Path(name)
        sha.update(path.relative_to(package).as_posix().encode() + b"\0")
        sha.update(path.read_bytes() + b"\0")
    return sha.hexdigest()


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
            return (self._inner.get_source_stamp(), sources_digest())

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
