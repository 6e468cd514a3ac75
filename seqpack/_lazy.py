"""Modules imported on first attribute access, and package faces that import their names
on first use.

Some numba kernels are reached this way, so that ``import seqpack`` does not import numba
(about a second, and a broken numba would otherwise break every command, ``seqpack doctor``
included): the first call into a kernel imports its module, and numba with it. The proxy is
not put in ``sys.modules`` (``inspect`` walks ``sys.modules`` and would load it early).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LazyModule", "lazy_exports", "lazy_module"]


class LazyModule:
    """Stands for the module ``name`` and imports it when one of its attributes is first
    read; each attribute is then kept on the proxy."""

    def __init__(self, name: str) -> None:
        self._lazy_name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = getattr(importlib.import_module(self._lazy_name), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<lazy module {self._lazy_name!r}>"


def lazy_module(name: str) -> Any:
    """A :class:`LazyModule` for ``name`` (the import happens on first attribute access)."""
    return LazyModule(name)


def lazy_exports(package: str, homes: dict[str, str]) -> tuple[Any, Any]:
    """``(__getattr__, __dir__)`` for the package ``package`` (PEP 562): each name of ``homes``
    (name -> the module that defines it) is imported from its module when first read, and a
    submodule of the package is imported when read as an attribute. A face built this way
    imports nothing of its own, so ``import seqpack`` and the torch-free layers (schedulers,
    costs, the command line's planning commands) do not pay for torch."""
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
