"""No silent fallback: import probes, errors for explicit backends, one warning for "auto" on
CUDA inputs, the environment report behind `seqpack doctor`; torch's RMSNorm where it matches.

Import failures are made real on this CPU machine: ``sys.modules[name] = None`` makes
``import name`` raise ``ModuleNotFoundError``; a module whose ``__getattr__`` raises stands in
for a build that loads but breaks (``OSError`` of a missing CUDA library).
"""

import json
import logging
import sys
import types

import numba
import pytest
import torch
import torch.nn.functional as F

from seqpack._logging import reset_warn_once
from seqpack.compute import backends
from seqpack.compute.attention import ThdAttention
from seqpack.compute.backends import BackendUnavailableError
from seqpack.compute.mamba import GatedRMSNorm, Mamba2Mixer
from seqpack.compute.tiny_lm import RMSNorm
from seqpack.errors import ConfigError
from seqpack.options import AttentionBackend, MambaBackend
from seqpack.thd import pack_sequences

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def fresh_warnings():
    reset_warn_once()
    yield
    reset_warn_once()


@pytest.fixture
def no_te(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformer_engine", None)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", None)
    monkeypatch.setitem(sys.modules, "transformer_engine_torch", None)


@pytest.fixture
def no_mamba(monkeypatch):
    monkeypatch.setitem(sys.modules, "causal_conv1d", None)
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)


def _broken_module(monkeypatch, name, message):
    """A module that imports but fails on first use, as a build for another CUDA does."""
    mod = types.ModuleType(name)

    def fail(attr):
        raise OSError(message)

    mod.__getattr__ = fail
    monkeypatch.setitem(sys.modules, name, mod)


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("seqpack")]


# --- probes ------------------------------------------------------------------------------


def test_probe_keeps_the_import_error(no_te, no_mamba):
    te = backends.import_te_attention()
    assert not te.ok and te.value is None and te.what == "transformer_engine.pytorch"
    assert te.error.startswith("ModuleNotFoundError: import of transformer_engine")
    assert isinstance(te.exception, ImportError)
    mamba = backends.import_mamba_kernels()
    assert not mamba.ok and mamba.what == "causal_conv1d" and mamba.error.startswith("ModuleNotFoundError")


def test_probe_catches_errors_other_than_import_error(monkeypatch):
    _broken_module(monkeypatch, "transformer_engine.pytorch", "libcudart.so.13: cannot open shared object file")
    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    probe = backends.import_te_attention()
    assert probe.error == "OSError: libcudart.so.13: cannot open shared object file"
    assert isinstance(probe.exception, OSError)


def test_mamba_probe_names_the_second_package_when_only_it_fails(monkeypatch):
    conv = types.ModuleType("causal_conv1d")
    conv.causal_conv1d_fn = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "causal_conv1d", conv)
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)
    probe = backends.import_mamba_kernels()
    assert not probe.ok and probe.what == "mamba_ssm.ops.triton.ssd_combined"


# --- explicit backends raise, carrying the import error ------------------------------------


def test_te_backend_raises_with_the_import_error(no_te):
    with pytest.raises(BackendUnavailableError) as info:
        ThdAttention(2, 4, backend="te")
    err = info.value
    assert isinstance(err, ImportError) and isinstance(err, ConfigError) and isinstance(err, ValueError)
    assert isinstance(err.__cause__, ModuleNotFoundError)
    message = str(err)
    for part in (
        "backend='te' needs Transformer Engine",
        "`import transformer_engine.pytorch` failed: ModuleNotFoundError",
        "`transformer-engine` meta package",
        "transformer_engine_torch built for this torch " + torch.__version__,
        "seqpack doctor",
    ):
        assert part in message, (part, message)


def test_mamba_backend_raises_with_the_import_error(monkeypatch):
    _broken_module(monkeypatch, "causal_conv1d", "undefined symbol: _ZN3c10")
    with pytest.raises(BackendUnavailableError) as info:
        Mamba2Mixer(16, d_state=4, headdim=8, backend=MambaBackend.MAMBA_SSM)
    assert isinstance(info.value.__cause__, OSError)
    assert "needs mamba_ssm and causal_conv1d" in str(info.value)
    assert "`import causal_conv1d` failed: OSError: undefined symbol: _ZN3c10" in str(info.value)


def test_backends_accept_enum_members_and_strings():
    assert ThdAttention(2, 4, backend=AttentionBackend.TORCH).backend == "torch"
    assert ThdAttention(2, 4, backend="torch").backend is AttentionBackend.TORCH
    assert Mamba2Mixer(16, d_state=4, headdim=8, backend="torch").backend is MambaBackend.TORCH
    with pytest.raises(ConfigError, match=r"backend must be one of \('auto', 'mamba_ssm', 'torch'\), got 'triton'"):
        Mamba2Mixer(16, d_state=4, headdim=8, backend="triton")


# --- "auto": silent on CPU, one warning for CUDA inputs --------------------------------------


def test_auto_on_cpu_logs_nothing(no_te, no_mamba, caplog, monkeypatch):
    caplog.set_level(logging.WARNING)
    batch = pack_sequences([{"input_ids": torch.arange(1, n + 1)} for n in (3, 5)], pad_multiple=2)
    q = torch.randn(batch.num_tokens, 2, 4)
    for cuda in (False, True):  # CUDA present or not: CPU inputs run the reference quietly
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        att = ThdAttention(2, 4, backend="auto")
        att(q, q, q, batch)
        Mamba2Mixer(16, d_state=4, headdim=8)(torch.randn(batch.num_tokens, 16), batch)
    assert _warnings(caplog) == []
    assert "ModuleNotFoundError" in att.te_unavailable  # built "with CUDA": the import error is kept


def test_auto_warns_once_when_te_would_have_run(no_te, caplog, monkeypatch):
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    att = ThdAttention(2, 4, backend="auto")
    assert att.te_attention is None and _warnings(caplog) == []  # construction itself is quiet
    for _ in range(3):
        att._note_reference(CUDA, torch.bfloat16)
        att._note_reference(CUDA, torch.float16)
        ThdAttention(2, 4, backend="auto")._note_reference(CUDA, torch.bfloat16)  # once per process
    (record,) = _warnings(caplog)
    assert record.name == "seqpack.compute.attention"
    message = record.getMessage()
    assert "ThdAttention(backend='auto') runs the torch reference on CUDA torch.bfloat16 inputs" in message
    assert "`import transformer_engine.pytorch` failed: ModuleNotFoundError" in message
    assert "backend='torch'" in message
    att._note_reference(CUDA, torch.float32)  # a dtype TE does not take: its own one-time warning
    att._note_reference(CUDA, torch.float32)
    assert len(_warnings(caplog)) == 2
    assert "takes float16/bfloat16 only" in _warnings(caplog)[1].getMessage()
    att._note_reference(torch.device("cpu"), torch.bfloat16)
    assert len(_warnings(caplog)) == 2


def test_auto_mamba_warns_once_for_cuda_inputs(monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    _broken_module(monkeypatch, "causal_conv1d", "causal_conv1d_cuda: undefined symbol")
    m = Mamba2Mixer(16, d_state=4, headdim=8, backend="auto")
    assert m._kernels_for(torch.device("cpu"), torch.float32) is None and _warnings(caplog) == []
    for dtype in (torch.float32, torch.bfloat16, torch.float32):
        assert m._kernels_for(CUDA, dtype) is None
    (record,) = _warnings(caplog)
    assert record.name == "seqpack.compute.mamba"
    assert "`import causal_conv1d` failed: OSError: causal_conv1d_cuda: undefined symbol" in record.getMessage()
    assert m._kernels_for(CUDA, torch.float64) is None  # causal_conv1d has no fp64
    assert len(_warnings(caplog)) == 2 and "takes float32/float16/bfloat16 only" in _warnings(caplog)[1].getMessage()


def test_auto_mamba_uses_kernels_when_they_import(monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    conv, scan = object(), object()
    mods = {"causal_conv1d": types.ModuleType("causal_conv1d"),
            "mamba_ssm.ops.triton.ssd_combined": types.ModuleType("ssd_combined")}  # fmt: skip
    mods["causal_conv1d"].causal_conv1d_fn = conv
    mods["mamba_ssm.ops.triton.ssd_combined"].mamba_chunk_scan_combined = scan
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
        mods[name] = types.ModuleType(name)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    m = Mamba2Mixer(16, d_state=4, headdim=8, backend="auto")
    assert m._kernels_for(CUDA, torch.bfloat16) == (conv, scan)
    assert m._kernels_for(torch.device("cpu"), torch.bfloat16) is None
    assert _warnings(caplog) == []


def test_torch_backend_never_imports_or_warns(monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    calls = []
    monkeypatch.setattr(backends, "import_te_attention", lambda: calls.append("te"))
    monkeypatch.setattr(backends, "import_mamba_kernels", lambda: calls.append("mamba"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    att = ThdAttention(2, 4, backend="torch")
    m = Mamba2Mixer(16, d_state=4, headdim=8, backend="torch")
    att._note_reference(CUDA, torch.bfloat16)  # the reference was asked for: nothing to warn about
    assert att.te_unavailable is None
    assert m._kernels_for(CUDA, torch.bfloat16) is None
    assert calls == [] and _warnings(caplog) == []


def test_reference_warning_decides_when_to_warn():
    half = backends.ATTENTION_KERNEL_DTYPES
    assert backends.reference_warning("X", "TE", "cpu", torch.bfloat16, half, "boom") is None
    key, message = backends.reference_warning("X", "TE", "cuda", torch.bfloat16, half, "boom")
    assert key == "X:unavailable" and "because TE is unavailable: boom" in message
    key, message = backends.reference_warning("X", "TE", "cuda:1", torch.float64, half, None)
    assert key == "X:dtype" and "TE takes float16/bfloat16 only" in message


# --- the environment report ------------------------------------------------------------------


def _fake_versions(monkeypatch, versions):
    real = backends._distribution_version
    monkeypatch.setattr(backends, "_distribution_version", lambda name: versions.get(name) or real(name))


def test_environment_report_on_this_machine_without_fast_paths(no_te, no_mamba, monkeypatch):
    # TE "installed" (metadata present) but failing to import: the case issue 14 is about.
    _fake_versions(monkeypatch, {"transformer-engine": "2.20.2", "transformer-engine-cu13": "2.20.2"})
    report = backends.environment_report(isolate=False)
    json.dumps(report)  # serialisable as it is
    assert report["torch"]["version"] == torch.__version__
    te = report["packages"]["transformer_engine"]
    assert te["version"] == "2.20.2" and te["imports"] is False
    assert te["distributions"] == {"transformer-engine": "2.20.2", "transformer-engine-cu13": "2.20.2"}
    assert te["error"].startswith("ModuleNotFoundError")
    assert set(report["packages"]) == {"transformer_engine", "transformer_engine_torch", "mamba_ssm", "causal_conv1d"}
    assert not report["packages"]["causal_conv1d"]["imports"]
    assert report["numba"]["version"] == numba.__version__
    assert "threading_layer" in report["numba"] and report["numba"]["available_threading_layers"]
    assert "  causal_conv1d            not installed\n" in backends.format_environment_report(report)
    if not torch.cuda.is_available():
        assert report["auto"]["attention"]["backend"] == "torch"
        assert "no CUDA device" in report["auto"]["attention"]["reason"]
    assert any("transformer_engine_torch does not import" in note for note in report["notes"])
    text = backends.format_environment_report(report)
    assert f"torch {torch.__version__}" in text
    assert "transformer_engine       2.20.2          does not import (ModuleNotFoundError" in text
    assert 'backend="auto" on bf16 CUDA inputs:' in text and f"numba {numba.__version__}" in text


def test_environment_report_auto_choice_and_notes_with_cuda(no_mamba, monkeypatch):
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.1}
    monkeypatch.setattr(
        backends,
        "_torch_info",
        lambda: {"version": "2.11.0+cu130", "cuda": "13.0", "cuda_available": True, "cudnn": 91000, "devices": [gpu]},
    )
    te_pt = types.ModuleType("transformer_engine.pytorch")
    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te_pt)
    tex = types.ModuleType("transformer_engine_torch")
    tex.thd_get_partitioned_indices = lambda *args: None
    monkeypatch.setitem(sys.modules, "transformer_engine_torch", tex)
    _fake_versions(monkeypatch, {"transformer-engine-cu12": "2.20.2"})  # core wheel for the wrong CUDA, no meta
    report = backends.environment_report(isolate=False)
    assert report["auto"]["attention"] == {"backend": "te", "reason": "transformer_engine.pytorch imports"}
    assert report["auto"]["mamba"]["backend"] == "torch"
    assert "causal_conv1d does not import: ModuleNotFoundError" in report["auto"]["mamba"]["reason"]
    assert report["packages"]["transformer_engine_torch"]["thd_get_partitioned_indices"] is True
    assert any("transformer-engine-cu12 is installed but torch is built for CUDA 13.0" in n for n in report["notes"])
    text = backends.format_environment_report(report)
    assert "GPU 0: NVIDIA H100 80GB HBM3, capability 9.0, 79.1 GiB" in text
    assert "  attention te" in text and "  mamba     torch" in text


def test_package_version_falls_back_to_the_module(monkeypatch):
    # mamba_ssm copied as a source tree (no dist-info), as on the lent GPU machine
    root = types.ModuleType("mamba_ssm")
    root.__version__ = "2.3.2.post1"
    mods = {"mamba_ssm": root, "mamba_ssm.ops": types.ModuleType("o"), "mamba_ssm.ops.triton": types.ModuleType("t"),
            "mamba_ssm.ops.triton.ssd_combined": types.ModuleType("s")}  # fmt: skip
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(backends, "_distribution_version", lambda name: None)
    info = backends.environment_report(isolate=False)["packages"]["mamba_ssm"]
    assert info == {"version": "2.3.2.post1", "distributions": {}, "module": "mamba_ssm.ops.triton.ssd_combined",
                    "imports": True, "error": None}  # fmt: skip


# --- torch's RMSNorm replaces the hand-written ones where it matches -------------------------


def _old_gated_rmsnorm(norm, y, z):
    """The implementation GatedRMSNorm had before it used F.rms_norm."""
    compute = torch.promote_types(y.dtype, torch.float32)
    g = (y.to(compute) * F.silu(z.to(compute))).unflatten(-1, (-1, norm.group_size))
    g = g * torch.rsqrt(g.pow(2).mean(dim=-1, keepdim=True) + norm.eps)
    return (g.flatten(-2) * norm.weight).to(y.dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim, group_size", [(32, 32), (32, 8), (96, 48)])
def test_gated_rmsnorm_equals_the_hand_written_one(dtype, dim, group_size):
    g = torch.Generator().manual_seed(dim + group_size)
    norm = GatedRMSNorm(dim, group_size, dtype=dtype)
    norm.weight.data = torch.randn(dim, generator=g).to(dtype)
    y = torch.randn(37, dim, generator=g).to(dtype).requires_grad_()
    z = torch.randn(37, dim, generator=g).to(dtype).requires_grad_()
    new, old = norm(y, z), _old_gated_rmsnorm(norm, y, z)
    assert torch.equal(new, old)
    gy = torch.randn(new.shape, generator=g).to(dtype)
    inputs = (y, z, norm.weight)
    for a, b in zip(torch.autograd.grad(new, inputs, gy), torch.autograd.grad(old, inputs, gy), strict=True):
        assert torch.equal(a, b)


def test_tiny_lm_rmsnorm_is_torch_rmsnorm_with_the_same_formula():
    norm = RMSNorm(24).double()
    assert isinstance(norm, torch.nn.RMSNorm) and list(dict(norm.named_parameters())) == ["weight"]
    g = torch.Generator().manual_seed(0)
    norm.weight.data = torch.randn(24, dtype=torch.float64, generator=g)
    x = torch.randn(9, 24, dtype=torch.float64, generator=g)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected, rtol=1e-15, atol=1e-15)


def test_report_lists_devices_even_when_torch_cudnn_check_fails_and_names_the_conflict(monkeypatch):
    import types

    import torch

    props = types.SimpleNamespace(name="Fake H100", major=9, minor=0, total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)

    def incompatible():
        raise RuntimeError("cuDNN version incompatibility: PyTorch was compiled against (9, 19, 0)")

    monkeypatch.setattr(torch.backends.cudnn, "version", incompatible)
    info = backends._torch_info()
    assert info["devices"] == [{"index": 0, "name": "Fake H100", "capability": "9.0", "memory_gib": 80.0}]
    assert "cuDNN version incompatibility" in info["cudnn_error"]
    packages = {
        "transformer_engine": {
            "distributions": ["transformer-engine"],
            "imports": False,
            "error": "OSError: /lib/libcudnn_heuristic.so.9: undefined symbol: _ZTV, version libcudnn_graph.so.9",
        },
        "transformer_engine_torch": {"distributions": [], "imports": True, "error": None},
    }
    notes = backends._notes(dict(info, cuda="13.0"), packages)
    assert any("import transformer_engine before torch uses cuDNN" in n for n in notes)
    assert any("torch's cuDNN check fails" in n for n in notes)
    text = backends.format_environment_report(
        {
            "seqpack": "x",
            "python": "3",
            "platform": "p",
            "torch": dict(info, cuda="13.0"),
            "packages": {},
            "auto": {},
            "numba": {"version": None, "error": "absent"},
            "notes": notes,
        }
    )
    assert "GPU 0: Fake H100" in text and "cuDNN error:" in text


def _broken_packages(root):
    """Packages that break on import the ways real broken builds do."""
    for name, body in {
        "transformer_engine": "import os\nos.abort()\n",  # a native library that aborts
        "transformer_engine_torch": "raise SystemExit(3)\n",  # a package that exits
        "mamba_ssm": "raise ImportError('libcudart.so.13: cannot open shared object file')\n",
        "causal_conv1d": "import sys\nsys.stderr.write('segfault ahead\\n'); import ctypes\nctypes.string_at(0)\n",
    }.items():
        package = root / name
        package.mkdir()
        (package / "__init__.py").write_text(body)
    (root / "transformer_engine" / "pytorch.py").write_text("")
    for sub in ("ops", "ops/triton"):
        (root / "mamba_ssm" / sub).mkdir()
        (root / "mamba_ssm" / sub / "__init__.py").write_text("")
    (root / "mamba_ssm" / "ops" / "triton" / "ssd_combined.py").write_text("")


@pytest.mark.slow
@pytest.mark.processes
def test_the_report_survives_packages_that_abort_exit_or_crash_on_import(tmp_path, monkeypatch):
    import os

    _broken_packages(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    report = backends.environment_report()  # isolated: each import in a child process
    packages = report["packages"]
    assert not any(info["imports"] for info in packages.values())
    assert "killed the process (signal 6, SIGABRT)" in packages["transformer_engine"]["error"]
    assert packages["transformer_engine_torch"]["error"] == "SystemExit: 3"
    assert packages["mamba_ssm"]["error"].startswith("ImportError: libcudart.so.13")
    assert "killed the process (signal 11, SIGSEGV)" in packages["causal_conv1d"]["error"]
    assert "segfault ahead" in packages["causal_conv1d"]["error"]  # the last thing it said
    assert report["numba"]["version"] == numba.__version__  # the rest of the report is there
    assert "SIGABRT" in backends.format_environment_report(report)


@pytest.mark.processes
def test_probe_import_reports_a_working_module_with_its_attributes():
    probe = backends.probe_import("json", ("dumps", "nothing_here"))
    assert probe["imports"] and probe["error"] is None and probe["attrs"] == {"dumps": True, "nothing_here": False}
