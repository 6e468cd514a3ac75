"""Old import paths: shim modules and moved names that warn ``DeprecationWarning`` once.

A module that moved whole leaves a shim calling :func:`alias_module`: it warns once and puts
the new module in its place (``import old`` then *is* the new module, private names and
monkeypatching included). A shim re-exporting from several modules calls :func:`warn_moved`
at import (Python imports a module once per process, so it warns once). A module whose names
moved elsewhere sets
``__getattr__ = moved_names(__name__, {...})``, which imports a moved name from its new home
on first use and warns once per name.
"""

from __future__ import annotations

import importlib
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["alias_module", "moved_names", "warn_moved"]

_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def warn_moved(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn once per process that ``old`` is an old import path of ``new``."""
    with _lock:
        if (old, new) in _warned:
            return
        _warned.add((old, new))
    warnings.warn(
        f"{old} is an old import path and will be removed; import from {new} instead",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def alias_module(old: str, new: str) -> None:
    """In the shim module ``old``: warn once, then make ``old`` the module ``new``."""
    warn_moved(old, new, stacklevel=4)
    sys.modules[old] = importlib.import_module(new)


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``moved`` (name -> module it lives in now)."""

    def __getattr__(name: str) -> Any:
        home = moved.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_moved(f"{module}.{name}", f"{home}.{name}")
        return getattr(importlib.import_module(home), name)

    return __getattr__


def reset_warned() -> None:
    """Forget which old paths warned (for tests)."""
    with _lock:
        _warned.clear()
