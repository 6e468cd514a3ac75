"""The kernels' disk cache is numba's own: a kernel is stamped by its own source file, so every
njit function a kernel calls, and every constant it reads, lives in the kernel's own module
(seqpack/schedulers/_kernels/: one module per kernel family)."""

from __future__ import annotations

import ast
import builtins
import dis
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from seqpack.schedulers._kernels import kernel_sources

PACKAGE = Path(__file__).resolve().parents[2] / "seqpack"
ALLOWED_MODULES = {"numpy"}  # the modules a kernel may read attributes of (np.empty, np.inf)


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def test_every_numba_module_is_a_kernel_source() -> None:
    def matching(pattern: str) -> set[Path]:
        return {p for p in PACKAGE.rglob("*.py") if re.search(pattern, p.read_text(), re.M)}

    # doctor reads numba's version; _jit holds the decorators the kernel modules import
    readers = {PACKAGE / "compute/backends.py", PACKAGE / "schedulers/_kernels/_jit.py"}
    importing = matching(r"^\s*(from numba\b|import numba\b|from seqpack\.schedulers\._kernels\._jit\b)") - readers
    compiled = matching(r"^@(njit|helper|no_refcount)\b")
    assert compiled, "no kernel found: the pattern is wrong"
    assert importing == compiled == set(kernel_sources()), sorted(
        str(p.relative_to(PACKAGE)) for p in importing ^ set(kernel_sources())
    )


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and the code objects nested in it (comprehensions, inner functions)."""
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found += _code_objects(const)
    return found


def _global_reads(func: Any) -> set[str]:
    """The global names a function's bytecode loads."""
    return {
        ins.argval
        for code in _code_objects(func.__code__)
        for ins in dis.get_instructions(code)
        if ins.opname == "LOAD_GLOBAL"
    }


def _module_level_names(path: Path) -> set[str]:
    """Names a module defines itself (assignments and functions at its top level)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


@pytest.mark.parametrize("path", kernel_sources(), ids=lambda p: p.stem)
@pytest.mark.slow
def test_a_kernel_reads_only_its_own_module(path: Path) -> None:
    """Every global an njit function loads is numpy, a builtin, or defined in the function's
    own module (an njit function or a constant): numba stamps a kernel's disk cache with its
    own file and freezes the globals it reads, so a helper or constant from another file could
    change without the kernel compiling again."""
    from numba.core.registry import CPUDispatcher

    module = importlib.import_module(_module_name(path))
    own = _module_level_names(path)
    kernels = {name: value for name, value in vars(module).items() if isinstance(value, CPUDispatcher)}
    assert kernels, f"{path.name}: no njit function"
    foreign = {name: f.py_func.__module__ for name, f in kernels.items() if f.py_func.__module__ != module.__name__}
    assert not foreign, f"{path.name} imports njit functions from other modules: {foreign}"
    for name, kernel in kernels.items():
        for read in sorted(_global_reads(kernel.py_func)):
            value = vars(module).get(read)
            if value is None:
                assert hasattr(builtins, read), f"{path.name}: {name} reads {read!r}, defined nowhere"
            elif isinstance(value, types.ModuleType):
                assert value.__name__ in ALLOWED_MODULES, f"{path.name}: {name} reads module {value.__name__}"
            else:
                assert read in own, f"{path.name}: {name} reads {read!r}, which this module does not define"


_CHILD = """
import json, numpy as np, seqpack
from seqpack.schedulers._kernels import next_fit
next_fit(np.array([3, 4, 5], dtype=np.int64), 8)
print(json.dumps({"where": seqpack.__file__, "hits": sum(next_fit.stats.cache_hits.values()),
                  "misses": sum(next_fit.stats.cache_misses.values())}))
"""


def _run_child(root: Path) -> dict[str, int]:
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("NUMBA_CACHE_DIR", None)  # the cache beside the copied sources
    env.pop("NUMBA_DISABLE_JIT", None)
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result.pop("where") == str(root / "seqpack" / "__init__.py")
    return {k: int(v) for k, v in result.items()}


@pytest.mark.slow
def test_a_change_to_the_kernels_module_recompiles_it_and_no_other(tmp_path: Path) -> None:
    """``next_fit`` (consecutive.py) is cached, used from the cache, left cached when another
    kernel module changes (nothing of it lives there), and compiled again when its own
    module changes: numba's own stamp, the source file's content."""
    shutil.copytree(PACKAGE, tmp_path / "seqpack", ignore=shutil.ignore_patterns("__pycache__"))
    assert _run_child(tmp_path) == {"hits": 0, "misses": 1}
    other = tmp_path / "seqpack/schedulers/_kernels/grid.py"
    other.write_text(other.read_text() + "\n# another kernel changed\n")
    assert _run_child(tmp_path) == {"hits": 1, "misses": 0}  # cached, and left so
    own = tmp_path / "seqpack/schedulers/_kernels/consecutive.py"
    own.write_text(own.read_text() + "\n# this kernel's module changed\n")
    assert _run_child(tmp_path) == {"hits": 0, "misses": 1}
    assert _run_child(tmp_path) == {"hits": 1, "misses": 0}


_PLAN_AND_LIST = """
import json, sys
import numpy as np
from numba.core.registry import CPUDispatcher
from seqpack.schedulers import get_scheduler
lengths = np.minimum(np.random.default_rng(0).lognormal(8.2, 0.6, 512).astype(np.int64) + 1, 8192)
get_scheduler("balanced", locality=True).schedule(lengths, dp_size=8, max_tokens_per_rank=16384)
print(json.dumps({f"{m.__name__}.{k}": [str(s) for s in v.signatures]
                  for m in list(sys.modules.values()) if m.__name__.startswith("seqpack.schedulers._kernels.")
                  for k, v in vars(m).items() if isinstance(v, CPUDispatcher) and v.__module__ == m.__name__}))
"""


@pytest.mark.processes
@pytest.mark.slow
def test_a_plan_compiles_each_kernel_function_once(tmp_path: Path) -> None:
    """A first plan (empty cache) compiles every kernel function it reaches for one signature:
    no second, literal specialisation for a constant argument (``_entry_down(..., 0)``) or a
    variable first assigned one, which numba compiles beside the plain one
    (seqpack/schedulers/_kernels/_jit.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["NUMBA_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", _PLAN_AND_LIST], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    signatures = json.loads(out.stdout.strip().splitlines()[-1])
    assert sum(bool(s) for s in signatures.values()) > 30, signatures  # the helpers compiled: not vacuous
    twice = {name: s for name, s in signatures.items() if len(s) > 1}
    assert not twice, twice
