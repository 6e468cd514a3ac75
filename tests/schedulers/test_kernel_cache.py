"""The kernels' disk cache goes stale when any kernel source changes, not only the kernel's own
file (seqpack.schedulers._kernels.jit)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seqpack.schedulers._kernels import jit

PACKAGE = Path(jit.__file__).resolve().parents[2]


def test_every_numba_module_is_a_kernel_source_and_uses_the_kernels_njit() -> None:
    def matching(pattern: str) -> set[Path]:
        return {p for p in PACKAGE.rglob("*.py") if re.search(pattern, p.read_text(), re.M)}

    readers = {PACKAGE / "schedulers/_kernels/jit.py", PACKAGE / "compute/backends.py"}  # doctor reads the version
    # The offline packer's kernels call only each other, in one file: numba's own per-file
    # stamp keeps its cache correct, and it sits below the schedulers (seqpack/__init__'s layers).
    self_contained = {PACKAGE / "packing/_kernel.py"}
    direct = matching(r"^\s*(from numba\b|import numba\b)") - readers - self_contained
    assert not direct, "import njit from seqpack.schedulers._kernels.jit, not numba: " + ", ".join(
        sorted(str(p.relative_to(PACKAGE)) for p in direct)
    )
    compiled = matching(r"^@(njit|no_refcount)\b")
    assert compiled, "no kernel found: the pattern is wrong"
    sources = set(jit.kernel_sources()) | self_contained
    assert compiled <= sources, sorted(str(p) for p in compiled - sources)
    assert self_contained <= compiled  # not vacuous: the packer's kernels are seen


def test_the_digest_follows_every_source(tmp_path: Path) -> None:
    copy = tmp_path / "seqpack"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    first = jit.sources_digest(copy)
    assert jit.sources_digest(copy) == first
    (copy / "schedulers/_kernels/home_tree.py").write_text(
        (copy / "schedulers/_kernels/home_tree.py").read_text() + "\n# changed\n"
    )
    assert jit.sources_digest(copy) != first
    (copy / "cli").mkdir(exist_ok=True)
    changed = jit.sources_digest(copy)
    (copy / "cli" / "other.py").write_text("# not a kernel source\n")
    assert jit.sources_digest(copy) == changed


def test_a_kernel_is_located_with_the_digest() -> None:
    from seqpack.schedulers._kernels import next_fit

    assert jit.install()
    locator = next_fit._cache._impl.locator
    assert type(locator).__name__ == "KernelSourcesLocator"
    inner_stamp, digest = locator.get_source_stamp()
    assert digest == jit.sources_digest() == jit._digest_at_import()


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
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result.pop("where") == str(root / "seqpack" / "__init__.py")
    return {k: int(v) for k, v in result.items()}


@pytest.mark.slow
def test_a_change_to_another_kernel_file_recompiles(tmp_path: Path) -> None:
    """``next_fit`` (groups.py) is cached, used from the cache, and compiled again after a
    change to heaps.py, which it does not even use: with numba's per-file stamp alone the
    third run would read the cache."""
    shutil.copytree(PACKAGE, tmp_path / "seqpack", ignore=shutil.ignore_patterns("__pycache__"))
    assert _run_child(tmp_path) == {"hits": 0, "misses": 1}
    assert _run_child(tmp_path) == {"hits": 1, "misses": 0}
    heaps = tmp_path / "seqpack/schedulers/_kernels/heaps.py"
    heaps.write_text(heaps.read_text() + "\n# a helper changed\n")
    assert _run_child(tmp_path) == {"hits": 0, "misses": 1}
    assert _run_child(tmp_path) == {"hits": 1, "misses": 0}
