"""The kernel modules' decorators: ``njit`` for a kernel that Python calls, ``helper`` (no
Python entry) and ``no_refcount`` (nor reference counting; it allocates nothing) for a function
only compiled code calls. Same machine code as ``numba.njit(cache=True)``, compiled in less CPU
time (docs/scale.md, "Kernel layout"); under ``NUMBA_DISABLE_JIT=1`` the plain function."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit as _njit
from numba import types
from numba.core.registry import CPUDispatcher
from numpy.typing import NDArray

__all__ = ["BoolArray", "FloatArray", "IntArray", "helper", "njit", "no_refcount"]

# The kernels' array annotations (numba ignores them; mypy reads them).
IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


class _PlainArguments(CPUDispatcher):
    def get_call_template(self, args: Any, kws: Any) -> Any:
        """numba's typing of a call from compiled code: compile for the plain types."""
        plain = [types.unliteral(a) for a in args]
        return super().get_call_template(plain, {k: types.unliteral(v) for k, v in kws.items()})


class _Helper(_PlainArguments):
    _python_twin: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A call from Python (compiled code links the helper instead): the helper has no
        Python entry, so its twin with one runs it."""
        if self._python_twin is None:
            own = ("cache", "nopython", "no_cpython_wrapper")
            options = {k: v for k, v in self.targetoptions.items() if k not in own}
            self._python_twin = _njit(**options)(self.py_func)
        return self._python_twin(*args, **kwargs)


def _decorator(cls: type, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    def decorate(func: Callable[..., Any]) -> Any:
        dispatcher = _njit(**options)(func)
        if isinstance(dispatcher, CPUDispatcher):  # not under NUMBA_DISABLE_JIT=1
            dispatcher.__class__ = cls
        return dispatcher

    return decorate


njit = functools.partial(_decorator, _PlainArguments)
helper = _decorator(_Helper, cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
no_refcount = _decorator(_Helper, cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True, _nrt=False)
