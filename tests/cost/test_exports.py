"""What seqpack.cost and seqpack.calibrate export (their layering: tests/test_package_layout.py)."""

import importlib
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
]


@pytest.mark.parametrize("name", COST_NAMES)
def test_every_cost_name_of_the_old_module_is_exported(name):
    assert name in seqpack.cost.__all__ and getattr(seqpack.cost, name) is not None


@pytest.mark.parametrize("name", CALIBRATE_NAMES)
def test_every_calibrate_name_of_the_old_module_is_exported(name):
    assert name in seqpack.calibrate.__all__ and getattr(seqpack.calibrate, name) is not None


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (seqpack.calibrate, "step_time"),
        (seqpack.cost, "causal_window_pairs"),
        (seqpack.cost, "robust_nnls_fit"),
        (seqpack.cost.CostModel, "predict"),
        # one cost type and one calibrator: the CP ring is CostModel's, CostCalibrator fits it
        (seqpack.cost, "GroupCost"),
        (seqpack.cost, "as_group_cost"),
        (seqpack.calibrate, "GroupCostCalibrator"),
        (seqpack.calibrate, "Calibrator"),
    ],
)
def test_removed_names_are_gone(owner, name):
    with pytest.raises(AttributeError):
        getattr(owner, name)


@pytest.mark.parametrize("module", ["seqpack.cost.group", "seqpack.calibrate.base"])
def test_removed_modules_are_gone(module):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)
