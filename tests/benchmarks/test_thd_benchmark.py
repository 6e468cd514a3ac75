"""benchmarks/thd.py runs at toy size (16 sequences, 2K tokens, one repeat), so that it cannot
rot: a row per operation for every CP size, each with finite timings."""

import math
import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow


def test_toy_run_times_every_operation_at_every_cp_size(monkeypatch, capsys):
    with benchmark_module("thd") as module:
        argv = ["thd.py", "--tokens", "2048", "--sequences", "16", "--repeats", "1"]
        monkeypatch.setattr(sys, "argv", argv)
        module.main()
    lines = capsys.readouterr().out.splitlines()
    assert "# workload: 16 sequences" in lines[1]
    assert lines[2].split() == ["operation", "seqpack", "us/1K", "loop", "us/1K", "speedup"]
    names = [line[:34].strip() for line in lines[3:]]
    for pm in (1, 4, 8, 16):
        assert f"pack (pad_multiple={pm})" in names and f"token_layout (pad_multiple={pm})" in names
    assert {f"shard all {cp} CP ranks (6 fields)" for cp in (2, 4, 8)} <= set(names)
    for line in lines[3:]:
        fast, slow, speedup = line[34:].split()
        assert all(math.isfinite(float(v)) and float(v) > 0 for v in (fast, slow, speedup[:-1])), line
