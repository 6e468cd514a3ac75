"""benchmarks/heaps.py runs at toy size (2,048 sequences into 16 replicas), so that it cannot
rot: the heapq twin of grid_lpt's heap places every item as the kernel does, for every bin rule."""

import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow  # ~2 s: numba compiles the heapq twin


def test_toy_run_places_identically_for_every_rule(monkeypatch, capsys):
    with benchmark_module("heaps") as module:
        monkeypatch.setattr(sys, "argv", ["heaps.py", "--sequences", "2048", "--replicas", "16"])
        assert module.main() == 0
        rules = list(module.RULES.values())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# 2,048 sequences into 16 replicas x ")
    assert lines[1].split()[0] == "rule" and lines[1].endswith("same placement")
    assert [line.split()[0] for line in lines[2:]] == rules
    assert all(line.split()[-1] == "True" for line in lines[2:])
