"""Memory for the commands: how much a block of work took at its peak, and how much a
simulated step will need (to refuse what cannot fit before trying).

Peak memory is the process's resident set (``VmHWM``, reset through ``/proc/self/clear_refs``):
unlike ``tracemalloc`` it counts numba's arrays. Where ``/proc`` is missing (macOS) it is ``None``.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from types import TracebackType

__all__ = ["PeakMemory", "available_bytes", "step_bytes_estimate"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_MEMINFO = Path("/proc/meminfo")

# Bytes per sequence and per (microbatch, replica) cell one simulated step holds at its peak
# (measured with benchmarks/scale.py on seqpack's schedulers; about twice the largest seen).
BYTES_PER_SEQUENCE = 1024
BYTES_PER_CELL = 512
BYTES_BASE = 64 << 20


def _status_kib(field: str, path: Path = _STATUS) -> int | None:
    """``field``'s value in KiB from a ``/proc`` file of ``Name:  123 kB`` lines, or None."""
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", path.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


class PeakMemory:
    """``with PeakMemory() as peak: work()``; then ``peak.bytes`` is the largest resident
    memory the process reached during the block above what it held when the block began
    (``None`` where the OS does not say), and ``peak.seconds`` the block's wall time."""

    def __init__(self) -> None:
        self.bytes: int | None = None
        self.seconds = 0.0
        self._start_kib: int | None = None
        self._start = 0.0

    def __enter__(self) -> PeakMemory:
        self._start_kib = _status_kib("VmRSS")
        try:
            _CLEAR_REFS.write_text("5")  # resets VmHWM to the current resident set
        except OSError:
            self._start_kib = None
        self._start = time.perf_counter()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.seconds = time.perf_counter() - self._start
        peak = _status_kib("VmHWM")
        if self._start_kib is not None and peak is not None:
            self.bytes = max(peak - self._start_kib, 0) * 1024


def available_bytes() -> int | None:
    """Memory the OS can give this process now (``MemAvailable``), or None if unknown."""
    kib = _status_kib("MemAvailable", _MEMINFO)
    if kib is not None:
        return kib * 1024
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def step_bytes_estimate(num_sequences: int, dp_size: int, num_microbatches: int) -> int:
    """Rough peak memory of scheduling and accounting one step: ``O(N + dp * M)``."""
    cells = dp_size * max(num_microbatches, 1)
    return BYTES_BASE + BYTES_PER_SEQUENCE * num_sequences + BYTES_PER_CELL * cells
