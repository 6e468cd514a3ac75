"""Fuzz ``seqpack doctor`` (issue 24 item 8): optional and native packages broken in every way
a package breaks on import (ImportError, another exception, SystemExit with status 0 or 3,
KeyboardInterrupt, os.abort(), a segfault, os._exit, junk on stdout, a hang), simulated by
fake packages on PYTHONPATH; numba broken by NUMBA_NUM_THREADS=0; bad flags.

The contract: doctor reports what breaks it and exits 0 (a bad flag: exit 2, one error
line); it never dies with the package, never prints a traceback. The import probe is fuzzed
directly (one child each, fast); two whole ``seqpack doctor`` runs check the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqpack.cli import main
from seqpack.compute.probe import probe_import

ROOT = Path(__file__).resolve().parents[2]

# How a package breaks on import -> what the probe must say about it.
BREAKAGES = {
    "import_error": ("raise ImportError('libcudart.so.13: cannot open shared object file')", "ImportError: libcudart"),
    "os_error": ("raise OSError('undefined symbol: _ZN3c10')", "OSError: undefined symbol"),
    "exit_3": ("raise SystemExit(3)", "SystemExit: 3"),
    "exit_0": ("raise SystemExit(0)", "SystemExit: 0"),
    "exit_message": ("import sys; sys.exit('no GPU driver')", "SystemExit: no GPU driver"),
    "ctrl_c": ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    "abort": ("import os; os.abort()", "killed the process (signal 6, SIGABRT)"),
    "segfault": ("import ctypes; ctypes.string_at(0)", "killed the process (signal 11, SIGSEGV)"),
    "hard_exit": ("import os; os._exit(7)", "ended the process with exit status 7"),
    "junk_then_fail": ("import sys; sys.stdout.write('half a line'); raise RuntimeError('bad build')",
                       "RuntimeError: bad build"),
    "junk_then_abort": ("import sys; sys.stderr.write('CUDA driver too old\\n'); sys.stderr.flush(); import os; "
                        "os.abort()", "SIGABRT): CUDA driver too old"),
}  # fmt: skip


def _package(root: Path, dotted: str, body: str) -> None:
    """A package ``dotted`` whose last module runs ``body`` on import (parents import fine)."""
    parts = dotted.split(".")
    path = root
    for part in parts[:-1]:
        path = path / part
        path.mkdir(exist_ok=True)
        init = path / "__init__.py"
        if not init.exists():
            init.write_text("")
    path = path / parts[-1]
    path.mkdir(exist_ok=True)
    (path / "__init__.py").write_text(body + "\n")


@pytest.fixture
def broken_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return tmp_path


@pytest.mark.parametrize("how", sorted(BREAKAGES))
@pytest.mark.processes
def test_the_probe_reports_every_way_an_import_breaks(broken_path, how):
    body, said = BREAKAGES[how]
    _package(broken_path, f"fake_{how}", body)
    probe = probe_import(f"fake_{how}", ("attr",))
    assert probe["imports"] is False and said in probe["error"], probe
    assert "Traceback" not in probe["error"] and "\n" not in probe["error"]


@pytest.mark.processes
def test_the_probe_bounds_a_hanging_import(broken_path):
    _package(broken_path, "fake_hang", "import time; time.sleep(60)")
    probe = probe_import("fake_hang", timeout=1.0)
    assert probe == {"imports": False, "error": "importing fake_hang did not finish within 1 s", "version": None,
                     "attrs": {}}  # fmt: skip


def _doctor(env: dict[str, str]) -> tuple[int, dict, str]:
    done = subprocess.run([sys.executable, "-m", "seqpack.cli", "doctor", "--json"], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout) if done.returncode == 0 else {}, done.stderr


@pytest.mark.processes
def test_doctor_reports_every_package_broken_at_once(broken_path):
    # Each optional package broken another way, and a numba whose OpenMP layer aborts.
    _package(broken_path, "transformer_engine", BREAKAGES["abort"][0])
    _package(broken_path, "transformer_engine_torch", BREAKAGES["exit_0"][0])
    _package(broken_path, "mamba_ssm", BREAKAGES["ctrl_c"][0])
    _package(broken_path, "causal_conv1d", BREAKAGES["segfault"][0])
    _package(broken_path, "numba", "__version__ = '0.0+fake'\nclass config:\n    THREADING_LAYER = 'default'\n"
             "def threading_layer():\n    raise ValueError('Threading layer is not initialized.')")  # fmt: skip
    _package(broken_path, "numba.np.ufunc.omppool", BREAKAGES["abort"][0])
    _package(broken_path, "numba.np.ufunc.tbbpool", BREAKAGES["import_error"][0])
    _package(broken_path, "numba.np.ufunc.workqueue", "")
    status, report, _ = _doctor(dict(os.environ))
    assert status == 0
    packages = report["packages"]
    assert "SIGABRT" in packages["transformer_engine"]["error"]
    assert packages["transformer_engine_torch"]["error"] == "SystemExit: 0"
    assert packages["mamba_ssm"]["error"] == "KeyboardInterrupt"
    assert "SIGSEGV" in packages["causal_conv1d"]["error"]
    numba = report["numba"]
    assert numba["available_threading_layers"] == ["workqueue"]
    assert "SIGABRT" in numba["threading_layer_errors"]["omp"] and "tbb" not in numba["threading_layer_errors"]


@pytest.mark.processes
def test_doctor_reports_a_numba_that_refuses_its_settings(monkeypatch):
    from seqpack.compute.backends import environment_report, format_environment_report

    monkeypatch.setenv("NUMBA_NUM_THREADS", "0")  # read by numba at import: the probes' children see it
    report = environment_report()
    assert report["numba"]["version"] is None and "Number of threads" in report["numba"]["error"]
    assert report["torch"]["version"] and report["packages"]  # the rest of the report is there
    assert "numba: ValueError: Number of threads specified must be > 0." in format_environment_report(report)


FLAGS = [["--json=1"], ["--bogus"], ["extra"], ["--json", "extra"], ["-j"], ["--"], ["--json="], ["\u00e9"],
         ["--warm=1"], ["--warm", "extra"], ["--warm", "--bogus"]]  # fmt: skip


@pytest.mark.parametrize("argv", FLAGS, ids=str)
def test_bad_doctor_flags_are_one_error_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["doctor", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and "Traceback" not in err, err


@pytest.mark.processes
def test_warm_with_a_broken_numba_is_one_error_line_naming_numba():
    """``doctor --warm`` compiles, so a numba that cannot load is the kernels' ConfigError:
    exit 2, one line naming numba and what to run, the progress line ended first."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "0"}
    done = subprocess.run([sys.executable, "-m", "seqpack.cli", "doctor", "--warm"], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "numba could not load the scheduler kernel" in done.stderr and "Number of threads" in done.stderr
    assert done.stdout.rstrip().endswith("... failed"), done.stdout
