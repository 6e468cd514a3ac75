"""benchmarks/packing.py runs end to end at toy sizes (--quick), so that it cannot rot."""

import pytest
from benchmark_module import benchmark_module


@pytest.mark.slow
def test_quick_run_measures_every_packer(capsys):
    with benchmark_module("packing") as module:
        rows = module.main(["--quick"])
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
