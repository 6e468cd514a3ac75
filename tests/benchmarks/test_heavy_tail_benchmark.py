"""benchmarks/heavy_tail.py runs at toy size (one heavy-tail seed, two verl-like batches), so
that it cannot rot: item 11's rows for every forced microbatch count, within its goal, and item
12's summary."""

import re
import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow


def test_toy_run_reports_both_items_within_their_goals(monkeypatch, capsys):
    with benchmark_module("heavy_tail") as module:
        monkeypatch.setattr(sys, "argv", ["heavy_tail.py", "--seeds", "1", "--verl", "2", "--repeats", "1"])
        assert module.main() == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\s+0\s+(\d)\s+\d+%\s+([\d.]+) \(.*?\)\s+([\d.]+) \(", out, flags=re.MULTILINE)
    assert [int(m) for m, _, _ in rows] == [3, 4, 5, 6]  # seed 0 at every forced count
    assert all(float(after) <= float(before) for _, before, after in rows)
    worst = re.search(r"after ([\d.]+) of the capacity-aware bound \(goal <= 1.02\)", out)
    assert worst is not None and 1.0 <= float(worst.group(1)) <= 1.02
    assert "# item 12: 2 verl-like batches" in out
    assert "after (item search + bin completion): more microbatches than the fewest in 0" in out
