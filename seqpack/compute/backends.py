"""Which fast path each compute stage runs, why, and the environment report behind ``seqpack doctor``.

The fast paths are optional packages (Transformer Engine for attention, ``mamba_ssm`` and
``causal_conv1d`` for Mamba2), imported by a probe that keeps the import error, so that nothing
falls back silently: ``backend="te"`` / ``"mamba_ssm"`` raise :class:`BackendUnavailableError`
at construction; ``backend="auto"`` runs the torch reference on CUDA inputs the fast path
cannot take, logging a WARNING once (:func:`reference_warning`; nothing on CPU);
``backend="torch"`` never imports the fast paths.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import platform
import warnings
from typing import Any

import torch

from seqpack.compute.probe import probe_import, probe_imports
from seqpack.errors import ConfigError
from seqpack.options import AttentionBackend, MambaBackend

__all__ = [
    "ATTENTION_KERNEL_DTYPES",
    "BackendUnavailableError",
    "MAMBA_KERNEL_DTYPES",
    "Probe",
    "attention_kernel_applies",
    "environment_report",
    "format_environment_report",
    "import_mamba_kernels",
    "import_te_attention",
    "mamba_kernel_applies",
    "mamba_unavailable_message",
    "probe_import",
    "reference_warning",
    "te_unavailable_message",
]

logger = logging.getLogger(__name__)

# TE's THD attention kernels take half precision only; causal_conv1d takes no fp64.
ATTENTION_KERNEL_DTYPES = (torch.float16, torch.bfloat16)
MAMBA_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class BackendUnavailableError(ConfigError, ImportError):
    """An explicitly requested fast path cannot be imported; ``__cause__`` is the import error."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """The outcome of importing one optional fast path.

    Attributes:
        what: What was imported, e.g. ``"transformer_engine.pytorch"``.
        value: The imported object(s) when the import worked, else None.
        error: ``"ExceptionType: message"`` when it failed, else None.
        exception: The exception itself (for ``raise ... from``); not compared.
    """

    what: str
    value: Any = None
    error: str | None = None
    exception: BaseException | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None


def _failed(what: str, exc: BaseException) -> Probe:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return Probe(what, error=f"{type(exc).__name__}: {text}" if text else type(exc).__name__, exception=exc)


def import_te_attention() -> Probe:
    """Import TE's ``DotProductAttention``; ``value`` is the class."""
    what = "transformer_engine.pytorch"
    try:
        from transformer_engine.pytorch import DotProductAttention
    except Exception as exc:  # ImportError, or OSError/RuntimeError of a build for another CUDA / torch
        return _failed(what, exc)
    return Probe(what, value=DotProductAttention)


def import_mamba_kernels() -> Probe:
    """Import ``(causal_conv1d_fn, mamba_chunk_scan_combined)``; both must import."""
    try:
        from causal_conv1d import causal_conv1d_fn
    except Exception as exc:
        return _failed("causal_conv1d", exc)
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as exc:
        return _failed("mamba_ssm.ops.triton.ssd_combined", exc)
    return Probe("mamba_ssm + causal_conv1d", value=(causal_conv1d_fn, mamba_chunk_scan_combined))


def attention_kernel_applies(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether ``auto`` attention would run TE on inputs of this device and dtype."""
    return torch.device(device).type == "cuda" and dtype in ATTENTION_KERNEL_DTYPES


def mamba_kernel_applies(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether ``auto`` Mamba would run the mamba_ssm / causal_conv1d kernels on these inputs."""
    return torch.device(device).type == "cuda" and dtype in MAMBA_KERNEL_DTYPES


def reference_warning(
    module: str,
    fast_path: str,
    device: torch.device | str,
    dtype: torch.dtype,
    kernel_dtypes: tuple[torch.dtype, ...],
    unavailable: str | None,
) -> tuple[str, str] | None:
    """The warning ``module(backend="auto")`` logs once when it runs the torch reference on
    inputs of ``device`` / ``dtype``: ``(warn_once key, message)``, or None for non-CUDA inputs.

    Args:
        module: ``"ThdAttention"`` or ``"Mamba2Mixer"``.
        fast_path: What would have run, e.g. ``"Transformer Engine"``.
        kernel_dtypes: The dtypes the fast path takes.
        unavailable: Why the fast path is unavailable (the import error), when it is.
    """
    if torch.device(device).type != "cuda":
        return None  # the reference is the expected path off CUDA
    if dtype in kernel_dtypes:
        return (
            f"{module}:unavailable",
            f"{module}(backend='auto') runs the torch reference on CUDA {dtype} inputs because {fast_path} is "
            f"unavailable: {unavailable}. The reference is far slower (and attention's keeps O(seqlen^2) scores). "
            "`seqpack doctor` shows what imports (docs/gpu.md); pass backend='torch' to choose the reference.",
        )
    names = "/".join(str(d).removeprefix("torch.") for d in kernel_dtypes)
    return (
        f"{module}:dtype",
        f"{module}(backend='auto') runs the torch reference on CUDA {dtype} inputs: {fast_path} takes {names} only. "
        "Cast the inputs for the fast path, or pass backend='torch' to choose the reference.",
    )


def _torch_build() -> str:
    return f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})"


def te_unavailable_message(probe: Probe) -> str:
    """Why ``backend="te"`` cannot run, with what to install."""
    return (
        f"backend='te' needs Transformer Engine, but `import {probe.what}` failed: {probe.error}. "
        "TE's import needs the `transformer-engine` meta package (pip install 'transformer-engine[pytorch]'), "
        "its core wheel for your CUDA major version (transformer-engine-cu12 / -cu13, matching torch's), and the "
        f"torch extension transformer_engine_torch built for this {_torch_build()}. `seqpack doctor` shows what "
        "imports; docs/gpu.md explains the install. Use backend='torch' for the reference, or 'auto' to fall "
        "back to it with a warning."
    )


def mamba_unavailable_message(probe: Probe) -> str:
    """Why ``backend="mamba_ssm"`` cannot run, with what to install."""
    return (
        f"backend='mamba_ssm' needs mamba_ssm and causal_conv1d, but `import {probe.what}` failed: {probe.error}. "
        f"Install mamba-ssm and causal-conv1d built for this {_torch_build()} (pip install --no-build-isolation "
        "'seqpack[mamba]'). `seqpack doctor` shows what imports; docs/gpu.md explains the install. Use "
        "backend='torch' for the reference, or 'auto' to fall back to it with a warning."
    )


# --- the environment report ------------------------------------------------------------------

# (report key, distributions that provide it, module imported to check it)
_PACKAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("transformer_engine", ("transformer-engine", "transformer-engine-cu13", "transformer-engine-cu12"),
     "transformer_engine.pytorch"),
    ("transformer_engine_torch", ("transformer-engine-torch",), "transformer_engine_torch"),
    ("mamba_ssm", ("mamba-ssm",), "mamba_ssm.ops.triton.ssd_combined"),
    ("causal_conv1d", ("causal-conv1d",), "causal_conv1d"),
)  # fmt: skip


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _try_import(module: str) -> tuple[Any, str | None]:
    try:
        return importlib.import_module(module), None
    except Exception as exc:
        return None, _failed(module, exc).error


_NUMBA_LAYERS = (("tbb", "tbbpool"), ("omp", "omppool"), ("workqueue", "workqueue"))


def _attrs(key: str) -> tuple[str, ...]:
    return ("thd_get_partitioned_indices",) if key == "transformer_engine_torch" else ()


def _probe_all() -> dict[str, dict[str, Any]]:
    """Every optional package, numba and each of numba's threading layers (native libraries
    that may abort the process that loads them), each imported in a child process."""
    wanted = [(module, _attrs(key)) for key, _, module in _PACKAGES]
    wanted += [("numba", ())] + [(f"numba.np.ufunc.{module}", ()) for _, module in _NUMBA_LAYERS]
    return probe_imports(wanted)


def _package_info(
    key: str, distributions: tuple[str, ...], module: str, probe: dict[str, Any] | None
) -> dict[str, Any]:
    """One package's entry; ``probe``: its import in a child (:func:`_probe_all`), or None to
    import it here."""
    found = {name: v for name in distributions if (v := _distribution_version(name)) is not None}
    attrs = _attrs(key)
    if probe is not None:
        imports, error, module_version, has = probe["imports"], probe["error"], probe["version"], probe["attrs"]
    else:
        imported, error = _try_import(module)
        imports = imported is not None
        top = importlib.import_module(module.split(".")[0]) if imports else None
        module_version = getattr(top, "__version__", None)
        has = {a: hasattr(imported, a) for a in attrs}
    version = next(iter(found.values()), None)
    if version is None and imports:  # e.g. a source tree on PYTHONPATH, no dist-info
        version = module_version
    info: dict[str, Any] = {
        "version": version,
        "distributions": found,
        "module": module,
        "imports": imports,
        "error": error,
    }
    if attrs and imports:
        info.update(has)
    return info


def _torch_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": False,
        "cudnn": None,
        "devices": [],
    }
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                info["devices"].append(
                    {
                        "index": index,
                        "name": props.name,
                        "capability": f"{props.major}.{props.minor}",
                        "memory_gib": round(props.total_memory / 2**30, 1),
                    }
                )
    except Exception as exc:  # a broken driver: report it, do not fail the report
        info["error"] = _failed("torch.cuda", exc).error
    if info["cuda_available"]:
        # Its own try: another cuDNN loaded first (e.g. by Transformer Engine) makes torch's
        # version check raise, and the devices must still be listed.
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception as exc:
            info["cudnn_error"] = _failed("torch.backends.cudnn", exc).error
    return info


def _auto_choice(cuda: bool, packages: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    if not cuda:
        why = "no CUDA device: the torch reference is the expected path on CPU"
        return {
            "attention": {"backend": AttentionBackend.TORCH.value, "reason": why},
            "mamba": {"backend": MambaBackend.TORCH.value, "reason": why},
        }
    te = packages["transformer_engine"]
    attention = (
        {"backend": AttentionBackend.TE.value, "reason": "transformer_engine.pytorch imports"}
        if te["imports"]
        else {"backend": AttentionBackend.TORCH.value, "reason": f"transformer_engine does not import: {te['error']}"}
    )
    missing = [(name, packages[name]["error"]) for name in ("causal_conv1d", "mamba_ssm")]
    missing = [(name, error) for name, error in missing if error is not None]
    mamba = (
        {"backend": MambaBackend.MAMBA_SSM.value, "reason": "mamba_ssm and causal_conv1d import"}
        if not missing
        else {
            "backend": MambaBackend.TORCH.value,
            "reason": "; ".join(f"{name} does not import: {error}" for name, error in missing),
        }
    )
    return {"attention": attention, "mamba": mamba}


def _numba_info(probes: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """numba's entry; ``probes``: the imports made in children (:func:`_probe_all`), or None
    to import numba and its threading layers here."""
    if probes is not None:  # a broken numba (or its threading layer) may abort the process that imports it
        if not probes["numba"]["imports"]:
            return {"version": None, "error": probes["numba"]["error"]}
    try:
        import numba
    except Exception as exc:
        return {"version": None, "error": _failed("numba", exc).error}
    try:
        active = numba.threading_layer()
    except ValueError:  # "Threading layer is not initialized": no parallel kernel ran yet
        active = None
    available, failed = [], {}
    for layer, module in _NUMBA_LAYERS:
        if probes is not None:  # imported in a child: one that aborts is reported, not fatal
            probe = probes[f"numba.np.ufunc.{module}"]
            if probe["imports"]:
                available.append(layer)
            elif not str(probe["error"]).startswith(("ImportError", "ModuleNotFoundError")):
                failed[layer] = probe["error"]  # a missing library is the common case; a crash is news
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if _try_import(f"numba.np.ufunc.{module}")[1] is None:
                available.append(layer)
    return {
        "version": numba.__version__,
        "threading_layer": active,
        "configured_threading_layer": str(getattr(numba.config, "THREADING_LAYER", "default")),
        "available_threading_layers": available,
        "threading_layer_errors": failed,
    }


def _notes(torch_info: dict[str, Any], packages: dict[str, dict[str, Any]]) -> list[str]:
    notes = []
    te, tex = packages["transformer_engine"], packages["transformer_engine_torch"]
    torch_major = (torch_info["cuda"] or "").split(".")[0]
    prefix = "transformer-engine-cu"
    for name in te["distributions"]:
        if name.startswith(prefix) and torch_major and name[len(prefix) :] != torch_major:
            notes.append(
                f"{name} is installed but torch is built for CUDA {torch_info['cuda']}: TE's CUDA major version "
                "must match torch's"
            )
    if te["distributions"] and "transformer-engine" not in te["distributions"] and not te["imports"]:
        notes.append("the `transformer-engine` meta package is missing: TE's import checks for it")
    if te["distributions"] and not tex["imports"]:
        notes.append(
            "transformer_engine_torch does not import: build it for this torch from its sdist "
            "(pip install --no-build-isolation transformer_engine_torch==<TE version>)"
        )
    if torch_info["cuda_available"] and not torch_info["cuda"]:
        notes.append("torch is a CPU build on a machine with a GPU")
    if te["error"] and "undefined symbol" in te["error"] and "libcudnn" in te["error"]:
        notes.append(
            "transformer_engine loads another cuDNN than the one torch already initialised: import "
            "transformer_engine before torch uses cuDNN (docs/gpu.md, 'cuDNN')"
        )
    if torch_info.get("cudnn_error"):
        notes.append(
            "torch's cuDNN check fails (another cuDNN was loaded first, e.g. by Transformer Engine): attention "
            "through TE works, torch's own cuDNN kernels do not (docs/gpu.md, 'cuDNN')"
        )
    return notes


def environment_report(*, isolate: bool = True) -> dict[str, Any]:
    """What decides which compute path seqpack runs here; a JSON-serialisable dict.

    Keys: ``python``, ``platform``, ``seqpack``, ``torch``, ``packages`` (the optional fast
    paths: version, whether each imports, the error if not), ``auto`` (what ``"auto"`` picks on
    bf16 CUDA inputs, and why), ``numba`` and ``notes`` (likely install problems).

    With ``isolate`` (the default, what ``seqpack doctor`` does) every optional or native
    package is imported in a child process first (:func:`probe_import`), so one that aborts on
    import is reported instead of ending the report; ``isolate=False`` imports them here.
    """
    from seqpack._version import __version__

    packages: dict[str, dict[str, Any]] = {}
    # Probed before torch initialises its cuDNN: TE built against another cuDNN fails to import after it.
    probes = _probe_all() if isolate else None
    for key, distributions, module in _PACKAGES:
        packages[key] = _package_info(key, distributions, module, probes[module] if probes else None)
    torch_info = _torch_info()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "seqpack": __version__,
        "torch": torch_info,
        "packages": packages,
        "auto": _auto_choice(torch_info["cuda_available"], packages),
        "numba": _numba_info(probes),
        "notes": _notes(torch_info, packages),
    }


def format_environment_report(report: dict[str, Any]) -> str:
    """The report of :func:`environment_report` as plain text (no trailing newline)."""
    t = report["torch"]
    lines = [
        f"seqpack {report['seqpack']}, Python {report['python']}, {report['platform']}",
        f"torch {t['version']}, CUDA {t['cuda'] or 'none (CPU build)'}"
        + (f", cuDNN {t['cudnn']}" if t.get("cudnn") else "")
        + ("" if t["cuda_available"] else ", no CUDA device available"),
    ]
    lines += [
        f"  GPU {d['index']}: {d['name']}, capability {d['capability']}, {d['memory_gib']} GiB" for d in t["devices"]
    ]
    if t.get("error"):
        lines.append(f"  CUDA error: {t['error']}")
    if t.get("cudnn_error"):
        lines.append(f"  cuDNN error: {t['cudnn_error']}")
    lines.append("optional packages:")
    for key, info in report["packages"].items():
        dists = ", ".join(f"{name} {version}" for name, version in info["distributions"].items())
        version = info["version"] or "not installed"
        if info["imports"]:
            status = "imports"
        elif info["version"] is None and info["error"].startswith("ModuleNotFoundError"):
            status = ""  # simply absent
        else:
            status = f"does not import ({info['error']})"
        extra = f"  [{dists}]" if len(info["distributions"]) > 1 else ""
        lines.append(f"  {key:<25}{version:<16}{status}{extra}".rstrip())
    lines.append('backend="auto" on bf16 CUDA inputs:')
    for stage, choice in report["auto"].items():
        lines.append(f"  {stage:<10}{choice['backend']:<11}{choice['reason']}")
    n = report["numba"]
    if n.get("version") is None:
        lines.append(f"numba: {n.get('error')}")
    else:
        active = n["threading_layer"] or "not initialised (seqpack's numba kernels are serial)"
        available = ", ".join(n["available_threading_layers"]) or "none"
        lines.append(
            f"numba {n['version']}, threading layer {active}; configured {n['configured_threading_layer']!r}, "
            f"available: {available}"
        )
        lines += [f"  threading layer {layer}: {error}" for layer, error in n.get("threading_layer_errors", {}).items()]
    if report["notes"]:
        lines.append("notes:")
        lines += [f"  - {note}" for note in report["notes"]]
    return "\n".join(lines)
