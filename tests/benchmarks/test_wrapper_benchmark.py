"""benchmarks/wrapper.py runs at toy size (the dp4 layout, balanced and round_robin, 8 samples
per rank, one measured step), so that it cannot rot: a table row per scheduler with every phase
timed and the exchange's bytes on the wire."""

import math
import subprocess
import sys

import pytest
from benchmark_module import BENCHMARKS

pytestmark = [pytest.mark.slow, pytest.mark.processes]  # ~9 s of CPU: 4 spawned ranks import torch


def test_toy_run_times_every_phase_per_scheduler(tmp_path):
    args = ["--samples-per-rank", "8", "--steps", "1", "--layouts", "dp4", "--schedulers", "balanced"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "wrapper.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("# seqpack wrapper benchmark: 4 gloo ranks")
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header[:4] == ["layout", "scheduler", "samples/step", "mbs"] and header[-1] == "sent/payload"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| dp4 |")]
    assert [row[1] for row in rows] == ["balanced", "round_robin"]
    for row in rows:
        assert row[2] == "32"  # 4 ranks x 8 samples
        values = [float(v) for v in row[3:]]
        assert all(math.isfinite(v) and v >= 0 for v in values), row
        assert values[-1] > 0  # the exchange sent bytes
