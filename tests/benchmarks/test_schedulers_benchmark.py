"""benchmarks/schedulers.py runs at toy size (--quick on every workload shrunk to 256 sequences
into 16 replicas), so that it cannot rot: a row per workload and scheduler, each plan valid
(the script validates it), and a verdict per target."""

import dataclasses
import re
import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow  # ~2 s


def test_toy_run_reports_every_scheduler_on_every_workload(monkeypatch, capsys):
    with benchmark_module("schedulers") as module:
        toy = [dataclasses.replace(wl, sequences=256, dp=16) for wl in module.WORKLOADS]
        monkeypatch.setattr(module, "WORKLOADS", toy)
        monkeypatch.setattr(sys, "argv", ["schedulers.py", "--quick"])
        module.main()  # exit status: its targets, which the toy sizes do not all meet
        names = list(module.SCHEDULERS)
    out = capsys.readouterr().out
    assert re.search(r"^workload\s+scheduler\s+replica/LB\s+round imb\.", out, flags=re.MULTILINE)
    for wl in toy:
        for name in names:
            row = re.search(rf"^{re.escape(wl.name)}\s+{re.escape(name)}\s+([\d.]+) \(", out, flags=re.MULTILINE)
            assert row is not None, (wl.name, name)
            assert float(row.group(1)) >= 1.0  # busiest replica over a lower bound
        assert re.search(rf"^  (PASS|FAIL|----)  {re.escape(wl.name)}: ", out, flags=re.MULTILINE), wl.name
    assert re.search(r"^  (PASS|FAIL)  \S+ sequences into \S+ replicas: balanced .* Karmarkar-Karp", out, re.M)
