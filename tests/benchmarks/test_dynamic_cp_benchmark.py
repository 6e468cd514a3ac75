"""benchmarks/dynamic_cp.py runs at toy size (--quick at R = 8 and 16, plan time best of 1) on
a synthetic clock written here (the H100 clock it fits lives outside the repository), so that it
cannot rot again (its hybrid CP pricing raised AttributeError for a while and no test saw it):
a row per workload and R under every ring scale, every step time finite, and the targets."""

import json
import math
import re
import sys

import numpy as np
import pytest
from benchmark_module import BENCHMARKS, benchmark_module

pytestmark = pytest.mark.slow  # ~1.5 s

# workload, R, longest, cp, static s, (step), hybrid s, (as run), dyn s: the first columns of a row
ROW = re.compile(r"^(\w+)\s+(\d+)\s+\d+\s+\d+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)", re.MULTILINE)


def synthetic_clock(path):
    """``h2048x4`` microbatches in the H100 clock's format, timed by a quadratic cost."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(40):
        lengths = rng.integers(64, 8192, size=int(rng.integers(1, 6)))
        seconds = 2e-3 + 1e-7 * lengths.sum() + 1e-11 * (lengths.astype(float) ** 2).sum()
        rows.append({"lengths": lengths.tolist(), "seconds": float(seconds)})
    path.write_text(json.dumps({"h2048x4": {"microbatches": rows}}))


def test_toy_run_prices_every_plan_and_states_the_targets(monkeypatch, tmp_path, capsys):
    clock, out = tmp_path / "clock.json", tmp_path / "dynamic_cp.txt"
    synthetic_clock(clock)
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports benchmarks/dynamic_cp_bound.py
    with benchmark_module("dynamic_cp") as module:
        monkeypatch.setattr(module, "PLAN_REPEATS", 1)
        argv = ["dynamic_cp.py", "--quick", "--ranks", "8,16", "--clock-data", str(clock), "--out", str(out)]
        monkeypatch.setattr(sys, "argv", argv)
        module.main()  # exit status: its targets, which a toy clock need not meet
        scales, workloads = module.SCALES, module.WORKLOADS
    text = out.read_text()
    assert text.strip() in capsys.readouterr().out
    sections = text.split("\n## sync=")[1:]
    assert [s.split("\n", 1)[0] for s in sections] == [f"lockstep, CP ring term x{scale}" for scale in scales]
    for section in sections:
        rows = re.findall(
            r"^(\w+)\s+(\d+)\s+\d+\s+\d+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)", section, re.M
        )
        assert [(kind, int(r)) for kind, r, *_ in rows] == [(kind, r) for kind in workloads for r in (8, 16)]
        for *_, static, hybrid, dynamic in rows:
            assert all(math.isfinite(float(t)) and float(t) > 0 for t in (static, hybrid, dynamic))
    plan_line = r"^plan time, tail256k at 1,024 ranks .*, CPU, best of 1: lockstep \d+ ms, replica \d+ ms$"
    assert re.search(plan_line, text, re.M)
    verdicts = re.findall(r"^(PASS|FAIL): (.+?) \(", text, flags=re.MULTILINE)
    assert len(verdicts) == 3
