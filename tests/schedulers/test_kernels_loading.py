"""How the kernels load: lazily (numba only on first use), announced once when numba's disk
cache is cold, and a broken numba leaves ``import seqpack`` and ``seqpack doctor`` working."""

import logging
import os
import subprocess
import sys

import pytest

from seqpack.schedulers import _kernels
from seqpack.schedulers._kernels import compile_note


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


def test_importing_the_schedulers_loads_no_kernel_module():
    code = (
        "import sys, seqpack\n"
        "from seqpack.schedulers import _kernels, get_scheduler\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('seqpack.schedulers._kernels.'))\n"
        "assert loaded == [], loaded\n"
        "assert _kernels.grid_lpt.__name__ == 'grid_lpt' and _kernels.MODE_COST == 0\n"
        "from seqpack.schedulers._kernels.sources import kernel_sources\n"
        "families = {f'seqpack.schedulers._kernels.{p.stem}' for p in kernel_sources()}\n"
        "assert families & set(sys.modules) == {'seqpack.schedulers._kernels.grid'}, families & set(sys.modules)\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr


def test_import_seqpack_does_not_import_numba():
    code = (
        "import sys, seqpack\n"
        "assert 'numba' not in sys.modules\n"
        "from seqpack.schedulers import get_scheduler, _kernels\n"
        "assert 'numba' not in sys.modules\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr


def test_a_broken_numba_leaves_import_and_doctor_working():
    out = _run("import seqpack", NUMBA_NUM_THREADS="0")
    assert out.returncode == 0, out.stderr
    out = _run("from seqpack.cli.app import main; main(['doctor', '--json'])", NUMBA_NUM_THREADS="0")
    assert out.returncode == 0, out.stderr
    assert '"numba"' in out.stdout and "Number of threads" in out.stdout


def test_a_broken_numba_is_named_when_a_kernel_is_first_used():
    code = (
        "from seqpack.cli.app import main\nraise SystemExit(main(['simulate', '--global-batch', '64', '--dp', '2']))\n"
    )
    out = _run(code, NUMBA_NUM_THREADS="0")
    assert out.returncode == 2, out.stderr
    assert "numba could not load the scheduler kernel" in out.stderr
    assert "Number of threads specified must be > 0" in out.stderr and "Traceback" not in out.stderr


def test_unknown_kernel_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_kernel"):
        _kernels.no_such_kernel  # noqa: B018
    assert "home_swaps" in dir(_kernels)


def test_the_compile_is_announced_once_when_the_cache_is_cold(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(compile_note, "_announced", False)
    monkeypatch.setattr(compile_note, "_places", lambda: [tmp_path])
    with caplog.at_level(logging.INFO, logger="seqpack"):
        compile_note.announce("lpt")
        compile_note.announce("repair")
    notes = [r for r in caplog.records if "compiling the scheduler kernels" in r.getMessage()]
    assert len(notes) == 1 and notes[0].name.startswith("seqpack.") and notes[0].levelno == logging.INFO
    assert "cached on disk" in notes[0].getMessage()


def test_a_warm_cache_is_not_announced(tmp_path, monkeypatch, caplog):
    (tmp_path / "lpt.grid_lpt-10.py311.nbi").write_bytes(b"")
    monkeypatch.setattr(compile_note, "_announced", False)
    monkeypatch.setattr(compile_note, "_places", lambda: [tmp_path])
    assert not compile_note.cache_is_cold("lpt") and compile_note.cache_is_cold("repair")
    with caplog.at_level(logging.INFO, logger="seqpack"):
        compile_note.announce("lpt")
    assert not [r for r in caplog.records if "compiling" in r.getMessage()]


def test_an_index_older_than_a_kernel_source_is_cold(tmp_path, monkeypatch):
    """A cache written before the last change to any kernel source is stale (numba compiles
    again: the kernels' stamp holds a digest of every source), so the compile is announced."""
    index = tmp_path / "lpt.grid_lpt-10.py311.nbi"
    index.write_bytes(b"")
    monkeypatch.setattr(compile_note, "_places", lambda: [tmp_path])
    assert not compile_note.cache_is_cold("lpt")
    newest = compile_note.newest_source_time()
    os.utime(index, (newest - 60, newest - 60))
    assert compile_note.cache_is_cold("lpt")
