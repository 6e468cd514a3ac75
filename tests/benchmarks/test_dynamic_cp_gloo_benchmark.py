"""benchmarks/dynamic_cp_gloo.py runs at toy size (2 gloo ranks, one measured step of 8
sequences, capacity 256), so that it cannot rot: both modes train from the same weights on the
same data (equal first losses), each with a finite step time, and the speedup line."""

import math
import re
import subprocess
import sys

import pytest
from benchmark_module import BENCHMARKS

pytestmark = [pytest.mark.slow, pytest.mark.processes]  # ~9 s of CPU: 2 spawned ranks import torch


def test_toy_run_trains_both_modes_on_the_same_data(tmp_path):
    out = tmp_path / "dynamic_cp_gloo.txt"
    args = ["--ranks", "2", "--steps", "1", "--capacity", "256", "--per-step", "8", "--repeats", "1"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "dynamic_cp_gloo.py"), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text.strip() in done.stdout
    assert text.startswith("dynamic vs static CP on gloo: 2 CPU ranks")
    rows = dict(re.findall(r"^(static CP|dynamic CP)\s+([\d.]+\s.*)$", text, flags=re.MULTILINE))
    assert set(rows) == {"static CP", "dynamic CP"}
    first_losses = {float(row.split()[-1]) for row in rows.values()}
    assert len(first_losses) == 1 and all(math.isfinite(x) for x in first_losses)  # same weights, same data
    assert all(float(row.split()[0]) > 0 for row in rows.values())  # mean step time
    speedup = re.search(r"^dynamic CP speedup \(static / dynamic mean step time\): ([\d.]+)x", text, re.MULTILINE)
    assert speedup is not None and float(speedup.group(1)) > 0
