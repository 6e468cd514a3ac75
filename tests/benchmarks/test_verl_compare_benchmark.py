"""benchmarks/verl_compare.py runs at toy size (one seed, dp 4) where verl is installed (its own
venv; not this one, where the test skips), so that it cannot rot: a table row per batch kind
and plan."""

import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow


def test_toy_run_has_a_row_per_batch_and_plan(monkeypatch, capsys):
    pytest.importorskip("verl")
    with benchmark_module("verl_compare") as module:
        monkeypatch.setattr(sys, "argv", ["verl_compare.py", "--seeds", "1", "--dp", "4"])
        module.main()
        batches = list(module.CONFIGS)
    rows = [line.strip("| ").split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[0][:3] == ["batch", "dp", "plan"]
    assert [(r[0], r[1], r[2]) for r in rows[2:]] == [
        (b, "4", p) for b in batches for p in ("verl", "drop-in", "seqpack")
    ]
