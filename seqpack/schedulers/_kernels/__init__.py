"""numba kernels behind the schedulers. Private: the public functions of ``balanced``,
``dp_balanced``, ``empty`` and ``dynamic_cp`` validate and coerce their inputs (contiguous int64 / float64 arrays) and
call these. Every kernel has a slow, obvious twin in ``tests/schedulers/`` it is checked
against.

Ties are broken by integer keys (token counts, then indices), never by chance, so every
rank computes the same result.

Importing this package is cheap: it imports neither numba nor a kernel. A kernel's module
(which imports numba) is imported on first use of its name (``_kernels.grid_lpt``). Importing
it puts :mod:`.compile_note`'s watcher on ``sys.meta_path``: the first import of any kernel
module whose disk cache is cold warns once that numba is about to compile.

One module per kernel family, holding every njit function its kernels call and every
constant they read (numba stamps a kernel's disk cache with the kernel's own file and
freezes the globals it reads, so a helper in another file could go stale in the cache):
``grid`` (grid_lpt, grid_local, the ``MODE_*`` rules), ``locality_swaps`` (home_swaps),
``replica_repair`` (repair_replicas, and replica_lpt of the replica-first plan),
``matching`` (greedy_matching), ``consecutive`` (next_fit), ``bin_search`` (the exact
search's dfs and complete_bins) and ``cp_planner`` (the dynamic-CP planner's kernels).
Their callers reach ``bin_search``, ``cp_planner`` and ``replica_lpt`` through
``seqpack._lazy.lazy_module``, the others by name here.
"""

from __future__ import annotations

import importlib
from typing import Any

from seqpack.errors import ConfigError
from seqpack.schedulers._kernels.compile_note import watch_imports

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

# Where each kernel (and each constant or private helper a caller, test or benchmark reads)
# is defined. A constant is read from its kernel's module, which imports numba: callers read
# one only once they plan with that kernel.
_HOME = {
    "grid_lpt": "grid",
    "_grid_lpt_sorted": "grid",
    "grid_local": "grid",
    "_home_pass": "grid",
    "_slices": "grid",
    "MODE_COST": "grid",
    "MODE_TOKENS": "grid",
    "MODE_FIRST_FIT": "grid",
    "GRID_LOCAL_SLICES": "grid",
    "home_swaps": "locality_swaps",
    "PAIR_BIN": "locality_swaps",
    "repair_replicas": "replica_repair",
    "_lightest_into": "replica_repair",
    "_total_down": "replica_repair",
    "_total_up": "replica_repair",
    "greedy_matching": "matching",
    "next_fit": "consecutive",
}


watch_imports()  # every kernel module, however it is reached (through lazy_module too)


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
