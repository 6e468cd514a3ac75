"""benchmarks/scale.py runs at toy size (--quick on sweeps shrunk to two points each, one
locality shape), so that it cannot rot: a row per point of each table, the figure drawn, and the
targets. The peak memory of a plan comes from a child process per point: the run takes it as 0
and the child's measure is run here once, in this process."""

import re
import sys

import pytest
from benchmark_module import benchmark_module

pytestmark = pytest.mark.slow  # ~3 s


def test_toy_run_fills_every_table_and_draws_the_figure(monkeypatch, tmp_path, capsys):
    figure = tmp_path / "scale.png"
    with benchmark_module("scale") as module:
        monkeypatch.setattr(module, "N_SWEEP", [16_384, 32_768])
        monkeypatch.setattr(module, "DP_SWEEP", [64, 128])
        monkeypatch.setattr(module, "LOCALITY_SHAPES", [(8_192, 64)])
        monkeypatch.setattr(module, "peak_in_child", lambda name, n, dp: 0)
        monkeypatch.setattr(sys, "argv", ["scale.py", "--quick", "--repeat", "1", "--plot", str(figure)])
        assert module.main() == 0
        out = capsys.readouterr().out
        module.child("balanced", 1_024, 16)
        assert int(capsys.readouterr().out) >= 0  # peak resident bytes of one plan
    tables = {t.split("\n", 1)[0]: t for t in out.split("\n## ")[1:]}
    assert set(tables) == {
        "plan vs N (dp = 16,384)",
        "plan vs dp (64 sequences per replica)",
        "locality on vs off",
        "moved tokens vs dp (64 sequences per replica)",
    }
    for title, points in (("plan vs N (dp = 16,384)", ["16,384", "32,768"]), ("plan vs dp (64", ["64", "128"])):
        table = next(t for name, t in tables.items() if name.startswith(title))
        rows = re.findall(r"^\s+([\d,]+)\s+(\d+)\s+[\d.]+\s+([\d.]+)\s", table, flags=re.MULTILINE)
        assert [x for x, _, _ in rows] == points and all(int(m) >= 1 for _, m, _ in rows)
    assert re.search(r"^\s+8,192\s+64\s+[\d.]+\s+[\d.]+\s+[\d.]+", tables["locality on vs off"], flags=re.MULTILINE)
    moved = re.findall(r"^\s+(64|128)\s+[\d.]+ \(1\.\d+, [+-][\d.]+%\)", out, flags=re.MULTILINE)
    assert moved == ["64", "128"]
    assert figure.read_bytes().startswith(b"\x89PNG")
    assert re.findall(r"^  (?:PASS|FAIL)  (.+?):", out.split("targets\n")[-1], flags=re.MULTILINE) == [
        "8,192 into 64",
        "dp=64 lockstep",
        "dp=64 replica",
    ]
