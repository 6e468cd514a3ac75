"""``seqpack doctor --warm`` (issue 29, item 2): it compiles every kernel function into
numba's cache; afterwards a new process plans without the compile notice and without
compiling anything, and a second ``--warm`` compiles nothing either.

A cold compile of every kernel costs over a minute of CPU, so the parts are checked apart:

* the command's cold run, in a fresh NUMBA_CACHE_DIR, with its cheapest families only
  (seconds): what it prints, where it caches, and that the processes after it load every
  kernel they call from that cache (numba's dispatcher statistics: no cache miss);
* that the families' plans call every kernel function (a trace of the plans run as plain
  Python, NUMBA_DISABLE_JIT=1, about ten seconds);
* the whole command in the suite's own cache (the one every other scheduler test compiles
  into, so a fresh checkout pays its cold compile once): afterwards every kernel function
  is cached there and the first plans of a new process load all of them.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import seqpack
from seqpack.cli.commands.doctor import _check_cache
from seqpack.cli.warm import FAMILIES
from seqpack.schedulers._kernels import cache_dir, kernel_sources

pytestmark = [pytest.mark.slow, pytest.mark.processes, pytest.mark.timeout(3000)]

NOTICE = "numba is compiling seqpack's scheduler kernels"
CHEAP = (FAMILIES[0].name, FAMILIES[-1].name)  # next_fit, the packer: seconds cold; two, so --jobs 2 is a pool

# Runs the families named in argv[2] (JSON; all when "*") as ``seqpack doctor`` with
# argv[3:], or, with argv[3] == "plans", their plans; then writes numba's cache statistics
# (this module's _cache_stats) to the file argv[1].
_DRIVER = f"""
import json, sys
import seqpack.cli.warm as warm
stats_path, names, *args = sys.argv[1:]
if names != "*":
    warm.FAMILIES = tuple(f for f in warm.FAMILIES if f.name in json.loads(names))
if args == ["plans"]:
    for family in warm.FAMILIES:
        family.plan()
    code = 0
else:
    from seqpack.cli.app import main
    code = main(args)
sys.path.insert(0, {str(Path(__file__).parent)!r})
from {Path(__file__).stem} import _cache_stats
with open(stats_path, "w") as out:
    json.dump(_cache_stats(), out)
sys.exit(code)
"""


def _run(families: tuple[str, ...] | None, args: list[str], env: dict[str, str], stats: Path) -> dict:
    names = "*" if families is None else json.dumps(families)
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(stats), names, *args], capture_output=True, text=True, env=env, timeout=2400
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return {"out": done.stdout, "err": done.stderr, **json.loads(stats.read_text())}


def _json(run: dict) -> dict:
    return json.loads(run["out"][run["out"].index("{") :])


def _decorated(path: Path) -> dict[str, tuple[bool, set[str]]]:
    """``path``'s functions decorated ``@njit``, ``@helper`` or ``@no_refcount``: name -> (whether numba
    caches it on its own, i.e. not inlined into its callers by ``inline="always"``; the
    names its body reads)."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            name = getattr(call.func if call else decorator, "id", None)
            inline = call is not None and any(
                k.arg == "inline" and getattr(k.value, "value", None) == "always" for k in call.keywords
            )
            if name in ("njit", "helper", "no_refcount"):
                reads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                found[node.name] = (not inline, reads)
    return found


def _compiled_functions(path: Path) -> list[str]:
    """Names of ``path``'s functions numba caches on their own."""
    return [name for name, (cached, _) in _decorated(path).items() if cached]


def _every_kernel_function() -> list[tuple[Path, str]]:
    found = [(source, function) for source in kernel_sources() for function in _compiled_functions(source)]
    assert len(found) > 40, found  # not vacuous: the parse found the kernels
    return found


def test_a_cold_warm_compiles_and_the_processes_after_it_compile_nothing(tmp_path):
    """The cheap families' cold ``--warm --json --jobs 2`` (the processes of its pool compile),
    then their plans, then ``--warm`` again (one job), each in a process of its own sharing a
    fresh NUMBA_CACHE_DIR (one test: under xdist, a fixture shared by several could run on
    both workers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba_cache")
    cold = _run(CHEAP, ["doctor", "--warm", "--json", "--jobs", "2"], env, tmp_path / "cold.json")
    plans = _run(CHEAP, ["plans"], env, tmp_path / "plans.json")
    again = _run(CHEAP, ["doctor", "--warm"], env, tmp_path / "again.json")
    # --json prints only JSON; the command says what compiles itself, not the notice.
    report = _json(cold)
    assert cold["out"].lstrip().startswith("{")
    assert [f["family"] for f in report["families"]] == list(CHEAP)
    assert report["cache"] == f"{tmp_path / 'numba_cache'} (NUMBA_CACHE_DIR)"
    assert report["jobs"] == 2 and all(f["seconds"] >= 0 and f["cpu_seconds"] > 0 for f in report["families"])
    assert report["cpu_seconds"] == pytest.approx(sum(f["cpu_seconds"] for f in report["families"]))
    assert NOTICE not in cold["err"]
    assert cold["misses"] == 0  # the command's own process compiled nothing: its worker did
    # A new process's first plans load every kernel they call, and say nothing.
    assert plans["hits"] > 0 and plans["misses"] == 0, plans
    assert plans["err"].strip() == "", plans["err"]
    # A second --warm compiles nothing and says where the cache is.
    assert again["hits"] > 0 and again["misses"] == 0, again
    for name in CHEAP:
        assert name in again["out"]
    last = again["out"].strip().splitlines()[-1]
    assert last.startswith("done in ") and last.endswith(f"cache: {tmp_path / 'numba_cache'} (NUMBA_CACHE_DIR)")


def test_the_families_call_every_kernel_function():
    """Every compiled function runs in some family's plan (so ``--warm`` compiles it), the
    locality kernels too: the families must not leave locality to "auto", which turns it
    off for their small token-id steps. As plain Python, where each call is seen."""
    trace = """
import json, sys
from seqpack.cli.warm import FAMILIES
called = set()
def profile(frame, event, arg):
    if event == "call":
        called.add((frame.f_code.co_filename, frame.f_code.co_name))
sys.setprofile(profile)
for family in FAMILIES:
    family.plan()
sys.setprofile(None)
print(json.dumps(sorted(called)))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["NUMBA_DISABLE_JIT"] = "1"
    done = subprocess.run([sys.executable, "-c", trace], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    called = {(os.path.realpath(file), name) for file, name in json.loads(done.stdout)}
    compiled = set()
    for source in kernel_sources():
        # numba compiles a function with every kernel its body calls, on branches the plan
        # did not take too: the closure over the names the called functions read.
        decorated = _decorated(source)
        todo = [name for name in decorated if (os.path.realpath(source), name) in called]
        while todo:
            name = todo.pop()
            if (source, name) not in compiled:
                compiled.add((source, name))
                todo.extend(decorated[name][1] & decorated.keys())
    missing = [
        f"{source.name}:{function}"
        for source, function in _every_kernel_function()
        if (source, function) not in compiled
    ]
    assert not missing, missing


def test_warm_caches_every_kernel_function_and_a_first_plan_loads_them(tmp_path):
    """Every family's ``--warm --json``, then their plans, in the suite's numba cache."""
    from numba.core import config

    if config.DISABLE_JIT:
        pytest.skip("NUMBA_DISABLE_JIT=1: nothing compiles")
    full = {
        "warm": _run(None, ["doctor", "--warm", "--json"], dict(os.environ), tmp_path / "warm.json"),
        "plans": _run(None, ["plans"], dict(os.environ), tmp_path / "plans.json"),
    }
    report = _json(full["warm"])
    assert [f["family"] for f in report["families"]] == [f.name for f in FAMILIES]
    assert report["cache"] == _check_cache()
    plans = full["plans"]
    assert plans["hits"] > 0 and plans["misses"] == 0, plans
    assert NOTICE not in plans["err"] and plans["err"].strip() == "", plans["err"]
    missing = []
    for source, function in _every_kernel_function():
        folder = cache_dir(source.parent)
        names = os.listdir(folder) if folder.is_dir() else []
        if not any(n.startswith(f"{source.stem}.{function}-") and n.endswith(".nbi") for n in names):
            missing.append(f"{source.name}:{function}")
    assert not missing, missing
    # A long-lived process (this one) plans from that cache too.
    before = _cache_stats()
    for family in FAMILIES:
        family.plan()
    assert _cache_stats()["misses"] == before["misses"]


def _cache_stats() -> dict[str, int]:
    """numba's cache hits and misses of every kernel dispatcher this process imported."""
    from numba.core.registry import CPUDispatcher

    hits = misses = 0
    for source in kernel_sources():
        parts = source.relative_to(Path(seqpack.__file__).resolve().parents[1]).with_suffix("").parts
        module = sys.modules.get(".".join(parts))  # one a plan did not import it did not call
        for value in vars(module).values() if module else ():
            if isinstance(value, CPUDispatcher) and value.__module__ == module.__name__:
                hits += sum(value.stats.cache_hits.values())
                misses += sum(value.stats.cache_misses.values())
    return {"hits": hits, "misses": misses}


@pytest.mark.parametrize("jobs", [1, 2, 2**31 - 1])
def test_warm_in_this_process_and_in_a_pool_prints_every_family_once(capsys, caplog, jobs):
    """``main(["doctor", "--warm", "--jobs", jobs])`` here, in the suite's numba cache (warm
    under ``./dev test``): one line per family (as each ends, under ``--jobs 2``), then the
    total and the cache. More jobs than families run one process per family."""
    from seqpack.cli import main

    with caplog.at_level(logging.WARNING, logger="seqpack.schedulers._kernels"):  # --warm silences the notice
        assert main(["doctor", "--warm", "--jobs", str(jobs)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("compiling seqpack's scheduler kernels with numba")
    assert lines[0].endswith(f" in {min(jobs, len(FAMILIES))} processes" if jobs > 1 else "it is warm)")
    families = [line.split(":")[0].strip() for line in lines[1:-1]]
    assert sorted(families) == sorted(f.name for f in FAMILIES)
    assert all(line.endswith(" s") for line in lines[1:-1])
    assert lines[-1].startswith("done in ") and lines[-1].endswith(f"cache: {_check_cache()}")
