"""benchmarks/plans_ab.py runs at toy size (this tree against itself, one repeat, small shapes of
every kind; its workers on the environment's numba cache, warm in the suite), so that it cannot
rot: a line per shape with the same plan on both sides, the kernels' times, and the --ratio mode."""

import re
import subprocess
import sys

import pytest
from benchmark_module import BENCHMARKS

pytestmark = [pytest.mark.slow, pytest.mark.processes]  # ~2 s: 3 worker processes

SHAPES = ["scale:4096:64", "ht:0:replica", "sched:sft-lognormal:0"]


def run(tmp_path, *args):
    command = [sys.executable, str(BENCHMARKS / "plans_ab.py"), "--repeat", "1", "--cache", "", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_this_tree_against_itself_plans_the_same(tmp_path):
    root = BENCHMARKS.parent
    out = run(tmp_path, "--before", str(root), *SHAPES)
    label = re.escape(root.name)
    for name in SHAPES:
        line = rf"^{re.escape(name)}\s+now\s+[\d.]+ ms\s+{label}\s+[\d.]+ ms \(now/{label} [\d.]+, same plan\)$"
        assert re.search(line, out, flags=re.MULTILINE), name
    assert len(re.findall(r"^    kernels, best ms .*grid_lpt [\d.]+/[\d.]+", out, flags=re.MULTILINE)) == len(SHAPES)


def test_ratio_mode_times_locality_on_against_off(tmp_path):
    out = run(tmp_path, "--ratio", "1024x8")
    assert re.search(r"^\s+1,024 into\s+8: on\s+[\d.]+ s\s+off\s+[\d.]+ s\s+best-of [\d.]+x", out, flags=re.MULTILINE)


def test_a_shape_a_worker_refuses_ends_the_run_naming_it(tmp_path):
    root = BENCHMARKS.parent
    command = [sys.executable, str(BENCHMARKS / "plans_ab.py"), "--repeat", "1", "--cache", "", "--before", str(root)]
    bad = "sched:sft-lognormal:0:sync=replica"  # sync is a request field, not a scheduler option
    done = subprocess.run([*command, bad], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert f"ended on shape {bad!r}" in done.stderr and "unknown option(s) ['sync']" in done.stderr
