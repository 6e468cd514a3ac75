"""How the kernels load: lazily (numba only on first use), announced once as a WARNING when
numba's disk cache is cold, and a broken numba leaves ``import seqpack`` and ``seqpack doctor`` working."""

import hashlib
import importlib.metadata
import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from seqpack.schedulers import _kernels
from seqpack.schedulers._kernels import compile_note
from seqpack.schedulers._kernels.sources import kernel_sources


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


@pytest.mark.processes
def test_importing_the_schedulers_loads_no_kernel_module():
    code = (
        "import sys, seqpack\n"
        "from seqpack.schedulers import _kernels, get_scheduler\n"
        "from seqpack.schedulers._kernels.compile_note import is_kernel_module\n"
        "loaded = sorted(m for m in sys.modules if is_kernel_module(m))\n"
        "assert loaded == [] and 'numba' not in sys.modules, loaded\n"
        "assert _kernels.grid_lpt.__name__ == 'grid_lpt' and _kernels.MODE_COST == 0\n"
        "loaded = sorted(m for m in sys.modules if is_kernel_module(m))\n"
        "assert loaded == ['seqpack.schedulers._kernels.grid'], loaded\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr


@pytest.mark.processes
def test_a_broken_numba_leaves_import_and_doctor_working():
    out = _run("from seqpack.cli.app import main; main(['doctor', '--json'])", NUMBA_NUM_THREADS="0")
    assert out.returncode == 0, out.stderr
    assert '"numba"' in out.stdout and "Number of threads" in out.stdout


@pytest.mark.processes
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


def _index(path: Path, version: str, stamp: object) -> Path:
    """An index file as numba writes it: its version, then ``(stamp, overloads)``."""
    with path.open("wb") as f:
        pickle.dump(version, f, protocol=-1)
        f.write(pickle.dumps((stamp, {}), protocol=-1))
    return path


GRID = "seqpack.schedulers._kernels.grid"
REPAIR = "seqpack.schedulers._kernels.replica_repair"
GRID_SOURCE = Path(_kernels.__file__).parent / "grid.py"
# numba 0.68 stamps an index with the SHA-256 of its function's file; earlier releases with
# the file's (st_mtime, st_size).
SHA = hashlib.sha256(GRID_SOURCE.read_bytes()).digest()
STAT = (GRID_SOURCE.stat().st_mtime, GRID_SOURCE.stat().st_size)
NUMBA = importlib.metadata.version("numba")
PY = f"py{sys.version_info[0]}{sys.version_info[1]}"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """compile_note reads ``tmp_path`` as every kernel folder's cache, and has said nothing yet."""
    monkeypatch.setattr(compile_note, "_announced", False)
    monkeypatch.setattr(compile_note, "cache_dir", lambda source_dir=None: tmp_path)
    return tmp_path


def test_the_compile_is_announced_once_as_a_warning_when_the_cache_is_cold(cache, caplog):
    with caplog.at_level(logging.INFO, logger="seqpack"):
        compile_note.announce(GRID)
        compile_note.announce(REPAIR)
    notes = [r for r in caplog.records if "compiling" in r.getMessage()]
    assert len(notes) == 1 and notes[0].name.startswith("seqpack.") and notes[0].levelno == logging.WARNING
    message = notes[0].getMessage()
    assert "seqpack's scheduler kernels" in message and GRID in message and "once" in message
    assert f"about {compile_note.COLD_COMPILE_SECONDS} s" in message and "`seqpack doctor --warm`" in message


@pytest.mark.parametrize("stamp", [SHA, STAT], ids=["sha256", "mtime-size"])
def test_a_warm_cache_is_not_announced(cache, caplog, stamp):
    _index(cache / f"grid._grid_lpt_sorted-30.{PY}.nbi", NUMBA, stamp)
    assert not compile_note.cache_is_cold(GRID) and compile_note.cache_is_cold(REPAIR)
    with caplog.at_level(logging.INFO, logger="seqpack"):
        compile_note.announce(GRID)
    assert not [r for r in caplog.records if "compiling" in r.getMessage()]


def test_cold_modules_are_every_kernel_module_but_the_warm_one(cache):
    everything = compile_note.cold_modules()
    assert GRID in everything and REPAIR in everything
    _index(cache / f"grid._grid_lpt_sorted-30.{PY}.nbi", NUMBA, SHA)
    assert compile_note.cold_modules() == [m for m in everything if m != GRID]


@pytest.mark.parametrize(
    "name, version, stamp",
    [
        (f"grid._grid_lpt_sorted-30.{PY}.nbi", NUMBA, b"\x00" * 32),  # another version of grid.py
        (f"grid._grid_lpt_sorted-30.{PY}.nbi", NUMBA, (STAT[0] - 1.0, STAT[1])),  # the same, by time
        (f"grid._grid_lpt_sorted-30.{PY}.nbi", "0.1.0", SHA),  # written by another numba
        ("grid._grid_lpt_sorted-30.py27.nbi", NUMBA, SHA),  # for another Python
        (f"grid_old._grid_lpt_sorted-30.{PY}.nbi", NUMBA, SHA),  # another module's
        (f"replica_repair.repair_replicas-30.{PY}.nbi", NUMBA, SHA),  # another module's, grid.py's stamp
    ],
)
def test_an_index_numba_would_not_load_is_cold(cache, name, version, stamp):
    """numba loads an index written by the same numba for the same stamp only: its module's
    source as it is now (a kernel module holds every function its kernels call)."""
    _index(cache / name, version, stamp)
    assert compile_note.cache_is_cold(GRID)
    assert name.startswith("replica_repair") or compile_note.cache_is_cold(REPAIR)


def test_a_damaged_index_is_cold(cache):
    (cache / f"grid._grid_lpt_sorted-30.{PY}.nbi").write_bytes(b"\x80\x05not a pickle")
    assert compile_note.cache_is_cold(GRID)


def test_disabled_jit_is_not_announced(cache, caplog, monkeypatch):
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    with caplog.at_level(logging.INFO, logger="seqpack"):
        compile_note.announce(GRID)
    assert not caplog.records


@pytest.mark.processes
def test_the_cache_folder_is_the_one_numba_uses(tmp_path):
    """With and without NUMBA_CACHE_DIR (numba names a folder after each source folder, not
    its path): the folder compile_note reads is the one numba wrote the kernel's index to."""
    code = (
        "import json, pathlib\n"
        "from seqpack.schedulers._kernels import compile_note, next_fit\n"
        "from seqpack.schedulers._kernels import cp_planner as dcp\n"
        "out = {}\n"
        "for f in (next_fit, dcp.padded):\n"
        "    mine = compile_note.cache_dir(pathlib.Path(f.py_func.__code__.co_filename).parent)\n"
        "    out[f.__name__] = [str(mine), f._cache._cache_path]\n"
        "print(json.dumps(out))\n"
    )
    for env in ({"NUMBA_CACHE_DIR": str(tmp_path)}, {}):
        done = _run(code, **env) if env else _run_without_cache_dir(code)
        assert done.returncode == 0, done.stderr
        places = json.loads(done.stdout.strip().splitlines()[-1])
        assert set(places) == {"next_fit", "padded"}
        for mine, numbas in places.values():
            assert mine == numbas
            assert mine.startswith(str(tmp_path)) == bool(env)


def _run_without_cache_dir(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.processes
def test_every_kernel_module_is_watched_however_it_is_imported():
    """The lazy modules (exact search and bin completion, replica-first, dynamic CP, the
    offline packer) and the ``_kernels`` names are each checked before their module's first
    import; no other module is."""
    code = (
        "import importlib, json\n"
        "from seqpack.schedulers._kernels import compile_note\n"
        "seen = []\n"
        "compile_note.announce = seen.append\n"
        "from seqpack.schedulers import _kernels\n"
        "_kernels.grid_lpt, _kernels.home_swaps, _kernels.greedy_matching, _kernels.next_fit\n"
        "from seqpack.schedulers.balanced import exact, replicas\n"
        "exact._search.dfs, exact._search.complete_bins, replicas._kernel.replica_lpt\n"
        "from seqpack.schedulers.dynamic_cp import _rounds\n"
        "_rounds._kernels.shelf\n"
        "from seqpack.packing import packer\n"
        "packer._kernel.pack_sizes\n"
        "print(json.dumps(seen))\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    package = Path(_kernels.__file__).parents[2]
    modules = [".".join(p.relative_to(package.parent).with_suffix("").parts) for p in kernel_sources()]
    assert sorted(seen) == sorted(modules), seen
    assert len(seen) == 8


@pytest.mark.processes
def test_a_cold_cache_warns_on_stderr_with_no_logging_configured(tmp_path):
    """Python's last-resort handler prints a WARNING on stderr when nothing is configured: the
    user sees why the first plan pauses. Loading two kernel modules compiles nothing (numba
    compiles on the first call) and warns once."""
    code = "from seqpack.schedulers import _kernels\n_kernels.next_fit, _kernels.grid_lpt\n"
    done = _run(code, NUMBA_CACHE_DIR=str(tmp_path), NUMBA_DISABLE_JIT="0")  # compiled kernels, whatever the caller set
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("numba is compiling seqpack's scheduler kernels") == 1, done.stderr
    assert f"{tmp_path} (NUMBA_CACHE_DIR)" in done.stderr and "`seqpack doctor --warm`" in done.stderr
