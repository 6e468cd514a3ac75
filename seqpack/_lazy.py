"""Package faces that import their names (and submodules) on first use (PEP 562): the one
way seqpack defers an import, so that ``import seqpack`` imports neither torch nor numba (a
broken numba would otherwise break every command, ``seqpack doctor`` included).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: dict[str, str]) -> tuple[Any, Any]:
    """``(__getattr__, __dir__)`` for the package ``package``: each name of ``homes`` (name ->
    the module that defines it) is imported from its module when first read, and a submodule
    of the package is imported when read as an attribute."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            if name.startswith("__"):
                raise AttributeError(name)
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
