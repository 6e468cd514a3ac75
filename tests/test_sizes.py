"""Small pieces stay small: no function over 80 lines, no module over 500 lines in seqpack/
(the architecture target of the second redesign; docstrings count).

numba kernels are exempt: a kernel module holds every njit function its kernels call (numba
stamps a kernel's disk cache with its own file only), splitting a kernel, or a module of
kernels, into pieces to meet a line count cost compile and plan time (issue 30), and each
kernel's docstring carries its bounds proof (issue 29). A module is a kernel module when every
function in it is a kernel. Python functions and modules keep the limits."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "seqpack"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
NUMBA_DECORATORS = {"njit", "helper", "no_refcount"}


def _is_numba(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``node`` is decorated ``@njit``, ``@njit(...)`` or ``@no_refcount``."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name) and target.id in NUMBA_DECORATORS:
            return True
    return False


def _is_kernel_module(tree: ast.Module) -> bool:
    """Whether every function of a module is a numba kernel (and it has some)."""
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return bool(functions) and all(_is_numba(n) for n in functions)


def _sizes() -> tuple[list[str], list[str], int]:
    long_functions, long_modules, functions = [], [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        name = str(path.relative_to(PACKAGE.parent))
        tree = ast.parse(source)
        if len(source.splitlines()) > MAX_MODULE_LINES and not _is_kernel_module(tree):
            long_modules.append(f"{name}: {len(source.splitlines())} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions += 1
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and not _is_numba(node):
                    long_functions.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    return long_functions, long_modules, functions


@pytest.mark.slow
def test_numba_kernels_are_seen_to_be_exempted() -> None:
    # Not vacuous: the exemption recognises the kernels' decorators.
    kernels = {
        node.name
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and _is_numba(node)
    }
    assert {"home_swaps", "repair_replicas", "_grid_lpt_sorted", "complete_bins", "dfs"} <= kernels
    kernel_modules = {p.name for p in PACKAGE.rglob("*.py") if _is_kernel_module(ast.parse(p.read_text()))}
    assert {"locality_swaps.py", "replica_repair.py", "cp_planner.py"} <= kernel_modules
    assert "phases.py" not in kernel_modules


@pytest.mark.slow
def test_no_function_over_80_lines_and_no_module_over_500() -> None:
    long_functions, long_modules, functions = _sizes()
    assert functions > 1000  # not vacuous: the whole package was read
    assert not long_functions, "split these functions: " + "; ".join(long_functions)
    assert not long_modules, "split these modules: " + "; ".join(long_modules)
