"""benchmarks/compute.py's K/V traffic table (--traffic-only, benchmarks/kv_traffic.py's
measure) runs at toy size, so that it cannot rot: a row per mask and layout, the bytes moved
never above an all-gather's. The timed rows are left out: their CP=2 rows start gloo processes
(~4 s of CPU at toy size, over this suite's budget)."""

import re
import sys

import pytest
from benchmark_module import BENCHMARKS, benchmark_module

pytestmark = pytest.mark.slow


def test_traffic_table_has_a_row_per_mask_and_layout(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports benchmarks/kv_traffic.py
    with benchmark_module("compute") as module:
        argv = ["compute.py", "--traffic-only", "--traffic-tokens", "4096", "--cp", "2"]
        monkeypatch.setattr(sys, "argv", argv)
        module.main()
        masks = [name for name, _, _ in module.TRAFFIC_MASKS]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("K/V exchange under CP=2: one pack of 4,096 tokens")
    assert lines[1].split()[:3] == ["mask", "layout", "moved"]
    rows = [re.match(r"(.+?)\s+(dualchunk|contiguous)\s+([\d,.]+)\s+([\d,.]+)\s+", line) for line in lines[2:]]
    assert all(rows) and len(rows) == 2 * len(masks)
    assert [(m.group(1), m.group(2)) for m in rows] == [(n, lay) for n in masks for lay in ("dualchunk", "contiguous")]
    for m in rows:
        moved, gathered = (float(g.replace(",", "")) for g in m.group(3, 4))
        assert 0 < moved <= gathered, m.group(0)
