"""Old import paths of the cost and calibration modules keep working: the names are the
same objects, and a moved path warns DeprecationWarning once."""

import ast
import importlib
import pathlib
import subprocess
import sys
import warnings

import pytest

import seqpack.calibrate
import seqpack.cost

ROOT = pathlib.Path(__file__).resolve().parents[2]

COST_NAMES = [
    "CostModel",
    "DEFAULT_MODEL",
    "MODEL_PRESETS",
    "ModelSpec",
    "default_cost_model",
    "length_features",
    "mamba2_flops",
    "model_preset",
    "nnls_fit",
    "robust_nnls_fit",
    "robust_weights_fit",
    "transformer_flops",
]
CALIBRATE_NAMES = [
    "ABSENT",
    "INVALID",
    "MISSING",
    "CostCalibrator",
    "Measurement",
    "TimingLedger",
    "decode_seconds",
    "encode_seconds",
    "microbatch_sums",
    "step_time",
]


@pytest.mark.parametrize("name", COST_NAMES)
def test_every_cost_name_of_the_old_module_is_exported(name):
    assert name in seqpack.cost.__all__ and getattr(seqpack.cost, name) is not None


@pytest.mark.parametrize("name", CALIBRATE_NAMES)
def test_every_calibrate_name_of_the_old_module_is_exported(name):
    assert name in seqpack.calibrate.__all__ and getattr(seqpack.calibrate, name) is not None


def _run(code: str) -> subprocess.CompletedProcess:
    # A fresh interpreter: the warning is once per process, and seqpack may be imported here.
    return subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-c", code], capture_output=True, text=True, check=True
    )


def test_seqpack_timing_is_a_shim_that_warns():
    done = _run("import seqpack.timing as t, seqpack.calibrate as c; assert t.MicrobatchTimer is c.MicrobatchTimer")
    assert "seqpack.timing is an old import path" in done.stderr and "seqpack.calibrate" in done.stderr


def test_check_cost_model_moved_to_cost_and_the_old_name_warns():
    from seqpack._compat import reset_warned

    validation = importlib.import_module("seqpack.validation")
    reset_warned()
    with pytest.warns(DeprecationWarning, match=r"seqpack\.validation\.check_cost_model is an old import path"):
        old = validation.check_cost_model
    assert old is seqpack.cost.check_cost_model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert seqpack.cost.check_cost_model("cost", None) is None
    with pytest.raises(TypeError, match=r"got ModelSpec \(ModelSpec.cost_model\(\) gives one\)"):
        seqpack.cost.check_cost_model("cost", seqpack.cost.model_preset("llama3-8b"))


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, function-level included (``from a import b`` gives ``a.b``
    and ``a``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


@pytest.mark.parametrize("package", ["cost", "calibrate"])
def test_cost_and_calibrate_import_no_old_path_and_no_higher_layer(package):
    files = sorted((ROOT / "seqpack" / package).glob("*.py"))
    assert len(files) >= 4  # not vacuous: the package's modules are there
    for path in files:
        imported = _imports(path)
        higher = ("seqpack.schedulers", "seqpack.loader", "seqpack.config", "seqpack.wrapper")
        higher += ("seqpack.calibrate",) if package == "cost" else ()
        old = ("seqpack.timing", "seqpack.validation.check_cost_model")
        bad = {name for name in imported if name in old or name.startswith(higher)}
        assert not bad, f"{path.name} imports {sorted(bad)}"
        # A module never imports its own package's face.
        assert f"seqpack.{package}" not in imported or path.name == "__init__.py", path.name
