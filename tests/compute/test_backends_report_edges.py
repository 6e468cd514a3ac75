"""The environment report (``seqpack doctor``) where the machine is broken: a CUDA driver that
raises, numba that does not import (here or in the probing child), a threading layer that
crashes its child, TE wheels without their meta package, a CPU torch beside a GPU; each
reported in words, never failing the report."""

from __future__ import annotations

import sys

import torch

from seqpack.compute import backends


def _report(torch_info, numba_info, notes=()):
    return {"seqpack": "x", "python": "3", "platform": "p", "torch": torch_info, "packages": {}, "auto": {},
            "numba": numba_info, "notes": list(notes)}  # fmt: skip


def test_a_cuda_driver_that_raises_is_reported_not_raised(monkeypatch):
    def broken():
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version\nmore detail")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", broken)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
    info = backends._torch_info()
    assert info["error"] == "RuntimeError: CUDA driver version is insufficient for CUDA runtime version"
    assert info["devices"] == [] and info["cudnn"] == 91000
    text = backends.format_environment_report(_report(info, {"version": None, "error": "absent"}))
    assert "  CUDA error: RuntimeError: CUDA driver version is insufficient" in text


def _probes(numba_ok=True, layers=None):
    probes = {"numba": {"imports": numba_ok, "error": None if numba_ok else "killed the process (signal 11, SIGSEGV)"}}
    for layer, module in backends._NUMBA_LAYERS:
        imports, error = (layers or {}).get(layer, (False, "ModuleNotFoundError: No module named 'tbb'"))
        probes[f"numba.np.ufunc.{module}"] = {"imports": imports, "error": error}
    return probes


def test_numba_that_crashes_its_probe_is_reported_with_the_crash():
    info = backends._numba_info(_probes(numba_ok=False))
    assert info == {"version": None, "error": "killed the process (signal 11, SIGSEGV)"}
    text = backends.format_environment_report(_report(backends._torch_info(), info))
    assert "numba: killed the process (signal 11, SIGSEGV)" in text


def test_numba_that_does_not_import_here_is_reported_with_its_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    info = backends._numba_info()
    assert info == {"version": None, "error": "ModuleNotFoundError: import of numba halted; None in sys.modules"}


def test_a_threading_layer_that_crashes_is_news_and_a_missing_one_is_not():
    layers = {"omp": (False, "killed the process (signal 6, SIGABRT)"), "workqueue": (True, None)}
    info = backends._numba_info(_probes(layers=layers))
    assert info["available_threading_layers"] == ["workqueue"]
    assert info["threading_layer_errors"] == {"omp": "killed the process (signal 6, SIGABRT)"}  # not tbb: missing
    text = backends.format_environment_report(_report(backends._torch_info(), info))
    assert "available: workqueue" in text and "  threading layer omp: killed the process (signal 6, SIGABRT)" in text


def _packages(te_distributions, te_imports, tex_imports=True):
    return {
        "transformer_engine": {"distributions": te_distributions, "imports": te_imports,
                               "error": None if te_imports else "ImportError: no meta package"},
        "transformer_engine_torch": {"distributions": [], "imports": tex_imports, "error": None},
    }  # fmt: skip


def test_te_wheels_without_their_meta_package_are_noted():
    torch_info = {"cuda": "12.8", "cuda_available": True}
    notes = backends._notes(torch_info, _packages({"transformer-engine-cu12": "2.2"}, te_imports=False))
    assert any("the `transformer-engine` meta package is missing" in note for note in notes)
    for fine in (_packages({"transformer-engine-cu12": "2.2"}, te_imports=True),
                 _packages({"transformer-engine": "2.2", "transformer-engine-cu12": "2.2"}, te_imports=False),
                 _packages({}, te_imports=False)):  # fmt: skip
        assert not any("meta package" in note for note in backends._notes(torch_info, fine))


def test_a_cpu_torch_on_a_machine_with_a_gpu_is_noted():
    note = "torch is a CPU build on a machine with a GPU"
    assert note in backends._notes({"cuda": None, "cuda_available": True}, _packages({}, te_imports=False))
    assert note not in backends._notes({"cuda": "12.8", "cuda_available": True}, _packages({}, te_imports=False))
    assert note not in backends._notes({"cuda": None, "cuda_available": False}, _packages({}, te_imports=False))
