"""The seqpack files numba compiles, and a digest of them (no numba here: :mod:`.compile_note`
reads them before numba is imported)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__all__ = ["KERNEL_SOURCES", "kernel_sources", "newest_source_time", "sources_digest"]

_PACKAGE = Path(__file__).resolve().parents[2]  # the seqpack directory

# Every seqpack file numba compiles, relative to the package: a glob or a path.
KERNEL_SOURCES = (
    "schedulers/_kernels/bin_search.py",
    "schedulers/_kernels/consecutive.py",
    "schedulers/_kernels/cp_planner.py",
    "schedulers/_kernels/grid.py",
    "schedulers/_kernels/locality_swaps.py",
    "schedulers/_kernels/matching.py",
    "schedulers/_kernels/replica_repair.py",
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


def newest_source_time(package: Path = _PACKAGE) -> float:
    """The latest modification time (seconds) of the kernel sources under ``package``."""
    return max((p.stat().st_mtime for p in kernel_sources(package)), default=0.0)
