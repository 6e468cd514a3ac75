"""Warn once per process, before numba compiles seqpack's kernels, that it is about to.

numba compiles a kernel on its first call and caches the machine code on disk, so only the
first process with an empty cache (or after an upgrade) pays: about a minute of CPU for
every kernel (:data:`COLD_COMPILE_SECONDS`). A silent pause that long before the first step looks like a
hang, and a user who configured no logging sees no INFO line, so the notice is a WARNING
(with nothing configured, Python's last-resort handler prints it on stderr): what compiles,
for about how long, that it happens once, where the cache is, and how to fill it ahead of a
job (``seqpack doctor --warm``).

The kernel modules (the files of :data:`KERNEL_SOURCES` that define compiled functions) are
reached by several paths: ``_kernels.<name>``, the lazy modules of the exact search, the
replica-first pass and dynamic CP, direct imports. A finder on ``sys.meta_path``
(:func:`watch_imports`) sees each one's import before its code runs, and finds nothing
itself: the usual finders load the module. A module's cache is cold unless one of its index
files (``*.nbi``, one per compiled function) was written by the numba installed and stamped
with the module's source as it is now (numba stamps a function's cache with its own file; a
kernel module holds every function its kernels call): numba would load nothing else. The
index is read as pickle opcodes (:mod:`pickletools`): nothing is unpickled and numba is not
imported.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import io
import logging
import os
import pickletools
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from seqpack.schedulers._kernels.sources import KERNEL_SOURCES

__all__ = [
    "COLD_COMPILE_SECONDS",
    "WARM_COMMAND",
    "announce",
    "cache_dir",
    "cache_is_cold",
    "cache_location",
    "is_kernel_module",
    "silence",
    "watch_imports",
]

logger = logging.getLogger(__name__)

# CPU seconds to compile every kernel on a quiet 2-core machine (docs/scale.md): the first
# `balanced`, `dp_balanced` and `empty` plans took 56 s; `seqpack doctor --warm` took 137 s at
# load ~10, 105 s of it those plans, so the other families add about a quarter.
COLD_COMPILE_SECONDS = 70
WARM_COMMAND = "seqpack doctor --warm"

# Not resolved: numba names a cache folder after the source path as imported (os.path.abspath).
_PACKAGE = Path(os.path.abspath(__file__)).parents[2]  # the seqpack directory
_INDEX_BYTES = 1 << 20  # far above an index's size (a few KB: the stamp and one key per signature)
_FRAMING = ("PROTO", "FRAME")  # opcodes with an argument that is not a value
_DECORATED = re.compile(r"^\s*@(njit|no_refcount)\b", re.MULTILINE)

_announced = False


@functools.cache
def _kernel_files() -> dict[str, Path]:
    """Dotted module name -> file of every file in :data:`KERNEL_SOURCES`."""
    files: dict[str, Path] = {}
    for pattern in KERNEL_SOURCES:
        for path in _PACKAGE.glob(pattern):
            parts = path.relative_to(_PACKAGE.parent).with_suffix("").parts
            files[".".join(parts)] = path
    return files


@functools.cache
def _compiles(path: Path) -> bool:
    """Whether ``path`` defines a numba-compiled function (``@njit`` or ``@no_refcount``)."""
    try:
        return _DECORATED.search(path.read_text(encoding="utf-8")) is not None
    except OSError:
        return False


def is_kernel_module(module: str) -> bool:
    """Whether numba compiles functions of the seqpack module ``module`` (a dotted name)."""
    path = _kernel_files().get(module)
    return path is not None and _compiles(path)


def _writable(directory: Path) -> bool:
    """Whether ``directory`` is, or can be made, a writable directory."""
    while not directory.exists():
        if directory.parent == directory:
            return False
        directory = directory.parent
    return directory.is_dir() and os.access(directory, os.W_OK | os.X_OK)


def _user_cache() -> Path:
    """numba's user-wide cache folder (its ``appdirs.user_cache_dir('numba')``)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "numba"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home()) / "numba" / "Cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba"


def cache_dir(source_dir: Path | None = None) -> Path:
    """Where numba caches the kernels of ``source_dir`` (default: this package's kernels):
    the first of numba's locators that applies, ``NUMBA_CACHE_DIR`` (a folder per source
    folder, named after it), ``__pycache__`` beside the sources if writable, numba's
    user-wide cache."""
    source_dir = Path(os.path.abspath(source_dir if source_dir is not None else Path(__file__).parent))
    subfolder = f"{source_dir.name}_{hashlib.sha1(str(source_dir).encode()).hexdigest()}"
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return Path(configured) / subfolder
    in_tree = source_dir / "__pycache__"
    return in_tree if _writable(in_tree) else _user_cache() / subfolder


def cache_location() -> str:
    """Where numba caches seqpack's kernels, in words: ``NUMBA_CACHE_DIR`` when set, else
    the folder of each kernel folder (:func:`cache_dir`)."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return f"{configured} (NUMBA_CACHE_DIR)"
    places = {str(cache_dir(path.parent)) for path in _kernel_files().values() if _compiles(path)}
    return ", ".join(sorted(places))


@functools.cache
def _numba_version() -> str | None:
    try:
        return importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        return None


def _source_stamps(source: Path) -> tuple[bytes, tuple[float, int]]:
    """The stamps numba gives a cache of functions of ``source``: the SHA-256 of the file
    (numba 0.68, since numba/numba#10659), or its ``(st_mtime, st_size)`` (earlier releases)."""
    st = source.stat()
    return hashlib.sha256(source.read_bytes()).digest(), (st.st_mtime, st.st_size)


def _index_is_fresh(index: Path, version: str, stamps: tuple[bytes, tuple[float, int]]) -> bool:
    """Whether numba ``version`` would load the index file ``index`` for a source of
    ``stamps`` (:func:`_source_stamps`). The file is two pickles: numba's version, then
    ``(stamp, overloads)``. Read from memory, at most :data:`_INDEX_BYTES` (a damaged length
    field then fails the parse instead of a read)."""
    try:
        with index.open("rb") as f:
            data = io.BytesIO(f.read(_INDEX_BYTES))
        if [arg for _, arg, _ in pickletools.genops(data) if isinstance(arg, str)] != [version]:  # to its end
            return False
        args = (arg for op, arg, _ in pickletools.genops(data) if arg is not None and op.name not in _FRAMING)
        first = next(args, None)
        if isinstance(first, bytes):
            return first == stamps[0]
        return isinstance(first, float) and (first, next(args, None)) == stamps[1]
    except (OSError, ValueError):  # unreadable, or not numba's pickles
        return False


def cache_is_cold(module: str) -> bool:
    """Whether numba must compile the functions of kernel module ``module`` (a dotted name):
    its cache holds no index file that this numba and Python would load for the module's
    source as it is now."""
    source = _kernel_files()[module]
    version = _numba_version()
    if version is None:  # no numba: nothing compiles (the kernel's import fails, and says so)
        return False
    python = f".py{sys.version_info[0]}{sys.version_info[1]}"
    try:
        indexes = [
            p
            for p in cache_dir(source.parent).iterdir()
            if p.name.startswith(f"{source.stem}.") and p.suffix == ".nbi" and python in p.name
        ]
        stamps = _source_stamps(source)
    except OSError:  # no cache folder yet
        return True
    return not any(_index_is_fresh(p, version, stamps) for p in indexes)


def cold_modules() -> list[str]:
    """The kernel modules (dotted names) whose cache is cold (:func:`cache_is_cold`)."""
    return [module for module in sorted(_kernel_files()) if cache_is_cold(module)]


def _jit_disabled() -> bool:
    return os.environ.get("NUMBA_DISABLE_JIT", "0").strip() not in ("", "0")


def announce(module: str) -> None:
    """Before kernel module ``module`` (a dotted name) is first imported: one WARNING if its
    cache is cold (at most one per process)."""
    global _announced
    if _announced or _jit_disabled() or not cache_is_cold(module):
        return
    _announced = True
    logger.warning(
        "numba is compiling seqpack's scheduler kernels, starting with %s: up to about %d s of CPU for all of them, "
        "once (the first plans pause meanwhile); the machine code is cached in %s and later processes load it in "
        "under a second. To compile ahead of a job, run `%s` with the job's NUMBA_CACHE_DIR on each machine, "
        "or once for a shared one (docs/scale.md)",
        module,
        COLD_COMPILE_SECONDS,
        cache_location(),
        WARM_COMMAND,
    )


def silence() -> None:
    """Announce nothing in this process: a command that compiles on purpose
    (``seqpack doctor --warm``) says so itself."""
    global _announced
    _announced = True


class _KernelImports(importlib.abc.MetaPathFinder):
    """Sees each kernel module's import before its code runs; finds nothing itself."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not _announced and fullname.startswith("seqpack.") and is_kernel_module(fullname):
            announce(fullname)
        return None


def watch_imports() -> None:
    """Put the kernel-import watcher first on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(finder, _KernelImports) for finder in sys.meta_path):
        sys.meta_path.insert(0, _KernelImports())
