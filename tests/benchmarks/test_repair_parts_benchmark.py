"""benchmarks/repair_parts.py runs end to end at toy sizes (--quick), so that it cannot rot: a
summary row per switched-off part of the replica repair, each with a finite gain."""

import re

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow  # ~3 s: 9 variants of the planner on the quick workloads


def test_quick_run_summarizes_every_part(tmp_path, capsys):
    out = tmp_path / "repair_parts.txt"
    with benchmark_module("repair_parts") as module:
        module.main(["--quick", "--out", str(out)])
        variants = [v.name for v in module.VARIANTS]
    text = out.read_text()
    assert text.strip() in capsys.readouterr().out  # printed as written
    assert text.startswith("# python benchmarks/repair_parts.py --quick")
    assert re.search(r"^stage\s+best gain\s+where\s+worst\s+home", text, flags=re.MULTILINE)
    parts = [v for v in variants if v != "full"]
    assert parts
    for name in parts:
        row = re.search(rf"^{re.escape(name)}\s+([+-]\d+\.\d+)%", text, flags=re.MULTILINE)
        assert row is not None, name
    assert re.search(r"^# \d+ s in all$", text, flags=re.MULTILINE)
