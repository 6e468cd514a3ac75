"""Old import paths keep working: each shim warns DeprecationWarning once and serves the
objects of the new home."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# old module -> (new module, a name both must serve as the same object)
MOVED = {
    "seqpack.config": ("seqpack.loader.config", "PackingConfig"),
    "seqpack.phases": ("seqpack.loader.phases", "gather"),
    "seqpack.step": ("seqpack.loader.step", "Step"),
    "seqpack.prefetch": ("seqpack.loader.prefetch", "Prefetcher"),
    "seqpack.resume": ("seqpack.loader.resume", "ResumeState"),
    "seqpack.online": ("seqpack.loader.calibration", "StepCalibration"),
    "seqpack.wrapper": ("seqpack.loader.iterator", "wrap_data_iterator"),
    "seqpack.dist": ("seqpack.collective", "gather_lengths"),
    "seqpack.dist.groups": ("seqpack.collective.groups", "new_axis_groups"),
    "seqpack.dist.agree": ("seqpack.collective.agree", "agree"),
    "seqpack.dist.lengths": ("seqpack.collective.lengths", "gather_lengths"),
    "seqpack.dist.exchange": ("seqpack.collective.exchange", "plan_exchange"),
    "seqpack.dist.wire": ("seqpack.collective.wire", "encode_step"),
    "seqpack.dist.broadcast": ("seqpack.collective.broadcast", "broadcast_tp"),
    "seqpack.comm": ("seqpack.collective", "exchange_samples"),
    "seqpack.cp": ("seqpack.thd.cp", "shard_for_cp"),
    "seqpack.progress": ("seqpack.cli.progress", "Progress"),
    "seqpack.demo": ("seqpack.cli.demo.settings", "DemoSettings"),
    "seqpack.schedulers.locality": ("seqpack.schedulers.balanced.locality", "plan_local"),
    "seqpack.schedulers._exact": ("seqpack.schedulers.balanced.exact", "pack_bins"),
}

_PROBE = r"""
import importlib, json, sys, warnings
moved = json.loads(sys.argv[1])
report = {}
for old in sorted(moved):  # parents before their modules
    new, name = moved[old]
    with warnings.catch_warnings(record=True) as first:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        importlib.import_module(old)
    report[old] = {
        "warnings": [str(w.message) for w in first if issubclass(w.category, DeprecationWarning)],
        "again": len([w for w in again if issubclass(w.category, DeprecationWarning)]),
        "same": getattr(module, name) is getattr(importlib.import_module(new), name),
    }
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(MOVED)], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_import_path_warns_once_and_serves_the_new_objects(report, old):
    new, _ = MOVED[old]
    result = report[old]
    own = [message for message in result["warnings"] if message.startswith(f"{old} is an old import path")]
    assert len(own) == 1, result["warnings"]
    assert new.rsplit(".", 1)[0] in own[0]  # names where to import from instead
    assert result["again"] == 0 and result["same"]


def test_the_library_itself_imports_no_old_path():
    code = "import warnings; warnings.simplefilter('error', DeprecationWarning); import seqpack, seqpack.cli.app"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
