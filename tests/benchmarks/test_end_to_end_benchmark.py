"""benchmarks/end_to_end.py runs at toy size (2 gloo ranks, one measured step of 4 samples per
rank, the FLOPs cost so that nothing is timed first), so that it cannot rot: a row per mode,
the three modes ending at the same loss (same weights, same data), and a verdict per target."""

import math
import re
import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = [pytest.mark.slow, pytest.mark.processes]  # ~6 s of CPU: the demo's 2 spawned ranks


def test_toy_run_reports_every_mode_and_the_targets(monkeypatch, capsys):
    args = ["--steps", "1", "--repeats", "1", "--data", "mock", "--samples-per-rank", "4"]
    args += ["--max-tokens-per-rank", "512", "--max-seq-len", "256", "--mean-seq-len", "64", "--cost", "flops"]
    with benchmark_module("end_to_end") as module:
        monkeypatch.setattr(sys, "argv", ["end_to_end.py", *args])
        module.main()
        targets = list(module.TARGETS)
    out = capsys.readouterr().out
    assert "WARNING" not in out  # the modes end at the same loss
    rows = re.findall(r"^mock\s+0\s+(\w+)\s+([\d,]+)\s+[\d.]+x\s+[\d.]+x\s+[\d.]+%.*\s([\d.]+)$", out, re.MULTILINE)
    assert [mode for mode, _, _ in rows] == ["balanced", "dp_balanced", "padded"]
    for _, tokens_per_s, loss in rows:
        assert int(tokens_per_s.replace(",", "")) > 0 and math.isfinite(float(loss))
    verdicts = re.findall(r"^  (?:PASS|FAIL)  mock: balanced [\d,]+ tok/s = [\d.]+x (\w+) ", out, flags=re.MULTILINE)
    assert verdicts == targets
