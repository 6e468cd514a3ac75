"""Small pieces stay small: no function over 80 lines, no module over 500 lines in seqpack/
(the architecture target of the second redesign; docstrings count)."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "seqpack"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500


def _sizes() -> tuple[list[str], list[str], int]:
    long_functions, long_modules, functions = [], [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        name = str(path.relative_to(PACKAGE.parent))
        if len(source.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{name}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions += 1
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    return long_functions, long_modules, functions


def test_no_function_over_80_lines_and_no_module_over_500() -> None:
    long_functions, long_modules, functions = _sizes()
    assert functions > 1000  # not vacuous: the whole package was read
    assert not long_functions, "split these functions: " + "; ".join(long_functions)
    assert not long_modules, "split these modules: " + "; ".join(long_modules)
