"""benchmarks/packing.py runs end to end at toy sizes (--quick), so that it cannot rot."""

import importlib.util
import pathlib
import sys

import pytest

PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "packing.py"


@pytest.mark.slow
def test_quick_run_measures_every_packer(capsys):
    spec = importlib.util.spec_from_file_location("seqpack_benchmark_packing", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        rows = module.main(["--quick"])
    finally:
        sys.modules.pop(spec.name, None)
    out = capsys.readouterr().out
    assert "# machine:" in out and "# ratios" in out
    whats = {r["what"] for r in rows}
    assert {"seqpack pack_lengths", "seqpack pack_dataset (Dataset)"} <= whats
    assert any(w.startswith("balanced dp=1") for w in whats)
    assert {r["workload"] for r in rows} == {"lognormal", "pareto", "bimodal"}
    for r in rows:
        assert r["seconds"] > 0
        if r["what"].startswith(("seqpack", "balanced")):
            assert r["bound"] <= r["packs"] <= r["bound"] + 1, r
