"""benchmarks/compile_ab.py at toy cost: its child's plan sets run here on the suite's warm
numba cache (a cold compile in a fresh process, what the script times, costs ~7 s of CPU per
set and is left out), and its report is printed over those timings, so that it cannot rot: every
plan of every set still runs on this tree (the child leaves out, as "skipped", a plan that
raises: none may here), and the report has its rounds and table."""

import json
import re
import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def compile_ab():
    with benchmark_module("compile_ab") as module:
        yield module


@pytest.mark.parametrize("which", ["first", "full", "doctor"])
def test_every_plan_of_the_set_runs_on_this_tree(compile_ab, which, capsys):
    compile_ab.child(which)
    timings = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert timings["skipped"] == []
    assert timings["parts"] and all(t >= 0 for t in timings["parts"].values())
    if which == "first":
        assert list(timings["parts"]) == ["balanced", "dp_balanced", "empty"]


def test_report_has_a_round_per_repeat_and_the_table(compile_ab, monkeypatch, capsys):
    compile_ab.child("first")
    timings = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    monkeypatch.setattr(compile_ab, "run_tree", lambda tree, which: (timings, timings))  # no cold processes
    monkeypatch.setattr(sys, "argv", ["compile_ab.py", "--repeat", "2", "--tree", "before=."])
    assert compile_ab.main() == 0
    out = capsys.readouterr().out
    assert out.startswith("# cold compile, set 'first'")
    rounds = re.findall(r"^round (\d) (\w+)\s+cold cpu\s+[\d.]+ s wall\s+[\d.]+ s \(balanced ", out, re.MULTILINE)
    assert rounds == [("1", "before"), ("1", "now"), ("2", "before"), ("2", "now")]  # trees interleaved
    table = out.split("\ntree ")[-1].splitlines()
    assert table[0].split() == ["best", "cold", "CPU", "s", "median", "best", "warm", "CPU", "s"]
    assert [row.split()[0] for row in table[1:3]] == ["before", "now"]
    assert table[3] == "now / before: 1.00x (best cold CPU)"
