"""benchmarks/encoder_plan.py runs at toy size (two DP sizes, two rounds each), so that it cannot
rot: one table row per DP size, the plan never worse than the home placement nor under the bound."""

import math
import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow


def test_toy_run_prints_one_row_per_dp_size_with_the_plan_within_home_and_bound(monkeypatch, capsys):
    with benchmark_module("encoder_plan") as module:
        monkeypatch.setattr(sys, "argv", ["encoder_plan.py", "--dp", "8,16", "--rounds", "2"])
        module.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| dp | home / bound | plan / bound |")
    rows = [line.strip("| ").split(" | ") for line in lines[2:]]
    assert [row[0] for row in rows] == ["8", "16"]
    for row in rows:
        home, plan = float(row[1]), float(row[2])
        assert math.isfinite(home) and 1.0 <= plan <= home, row
