"""The seqpack files numba compiles (no numba here: ``seqpack doctor --warm`` checks their
cache folders before compiling)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["KERNEL_SOURCES", "kernel_sources"]

_PACKAGE = Path(__file__).resolve().parents[2]  # the seqpack directory

# Every seqpack file numba compiles, relative to the package (the offline packer's its own).
KERNEL_SOURCES = (
    "packing/_kernel.py",
    "schedulers/_kernels/bin_search.py",
    "schedulers/_kernels/consecutive.py",
    "schedulers/_kernels/cp_planner.py",
    "schedulers/_kernels/grid.py",
    "schedulers/_kernels/locality_swaps.py",
    "schedulers/_kernels/matching.py",
    "schedulers/_kernels/replica_repair.py",
)


def kernel_sources() -> list[Path]:
    """The files of :data:`KERNEL_SOURCES`, sorted."""
    return sorted(_PACKAGE / path for path in KERNEL_SOURCES)
