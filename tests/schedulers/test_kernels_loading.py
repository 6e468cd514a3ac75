"""How the kernels load: lazily (numba only on first use), announced once as a WARNING when
numba's disk cache holds none of them, and a broken numba leaves ``import seqpack`` and
``seqpack doctor`` working."""

import json
import os
import subprocess
import sys

import pytest

from seqpack.schedulers import _kernels


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


@pytest.mark.processes
def test_importing_the_schedulers_loads_no_kernel_module():
    code = (
        "import sys, seqpack\n"
        "from seqpack.schedulers import _kernels, get_scheduler\n"
        "from seqpack.schedulers._kernels import KERNEL_SOURCES\n"
        "kernels = {'seqpack.' + p[:-3].replace('/', '.') for p in KERNEL_SOURCES}\n"
        "assert not kernels & set(sys.modules) and 'numba' not in sys.modules\n"
        "assert _kernels.grid_lpt.__name__ == 'grid_lpt' and _kernels.MODE_COST == 0\n"
        "assert _kernels.cp_planner.lpt.__name__ == 'lpt'\n"
        "loaded = sorted(kernels & set(sys.modules))\n"
        "assert loaded == ['seqpack.schedulers._kernels.cp_planner', 'seqpack.schedulers._kernels.grid'], loaded\n"
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


@pytest.mark.processes
def test_the_cache_folder_is_the_one_numba_uses(tmp_path):
    """With and without NUMBA_CACHE_DIR (numba names a folder after each source folder, not
    its path): :func:`_kernels.cache_dir` is the folder numba writes the kernel's index to."""
    code = (
        "import json, pathlib\n"
        "from seqpack.schedulers._kernels import cache_dir, next_fit\n"
        "from seqpack.schedulers._kernels import cp_planner as dcp\n"
        "out = {}\n"
        "for f in (next_fit, dcp.padded):\n"
        "    mine = cache_dir(pathlib.Path(f.py_func.__code__.co_filename).parent)\n"
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
@pytest.mark.slow
def test_a_cold_cache_warns_once_on_stderr_with_no_logging_configured_and_a_warm_one_not(tmp_path):
    """Python's last-resort handler prints a WARNING on stderr when nothing is configured: the
    user sees why the first plan pauses. Two kernel modules load (one announced); once numba
    has cached them, a new process says nothing, nor does one that compiles nothing."""
    code = (
        "from seqpack.schedulers import _kernels\n"
        "_kernels.next_fit(_kernels.cp_planner.shelf(__import__('numpy').ones(3, 'int64'), 2)[0], 4)\n"
    )
    cold = _run(code, NUMBA_CACHE_DIR=str(tmp_path), NUMBA_DISABLE_JIT="0")  # compiled kernels, whatever the caller set
    assert cold.returncode == 0, cold.stderr
    assert cold.stderr.count("numba is compiling seqpack's scheduler kernels") == 1, cold.stderr
    assert "consecutive first" in cold.stderr and "`seqpack doctor --warm`" in cold.stderr
    assert str(tmp_path) in cold.stderr and f"about {_kernels.COLD_COMPILE_SECONDS} s" in cold.stderr
    for jit in ("0", "1"):
        warm = _run(code, NUMBA_CACHE_DIR=str(tmp_path if jit == "0" else tmp_path / "empty"), NUMBA_DISABLE_JIT=jit)
        assert warm.returncode == 0 and "compiling" not in warm.stderr, warm.stderr
