"""benchmarks/prefetch.py runs at toy size (2 gloo ranks, one measured step per configuration,
prefetch 0 and 1, the sleep stand-in), so that it cannot rot: a table row per prefetch depth,
each with a finite blocked time and step time."""

import re
import subprocess
import sys

import pytest
from benchmark_module import BENCHMARKS

pytestmark = [pytest.mark.slow, pytest.mark.processes]  # ~5 s of CPU: 2 spawned ranks import torch


def test_toy_run_has_a_row_per_prefetch_depth(tmp_path):
    args = ["--layout", "dp2", "--samples-per-rank", "8", "--rounds", "1", "--segment", "1"]
    args += ["--factors", "1", "--depths", "0", "1", "--standins", "sleep"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "prefetch.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("# seqpack prefetch benchmark: 2 gloo ranks (dp2)")
    assert re.search(r"^# W = synchronous wrapper time per step .*: [\d.]+ ms$", out, flags=re.MULTILINE)
    header = "| stand-in | C/W | C ms | alone ms | prefetch | blocked ms | blocked/W | step ms | step/alone |"
    assert header in out
    rows = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| sleep |")]
    assert [int(row[4]) for row in rows] == [0, 1]
    for row in rows:
        blocked, step = float(row[5]), float(row[7])
        assert 0 <= blocked and 0 < step, row
