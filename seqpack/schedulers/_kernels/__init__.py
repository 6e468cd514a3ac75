"""numba kernels behind the schedulers. Private: callers pass contiguous int64 / float64
arrays; ties are broken by integer keys, never by chance, so every rank computes the same
result. A kernel's module (numba with it) is imported on first use, with one WARNING a process
where numba is about to compile; one module per kernel family (docs/scale.md, "First use").
The files numba compiles and where it caches them are known here without numba (for doctor)."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqpack._lazy import lazy_exports
from seqpack.errors import ConfigError

if TYPE_CHECKING:
    from seqpack.schedulers._kernels.bin_search import complete_bins, dfs
    from seqpack.schedulers._kernels.consecutive import next_fit
    from seqpack.schedulers._kernels.grid import MODE_COST, MODE_FIRST_FIT, MODE_TOKENS, grid_local, grid_lpt
    from seqpack.schedulers._kernels.locality_swaps import home_swaps
    from seqpack.schedulers._kernels.matching import greedy_matching
    from seqpack.schedulers._kernels.replica_repair import repair_replicas, replica_lpt

logger = logging.getLogger(__name__)

# CPU seconds to compile every kernel (`seqpack doctor --warm` on an empty cache, docs/scale.md).
COLD_COMPILE_SECONDS = 20

# Where each kernel and constant is defined; a kernel module is an attribute too.
_FAMILIES = {
    "bin_search": ("complete_bins", "dfs"),
    "consecutive": ("next_fit",),
    "grid": ("MODE_COST", "MODE_FIRST_FIT", "MODE_TOKENS", "grid_local", "grid_lpt"),
    "locality_swaps": ("home_swaps",),
    "matching": ("greedy_matching",),
    "replica_repair": ("repair_replicas", "replica_lpt"),
}
_HOMES = {name: f"{__name__}.{module}" for module, names in _FAMILIES.items() for name in names}
# Every file numba compiles (package-relative): the families', cp_planner (imported as a module), the packer's.
KERNEL_SOURCES = ("packing/_kernel.py", *(f"schedulers/_kernels/{m}.py" for m in sorted({*_FAMILIES, "cp_planner"})))
__all__ = [
    "MODE_COST",
    "MODE_FIRST_FIT",
    "MODE_TOKENS",
    "complete_bins",
    "dfs",
    "greedy_matching",
    "grid_local",
    "grid_lpt",
    "home_swaps",
    "next_fit",
    "repair_replicas",
    "replica_lpt",
]
_load, __dir__ = lazy_exports(__name__, _HOMES)
_noted = False


def __getattr__(name: str) -> Any:
    """The kernel (or kernel module) ``name``, its module imported on first use (numba with it)."""
    module = _HOMES.get(name, f"{__name__}.{name}")
    if module not in sys.modules:
        _note_compile(module)
    try:
        return _load(name)
    except AttributeError:
        raise
    except Exception as err:  # numba's own errors (bad NUMBA_* settings, a broken install)
        raise ConfigError(
            f"numba could not load the scheduler kernel {name!r} ({module}): "
            f"{type(err).__name__}: {str(err).rstrip('.')}; `seqpack doctor` reports numba's state"
        ) from err


def _note_compile(module: str) -> None:
    """One WARNING a process, before the first kernel module with no index in numba's cache
    loads: the first plans pause while numba compiles, which should not look like a hang."""
    global _noted
    source = Path(__file__).with_name(module.rpartition(".")[2] + ".py")
    if _noted or not source.is_file() or os.environ.get("NUMBA_DISABLE_JIT", "0").strip() not in ("", "0"):
        return
    folder = cache_dir(source.parent)
    if any(folder.glob(f"{source.stem}.*.nbi")):
        return
    _noted = True
    logger.warning(
        "numba is compiling seqpack's scheduler kernels (%s first): up to about %d s of CPU, once, cached in %s. "
        "To compile ahead of a job, run `seqpack doctor --warm` with the job's NUMBA_CACHE_DIR (docs/scale.md)",
        module,
        COLD_COMPILE_SECONDS,
        folder,
    )


def kernel_sources() -> list[Path]:
    """The files of :data:`KERNEL_SOURCES`, sorted."""
    return sorted(Path(__file__).resolve().parents[2] / path for path in KERNEL_SOURCES)


def cache_dir(source_dir: Path) -> Path:
    """Where numba caches the functions of files in ``source_dir``: the first of numba's
    locators that applies, ``NUMBA_CACHE_DIR`` (a folder per source folder, named after it),
    ``__pycache__`` beside the sources if writable, numba's user-wide cache."""
    source_dir = Path(os.path.abspath(source_dir))  # not resolved: numba hashes the path as imported
    subfolder = f"{source_dir.name}_{hashlib.sha1(str(source_dir).encode()).hexdigest()}"
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return Path(configured) / subfolder
    in_tree = source_dir / "__pycache__"
    return in_tree if _writable(in_tree) else _user_cache() / subfolder


def _writable(directory: Path) -> bool:
    """Whether ``directory`` is, or can be made, a writable directory."""
    existing = next((p for p in (directory, *directory.parents) if p.exists()), None)
    return existing is not None and existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def _user_cache() -> Path:
    """numba's user-wide cache folder (its ``appdirs.user_cache_dir('numba')``)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "numba"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home()) / "numba" / "Cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba"
