"""``seqpack doctor --warm`` (issue 29, item 2): it compiles every kernel function into an
empty numba cache; afterwards a new process plans without the compile notice and in a
fraction of the time, and a second ``--warm`` is fast too.

One cold compile serves the whole module (about a minute of CPU): the runs share a fresh
NUMBA_CACHE_DIR, in order."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqpack.cli.warm import FAMILIES
from seqpack.schedulers._kernels import compile_note
from seqpack.schedulers._kernels.sources import kernel_sources

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

NOTICE = "numba is compiling seqpack's scheduler kernels"

# A new user's first plans, in a process of its own (nothing configured): every kernel
# family's step, timed without the imports.
_FIRST_PLANS = """
import json, time
from seqpack.cli.warm import FAMILIES
start = time.perf_counter()
for family in FAMILIES:
    family.plan()
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def _run(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["NUMBA_CACHE_DIR"] = str(cache)
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=2400)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _json(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout[done.stdout.index("{") :])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess | Path]:
    cache = tmp_path_factory.mktemp("numba_cache")
    return {
        "cache": cache,
        "cold": _run(["-m", "seqpack.cli", "doctor", "--warm", "--json"], cache),
        "plans": _run(["-c", _FIRST_PLANS], cache),
        "again": _run(["-m", "seqpack.cli", "doctor", "--warm"], cache),
    }


def _compiled_functions(path: Path) -> list[str]:
    """Names of ``path``'s functions numba caches on their own: decorated ``@njit`` or
    ``@no_refcount``, not inlined into their callers (``inline="always"``)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            name = getattr(call.func if call else decorator, "id", None)
            inline = call is not None and any(
                k.arg == "inline" and getattr(k.value, "value", None) == "always" for k in call.keywords
            )
            if name in ("njit", "no_refcount") and not inline:
                names.append(node.name)
    return names


def test_warm_compiles_every_kernel_function(runs, monkeypatch):
    cache = runs["cache"]
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))  # where compile_note looks, in this process too
    report = _json(runs["cold"])
    assert [f["family"] for f in report["families"]] == [f.name for f in FAMILIES]
    assert report["cache"] == f"{cache} (NUMBA_CACHE_DIR)"
    assert NOTICE not in runs["cold"].stderr  # the command says what compiles itself
    expected, missing = 0, []
    for source in kernel_sources():
        folder = compile_note.cache_dir(source.parent)
        assert folder.parent == cache
        names = os.listdir(folder) if folder.is_dir() else []
        for function in _compiled_functions(source):
            expected += 1
            if not any(n.startswith(f"{source.stem}.{function}-") and n.endswith(".nbi") for n in names):
                missing.append(f"{source.name}:{function}")
    assert expected > 40, expected  # not vacuous: the parse found the kernels
    assert not missing, missing


def test_after_warm_a_first_plan_is_quick_and_says_nothing(runs):
    cold = _json(runs["cold"])["seconds"]
    warm = _json(runs["plans"])["seconds"]
    assert NOTICE not in runs["plans"].stderr, runs["plans"].stderr
    assert runs["plans"].stderr.strip() == ""
    assert warm < 0.2 * cold, (warm, cold)


def test_a_second_warm_is_fast_and_says_where(runs):
    out = runs["again"].stdout
    for family in FAMILIES:
        assert family.name in out
    lines = out.strip().splitlines()
    assert lines[-1].startswith("done in ") and lines[-1].endswith(f"cache: {runs['cache']} (NUMBA_CACHE_DIR)")
    again = float(lines[-1].removeprefix("done in ").split(" s", 1)[0])
    assert again < 0.2 * _json(runs["cold"])["seconds"], out


def test_warm_with_json_prints_only_json(runs):
    report = _json(runs["cold"])
    assert runs["cold"].stdout.lstrip().startswith("{")
    assert report["cpu_seconds"] > 0 and all(f["seconds"] >= 0 for f in report["families"])


def test_the_families_run_both_locality_layouts(monkeypatch):
    """Locality's kernels (grid_local, home_swaps) compile only if locality runs: the
    families must not leave it to locality="auto", which turns it off for their small
    token-id steps."""
    from seqpack.schedulers import _kernels

    calls = []
    for name in ("grid_local", "home_swaps"):
        real = getattr(_kernels, name)
        monkeypatch.setattr(_kernels, name, lambda *a, _n=name, _f=real, **kw: calls.append(_n) or _f(*a, **kw))
    for family in FAMILIES:
        if family.name.startswith("balanced"):
            family.plan()
    assert {"grid_local", "home_swaps"} <= set(calls)
