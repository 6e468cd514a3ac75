"""Modules loaded on first attribute access (:class:`importlib.util.LazyLoader`).

The numba kernels are imported this way, so that ``import seqpack`` does not import numba
(about a second, and a broken numba would otherwise break every command, ``seqpack doctor``
included): the first call into a kernel imports its module, and numba with it.
"""

from __future__ import annotations

import importlib.util
import sys
import types

__all__ = ["lazy_module"]


def lazy_module(name: str) -> types.ModuleType:
    """The module ``name``, executed on first attribute access (at once when already imported)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
