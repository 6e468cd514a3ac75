"""numba kernels behind the schedulers. Private: the public functions in ``balanced.py`` and
``dp_balanced.py`` validate and coerce their inputs (contiguous int64 / float64 arrays) and
call these. Every kernel has a slow, obvious twin in ``tests/schedulers/`` it is checked
against.

Ties are broken by integer keys (token counts, then indices), never by chance, so every
rank computes the same result.

Importing this package is cheap: it imports neither numba nor a kernel. A kernel's module
(which imports numba) is imported on first use of its name (``_kernels.grid_lpt``). Importing
it puts :mod:`.compile_note`'s watcher on ``sys.meta_path``: the first import of any kernel
module whose disk cache is cold warns once that numba is about to compile.

Modules by job: ``lpt`` (grid_lpt), ``local`` (grid_local), ``home`` (home_swaps, with
``home_book``), ``repair`` (repair_replicas, with the walk of ``scan``), ``matching``
(greedy_matching), ``groups`` (next_fit); ``heaps`` and ``constants`` are shared. (The exact
search's kernel is ``seqpack.schedulers.balanced._exact_search``.)
"""

from __future__ import annotations

import importlib
from typing import Any

from seqpack.errors import ConfigError
from seqpack.schedulers._kernels.compile_note import watch_imports
from seqpack.schedulers._kernels.constants import (
    GRID_LOCAL_SLICES,
    MODE_COST,
    MODE_FIRST_FIT,
    MODE_TOKENS,
    PAIR_BIN,
)

__all__ = [
    "GRID_LOCAL_SLICES",
    "MODE_COST",
    "MODE_FIRST_FIT",
    "MODE_TOKENS",
    "PAIR_BIN",
    "greedy_matching",
    "grid_local",
    "grid_lpt",
    "home_swaps",
    "next_fit",
    "repair_replicas",
]

# Where each kernel (and each private helper a test or benchmark reads) is defined.
_HOME = {
    "grid_lpt": "lpt",
    "_grid_lpt_sorted": "lpt",
    "grid_local": "local",
    "_home_pass": "local",
    "_slices": "local",
    "home_swaps": "home",
    "repair_replicas": "repair",
    "greedy_matching": "matching",
    "next_fit": "groups",
    "_lightest_into": "heaps",
    "_total_down": "heaps",
    "_total_up": "heaps",
    "_sift_down": "heaps",
    "_entry_down": "heaps",
    "_entry_up": "heaps",
    "_park_push": "heaps",
    "_park_pop": "heaps",
}


watch_imports()  # every kernel module, however it is reached (balanced/_*.py, dynamic_cp/_kernels.py too)


def __getattr__(name: str) -> Any:
    """Import the kernel ``name``'s module on first use (numba with it) and keep the kernel."""
    module_name = _HOME.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except Exception as err:  # numba's own errors (bad NUMBA_* settings, a broken install)
        raise ConfigError(
            f"numba could not load the scheduler kernel {name!r} "
            f"({__name__}.{module_name}): {type(err).__name__}: {str(err).rstrip('.')}; "
            "`seqpack doctor` reports numba's state"
        ) from err
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
