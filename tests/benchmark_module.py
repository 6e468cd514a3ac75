"""A benchmark script of benchmarks/ loaded as a module, for the tests that run it at toy size."""

from __future__ import annotations

import contextlib
import importlib.util
import pathlib
import sys
from collections.abc import Iterator
from types import ModuleType

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module kept for the test session (a module of helpers
    the tests import from, such as a benchmark's lower bound)."""
    spec = importlib.util.spec_from_file_location(f"seqpack_benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def benchmark_module(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` as a module, registered in ``sys.modules`` while in use
    (dataclasses resolve their annotations through it)."""
    spec = importlib.util.spec_from_file_location(f"seqpack_benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
