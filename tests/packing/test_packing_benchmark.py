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


@pytest.mark.slow
def test_the_pack_dataset_benchmark_measures_time_and_memory_of_both(capsys):
    with benchmark_module("pack_dataset") as module:
        rows = module.main(["--quick"])
    out = capsys.readouterr().out
    assert "# machine:" in out and "# data: 2,000 rows" in out
    assert {(r["what"], r["labels"]) for r in rows} >= {("seqpack pack_dataset", False), ("seqpack pack_dataset", True)}
    for r in rows:
        assert r["seconds"] > 0 and r["cpu"] > 0 and r["extra_mib"] >= 0 and r["packs"] > 0
