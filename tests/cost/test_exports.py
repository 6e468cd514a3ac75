"""What seqpack.cost and seqpack.calibrate export, and that they import no higher layer."""

import ast
import pathlib

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
        higher = ("seqpack.schedulers", "seqpack.loader")
        higher += ("seqpack.calibrate",) if package == "cost" else ()
        bad = {name for name in imported if name.startswith(higher)}
        assert not bad, f"{path.name} imports {sorted(bad)}"
        # A module never imports its own package's face.
        assert f"seqpack.{package}" not in imported or path.name == "__init__.py", path.name
