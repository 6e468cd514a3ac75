"""Modules imported on first attribute access.

Some numba kernels are reached this way, so that ``import seqpack`` does not import numba
(about a second, and a broken numba would otherwise break every command, ``seqpack doctor``
included): the first call into a kernel imports its module, and numba with it. The proxy is
not put in ``sys.modules`` (``inspect`` walks ``sys.modules`` and would load it early).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LazyModule", "lazy_module"]


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
